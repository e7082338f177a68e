"""Cutting the event stream into sink batches.

With `respect_source_tx` (the default) a batch holds whole transactions: they
are added while the batch stays within `max_events` and `max_bytes`; a
transaction larger than the limits becomes a batch of its own, never split.
Without it, batches are cut purely by size. (`max_ms` is the Spark micro-batch
interval, job.py: a slice is cut here once it was read.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tailrace.config import BatchSpec
from tailrace.proto.event_pb2 import ChangeEvent


def _transactions(events: Sequence[ChangeEvent], sizes: Sequence[int]
                  ) -> Iterator[tuple[list[ChangeEvent], int]]:
    """Consecutive events of the same source transaction (same tx_seq), with their bytes."""
    current: list[ChangeEvent] = []
    current_bytes = 0
    seq = None
    for event, size in zip(events, sizes, strict=True):
        tx_seq = event.position.tx_seq
        if current and tx_seq != seq:
            yield current, current_bytes
            current, current_bytes = [], 0
        seq = tx_seq
        current.append(event)
        current_bytes += size
    if current:
        yield current, current_bytes


def split_batches(events: Sequence[ChangeEvent], spec: BatchSpec,
                  sizes: Sequence[int] | None = None) -> Iterator[list[ChangeEvent]]:
    """Whole-transaction (or size-only) batches, in source order. `sizes`: each event's
    serialized size, when known (`runtime.decode_slice`)."""
    if sizes is None:
        sizes = [e.ByteSize() for e in events]
    units = _transactions(events, sizes) if spec.respect_source_tx \
        else (([e], size) for e, size in zip(events, sizes, strict=True))
    batch: list[ChangeEvent] = []
    batch_bytes = 0
    for unit, unit_bytes in units:
        if batch and (len(batch) + len(unit) > spec.max_events
                      or batch_bytes + unit_bytes > spec.max_bytes):
            yield batch
            batch, batch_bytes = [], 0
        batch.extend(unit)
        batch_bytes += unit_bytes
    if batch:
        yield batch

