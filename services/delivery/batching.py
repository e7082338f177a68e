"""Cutting the event stream into sink batches.

With `respect_source_tx` (the default) a batch holds whole transactions: they
are added while the batch stays within `max_events` and `max_bytes`; a
transaction larger than the limits becomes a batch of its own, never split.
Without it, batches are cut purely by size. `Batcher` adds the `max_ms`
timer: a partial batch is flushed once its first event has waited that long.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from tailrace.config import BatchSpec
from tailrace.proto.event_pb2 import ChangeEvent


def _size(event: ChangeEvent) -> int:
    return event.ByteSize()


def _transactions(events: Iterable[ChangeEvent]) -> Iterator[list[ChangeEvent]]:
    """Group consecutive events of the same source transaction (same tx_seq)."""
    current: list[ChangeEvent] = []
    for event in events:
        if current and event.position.tx_seq != current[-1].position.tx_seq:
            yield current
            current = []
        current.append(event)
    if current:
        yield current


def split_batches(events: Iterable[ChangeEvent], spec: BatchSpec) -> Iterator[list[ChangeEvent]]:
    """Whole-transaction (or size-only) batches, in source order."""
    units = _transactions(events) if spec.respect_source_tx else ([e] for e in events)
    batch: list[ChangeEvent] = []
    batch_bytes = 0
    for unit in units:
        unit_bytes = sum(_size(e) for e in unit)
        if batch and (len(batch) + len(unit) > spec.max_events
                      or batch_bytes + unit_bytes > spec.max_bytes):
            yield batch
            batch, batch_bytes = [], 0
        batch.extend(unit)
        batch_bytes += unit_bytes
    if batch:
        yield batch


class Batcher:
    """Incremental form of `split_batches` with the `max_ms` timer, for streaming callers."""

    def __init__(self, spec: BatchSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self._spec = spec
        self._clock = clock
        self._pending: list[ChangeEvent] = []   # complete transactions not yet cut
        self._open_tx: list[ChangeEvent] = []   # the transaction still arriving
        self._first_at: float | None = None

    def add(self, event: ChangeEvent) -> list[list[ChangeEvent]]:
        """Add one event; returns the batches that became full."""
        if self._first_at is None:
            self._first_at = self._clock()
        if not self._spec.respect_source_tx:
            self._pending.append(event)
        else:
            if self._open_tx and event.position.tx_seq != self._open_tx[-1].position.tx_seq:
                self._pending.extend(self._open_tx)  # previous tx had no tx_end marker
                self._open_tx = []
            self._open_tx.append(event)
            if event.tx_end:
                self._pending.extend(self._open_tx)
                self._open_tx = []
        return self._cut(final=False)

    def poll(self) -> list[list[ChangeEvent]]:
        """The timer: flush what is complete once the oldest event waited `max_ms`."""
        if self._first_at is None or (self._clock() - self._first_at) * 1000 < self._spec.max_ms:
            return []
        return self._cut(final=True)

    def _cut(self, final: bool) -> list[list[ChangeEvent]]:
        batches = list(split_batches(self._pending, self._spec))
        if not final and batches and not self._full(batches[-1]):
            self._pending = batches.pop()   # keep the partial batch for later
        else:
            self._pending = []
        if not self._pending and not self._open_tx:
            self._first_at = None
        elif final:
            self._first_at = self._clock() if (self._pending or self._open_tx) else None
        return batches

    def _full(self, batch: list[ChangeEvent]) -> bool:
        return (len(batch) >= self._spec.max_events
                or sum(_size(e) for e in batch) >= self._spec.max_bytes)
