"""Batches hold whole transactions; an oversized one is kept whole."""

from __future__ import annotations

import pytest

from tailrace.config import BatchSpec
from tailrace.events import ChangeEvent, Position, position_key
from tailrace.proto.event_pb2 import BusRecord
from tailrace_services.delivery.batching import split_batches
from tailrace_services.delivery.runtime import event_size


def tx(seq: int, size: int) -> list[ChangeEvent]:
    return [ChangeEvent(table="t", tx_size=size, tx_index=i, tx_end=i == size - 1,
                        position=Position(tx_seq=seq, event_index=i)) for i in range(size)]


def seqs(batch: list[ChangeEvent]) -> list[int]:
    return sorted({e.position.tx_seq for e in batch})


def test_split_at_transaction_boundaries():
    events = tx(1, 3) + tx(2, 3) + tx(3, 3)
    batches = list(split_batches(events, BatchSpec(max_events=7)))
    assert [seqs(b) for b in batches] == [[1, 2], [3]]
    assert sum(len(b) for b in batches) == 9


def test_oversized_transaction_is_kept_whole():
    events = tx(1, 2) + tx(2, 50) + tx(3, 2)
    batches = list(split_batches(events, BatchSpec(max_events=10)))
    assert [len(b) for b in batches] == [2, 50, 2]


def test_max_bytes_cuts_too():
    events = tx(1, 4) + tx(2, 4)
    one = events[0].ByteSize() * 4
    batches = list(split_batches(events, BatchSpec(max_events=1000, max_bytes=one + 1)))
    assert [seqs(b) for b in batches] == [[1], [2]]


def test_without_respect_source_tx_splits_by_size_only():
    events = tx(1, 5) + tx(2, 5)
    batches = list(split_batches(events, BatchSpec(max_events=3, respect_source_tx=False)))
    assert [len(b) for b in batches] == [3, 3, 3, 1]


def test_the_sizes_of_bus_records_are_their_events_sizes():
    """`decode_slice` sizes each event from its bus record (the event's `ByteSize` serializes
    it again): the same bytes, for events of a few bytes to a few megabytes."""
    lengths = [0, *range(110, 140), *range(16_360, 16_400), 3_000_000]  # varints' widths
    for length in lengths:
        event = ChangeEvent(table="x" * length, position=Position(tx_seq=1))
        record = BusRecord(event=event).SerializeToString()
        assert event_size(len(record)) == event.ByteSize(), length


def test_batches_cut_by_the_sizes_given():
    events = tx(1, 4) + tx(2, 4)
    batches = list(split_batches(events, BatchSpec(max_events=1000, max_bytes=100),
                                 sizes=[30] * 8))
    assert [seqs(b) for b in batches] == [[1], [2]]
    assert len(list(split_batches(events, BatchSpec(max_events=1000, max_bytes=100),
                                  sizes=[1] * 8))) == 1


def test_batches_cut_from_known_position_keys_are_the_same() -> None:
    """`keys` (the runtime reads each event's position once) only spares reading them."""
    events = tx(1, 3) + tx(2, 1) + tx(3, 40) + tx(4, 2) + tx(5, 5)
    keys = [position_key(e.position) for e in events]
    sizes = [e.ByteSize() for e in events]
    for spec in (BatchSpec(max_events=6), BatchSpec(max_events=6, respect_source_tx=False),
                 BatchSpec(max_bytes=200)):
        assert list(split_batches(events, spec, sizes, keys)) == \
            list(split_batches(events, spec, sizes))
    with pytest.raises(ValueError, match="51 events with 50 sizes"):
        list(split_batches(events, BatchSpec(), sizes[:-1], keys))
