"""Where the control service keeps its state; services are written against `Storage`, not a backend."""

from tailrace_services.control.storage._base import (
    OVERFLOW_POLICIES,
    CasConflict,
    QueueEntry,
    QueuePush,
    QueueStats,
    SlotLease,
    Storage,
    StorageUnavailable,
)
from tailrace_services.control.storage._memory import MemoryStorage
from tailrace_services.control.storage._sqlite import SqliteStorage


def open_storage(url: str) -> Storage:
    """`sqlite:///path/state.db` (default), `postgresql://user@host/db` (HA), `memory://`."""
    if url.startswith("memory:"):
        return MemoryStorage()
    if url.startswith("sqlite:///"):
        return SqliteStorage(url.removeprefix("sqlite:///"))
    if url.startswith("sqlite://"):
        return SqliteStorage(url.removeprefix("sqlite://"))
    if url.startswith(("postgresql://", "postgres://")):
        from tailrace_services.control.storage._postgres import PostgresStorage

        return PostgresStorage(url)
    scheme = url.split("://", 1)[0] if "://" in url else url[:20]
    raise ValueError(f"unknown storage url scheme {scheme!r}; use sqlite:///path/to/state.db, "
                     "postgresql://user@host/dbname or memory://")


__all__ = ["OVERFLOW_POLICIES", "CasConflict", "MemoryStorage", "QueueEntry", "QueuePush",
           "QueueStats", "SlotLease", "SqliteStorage", "Storage", "StorageUnavailable",
           "open_storage"]
