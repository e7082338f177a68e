"""Deterministic event ids: the same source change gets the same id, also after a replay."""

from __future__ import annotations

import hashlib

from tailrace.events._wire import cwire


def event_id(source_id: str, native_tx: str, event_index: int, ts_ms: int) -> str:
    """A UUIDv7 whose time is the source commit time and whose random bits come from the position.

    `native_tx` identifies the transaction at the source (PostgreSQL commit LSN,
    MySQL GTID), so a re-read of the same change yields the same id.
    """
    digest = hashlib.sha256(f"{source_id}|{native_tx}|{event_index}".encode()).digest()
    ts = ts_ms & ((1 << 48) - 1)
    rand_a = int.from_bytes(digest[:2], "big") & 0x0FFF
    rand_b = int.from_bytes(digest[2:10], "big") & ((1 << 62) - 1)
    value = (ts << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    h = f"{value:032x}"  # as str(uuid.UUID(int=value)) spells it, without the object
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def event_ids(source_id: str, native_tx: str, first: int, count: int, ts_ms: int) -> list[str]:
    """`event_id` of the events `first`.. `first + count - 1` of one transaction (a snapshot
    chunk's: thousands at once, in C when built)."""
    if cwire is not None:
        return cwire.event_ids(f"{source_id}|{native_tx}|".encode(), first, count, ts_ms)
    return [event_id(source_id, native_tx, index, ts_ms) for index in range(first, first + count)]


class EventIds:
    """The ids of one transaction's events (`event_id`), made in blocks with `event_ids`:
    events are stamped in index order, and a block costs a fraction of its ids one by one.
    `size`: the transaction's; no block goes past it."""

    BLOCK = 512

    def __init__(self, source_id: str, native_tx: str, ts_ms: int, size: int) -> None:
        self.source_id, self.native_tx, self.ts_ms, self.size = source_id, native_tx, ts_ms, size
        self._first = 0
        self._ids: list[str] = []

    def __call__(self, index: int) -> str:
        offset = index - self._first
        if not 0 <= offset < len(self._ids):
            self._first, offset = index, 0
            count = max(1, min(self.BLOCK, self.size - index))
            self._ids = event_ids(self.source_id, self.native_tx, index, count, self.ts_ms)
        return self._ids[offset]


def idempotency_key(tenant: str, database: str, table: str, tx_id: str, event_id: str) -> str:
    """`{tenant}|{db}.{table}|{tx_id}|{event_id}`, identical across replays."""
    return f"{tenant}|{database}.{table}|{tx_id}|{event_id}"
