"""Where the control service keeps its state; services are written against `Storage`, not a backend."""

from tailrace_services.control.storage._base import CasConflict, Storage
from tailrace_services.control.storage._memory import MemoryStorage
from tailrace_services.control.storage._sqlite import SqliteStorage


def open_storage(url: str) -> Storage:
    """`sqlite:///path/state.db` (default), `memory://`."""
    if url.startswith("memory:"):
        return MemoryStorage()
    if url.startswith("sqlite:///"):
        return SqliteStorage(url.removeprefix("sqlite:///"))
    if url.startswith("sqlite://"):
        return SqliteStorage(url.removeprefix("sqlite://"))
    raise ValueError(f"unknown storage url {url!r}; use sqlite:///path/to/state.db or memory://")


__all__ = ["CasConflict", "MemoryStorage", "SqliteStorage", "Storage", "open_storage"]
