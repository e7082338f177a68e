"""Cutting the event stream into sink batches.

With `respect_source_tx` (the default) a batch holds whole transactions: they
are added while the batch stays within `max_events` and `max_bytes`; a
transaction larger than the limits becomes a batch of its own, never split.
Without it, batches are cut purely by size. (`max_ms` is the Spark micro-batch
interval, job.py: a slice is cut here once it was read.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

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

