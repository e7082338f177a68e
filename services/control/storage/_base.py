"""The storage primitives every control-plane service is written against.

- **KV**: a value with a version; writes are compare-and-set on the version, several keys
  at once or none of them (`kv_cas`).
- **Log**: append-only, per name; `log_append` returns a sequence number (1, 2, ...),
  never reused, also after `log_truncate`.
- **Slot**: one owner at a time with a lease (an owner lock); the generation goes up on
  every change of owner, so it can fence a zombie.
- **Queue**: bounded and expiring, per name (the DLQ); overflow is decided inside the
  write, so several writers never overshoot `max_entries`, and nothing leaves the queue
  without being counted (dropped, rejected, expired) or acknowledged.

Backends: SQLite (default), PostgreSQL (several control replicas on one database),
memory (tests).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

Overflow = Literal["drop_oldest", "reject", "block"]
OVERFLOW_POLICIES: tuple[str, ...] = ("drop_oldest", "reject", "block")


class CasConflict(Exception):
    """The stored version is not the one the caller read."""

    def __init__(self, key: str, expected: int, actual: int):
        self.key, self.expected, self.actual = key, expected, actual
        super().__init__(f"{key}: expected version {expected}, stored version is {actual}")


class StorageUnavailable(Exception):
    """The backend cannot be reached right now (connection lost, database locked); retry."""


@dataclass(frozen=True)
class SlotLease:
    name: str
    owner: str
    generation: int      # goes up each time the slot changes owner
    expires_ms: int
    acquired: bool = False  # in an answer to slot_acquire: whether the caller holds it now


@dataclass(frozen=True)
class QueueEntry:
    seq: int
    value: bytes
    created_ms: int
    expires_ms: int  # 0 = never


@dataclass(frozen=True)
class QueuePush:
    appended: int
    dropped: int = 0     # oldest entries removed to make room (drop_oldest)
    rejected: int = 0    # entries refused because the queue was full (reject)
    blocked: bool = False  # block: only the first `appended` entries fit; retry the rest later
    expired: int = 0     # entries whose TTL ran out, removed before the push
    first_seq: int = 0   # sequence of the first appended entry (0 if none)


@dataclass(frozen=True)
class QueueStats:
    count: int
    last_seq: int
    dropped: int   # totals since the queue was created
    expired: int
    rejected: int


@dataclass(frozen=True)
class PushPlan:
    append: int
    drop: int
    rejected: int
    blocked: bool


def plan_push(count: int, max_entries: int, n: int, overflow: str) -> PushPlan:
    """What a push of `n` entries into a queue holding `count` (bound `max_entries`) does."""
    if overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"unknown overflow policy {overflow!r}; use one of "
                         + ", ".join(OVERFLOW_POLICIES))
    if max_entries <= 0:
        raise ValueError(f"max_entries must be at least 1, got {max_entries}")
    if overflow == "drop_oldest":
        return PushPlan(append=n, drop=max(0, count + n - max_entries), rejected=0, blocked=False)
    fits = min(n, max(0, max_entries - count))
    if overflow == "reject":
        return PushPlan(append=fits, drop=0, rejected=n - fits, blocked=False)
    return PushPlan(append=fits, drop=0, rejected=0, blocked=fits < n)


class Storage(ABC):
    """All four primitives; `clock` (seconds, like time.time) decides leases and expiry."""

    clock: Callable[[], float] = staticmethod(time.time)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # KV -----------------------------------------------------------------------------------
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

    # Log ----------------------------------------------------------------------------------
    @abstractmethod
    def log_append(self, name: str, value: bytes) -> int:
        """Append and return the entry's sequence (1, 2, ...; never reused)."""

    @abstractmethod
    def log_read(self, name: str, after: int = 0, limit: int = 1000) -> list[tuple[int, bytes]]:
        """Up to `limit` (sequence, value) entries with sequence > `after`, in order."""

    @abstractmethod
    def log_truncate(self, name: str, up_to: int) -> int:
        """Remove entries with sequence <= `up_to`; returns how many were removed."""

    # Slot ---------------------------------------------------------------------------------
    @abstractmethod
    def slot_acquire(self, name: str, owner: str, ttl_s: float) -> SlotLease:
        """Take the slot if it is free or its lease ran out, renew it if `owner` holds it.

        The answer says who holds it now (`acquired` tells whether that is the caller).
        """

    @abstractmethod
    def slot_release(self, name: str, owner: str) -> bool:
        """Free the slot if `owner` holds it; False otherwise."""

    @abstractmethod
    def slot_get(self, name: str) -> SlotLease | None:
        """The current holder, or None when the slot is free or its lease ran out."""

    # Queue --------------------------------------------------------------------------------
    @abstractmethod
    def queue_push(self, name: str, values: list[bytes], max_entries: int, overflow: str,
                   ttl_s: float = 0) -> QueuePush:
        """Append `values` in order under the overflow policy (see `plan_push`); ttl 0 = never
        expire. Expired entries are removed (and counted) first."""

    @abstractmethod
    def queue_list(self, name: str, after: int = 0, limit: int = 100) -> list[QueueEntry]:
        """Entries with sequence > `after`, oldest first, without removing them."""

    @abstractmethod
    def queue_ack(self, name: str, up_to: int) -> int:
        """Remove entries with sequence <= `up_to`; returns how many."""

    @abstractmethod
    def queue_purge(self, name: str) -> int:
        """Remove every entry; returns how many."""

    @abstractmethod
    def queue_expire(self, name: str) -> int:
        """Remove entries whose TTL ran out; returns how many (also added to the stats)."""

    @abstractmethod
    def queue_stats(self, name: str) -> QueueStats:
        """Count and totals; expired entries are removed first."""

    def close(self) -> None:  # noqa: B027 - optional
        pass
