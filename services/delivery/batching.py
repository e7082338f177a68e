"""Cutting the event stream into sink batches.

With `respect_source_tx` (the default) a batch holds whole transactions: they
are added while the batch stays within `max_events` and `max_bytes`; a
transaction larger than the limits becomes a batch of its own, never split.
Without it, batches are cut purely by size. (`max_ms` is the Spark micro-batch
interval, job.py: a slice is cut here once it was read.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import groupby
from operator import itemgetter

from tailrace.config import BatchSpec
from tailrace.events import PositionKey
from tailrace.proto.event_pb2 import ChangeEvent


def _transactions(events: Sequence[ChangeEvent], sizes: Sequence[int],
                  keys: Sequence[PositionKey] | None = None
                  ) -> Iterator[tuple[list[ChangeEvent], int]]:
    """Consecutive events of the same source transaction (same tx_seq), with their bytes;
    `keys`: the events' position keys, when known. (Runs counted in C: a bulk's one
    transaction is not gathered an event at a time.)"""
    tx_seqs = map(itemgetter(0), keys) if keys is not None \
        else (e.position.tx_seq for e in events)
    start = 0
    for _, run in groupby(tx_seqs):
        end = start + len(list(run))
        yield list(events[start:end]), sum(sizes[start:end])
        start = end
    if start != len(events) or len(sizes) != len(events):
        raise ValueError(f"{len(events)} events with {len(sizes)} sizes and {start} keys")


def split_batches(events: Sequence[ChangeEvent], spec: BatchSpec,
                  sizes: Sequence[int] | None = None,
                  keys: Sequence[PositionKey] | None = None) -> Iterator[list[ChangeEvent]]:
    """Whole-transaction (or size-only) batches, in source order: consecutive runs of
    `events`. `sizes`: each event's serialized size, when known (`runtime.decode_slice`);
    `keys`: their position keys, when known."""
    if sizes is None:
        sizes = [e.ByteSize() for e in events]
    units = _transactions(events, sizes, keys) if spec.respect_source_tx \
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

