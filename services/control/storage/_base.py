"""The storage primitives. A KV entry carries a version; writes are compare-and-set on it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator


class CasConflict(Exception):
    """The stored version is not the one the caller read."""

    def __init__(self, key: str, expected: int, actual: int):
        self.key, self.expected, self.actual = key, expected, actual
        super().__init__(f"{key}: expected version {expected}, stored version is {actual}")


class Storage(ABC):
    @abstractmethod
    def kv_get(self, key: str) -> tuple[bytes, int] | None:
        """(value, version) or None; version starts at 1."""

    @abstractmethod
    def kv_cas(self, items: list[tuple[str, bytes, int]]) -> list[int]:
        """Write every (key, value, expected_version) or none of them; returns the new versions.

        expected_version 0 means "must not exist". Raises `CasConflict`.
        """

    @abstractmethod
    def kv_put(self, key: str, value: bytes) -> int:
        """Unconditional write; returns the new version."""

    @abstractmethod
    def kv_scan(self, prefix: str) -> Iterator[tuple[str, bytes, int]]:
        """Entries whose key starts with `prefix`, in key order."""

    def close(self) -> None:  # noqa: B027 - optional
        pass
