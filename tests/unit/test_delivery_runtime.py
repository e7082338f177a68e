"""Plain-Python delivery: skipping what a sink has, and bus duplicates delivered once."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tailrace.events import (
    ChangeEvent,
    EpochMarker,
    Position,
    decode_record,
    decode_records,
    encode_epoch,
    encode_event,
)
from tailrace_services.delivery import runtime
from tailrace_services.delivery.runtime import BusChanged, Chunk, decode_slice, deliver_slice
from tailrace_services.delivery.sinks.base import BatchCommit, Sink


class ListSink(Sink):
    def __init__(self, sink_id: str) -> None:
        self.id, self.required, self.events = sink_id, True, []

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        self.events.extend(events)


def chunked(records: list[tuple[int, bytes]], size: int = 2) -> list[Chunk]:
    """`records` as the bus read gives them: (offsets, values) chunks of `size`."""
    return [([o for o, _ in records[i:i + size]], [v for _, v in records[i:i + size]])
            for i in range(0, len(records), size)]


def ev(tx: int, idx: int) -> ChangeEvent:
    return ChangeEvent(table=f"{tx}.{idx}", position=Position(tx_seq=tx, event_index=idx))


def test_a_sink_gets_what_is_past_its_checkpoint_and_duplicate_copies_once():
    # tx 1..3 published, capture restarted mid tx 3 and re-published 2..4
    events = [ev(1, 0), ev(2, 0), ev(2, 1), ev(3, 0), ev(2, 0), ev(2, 1), ev(3, 0), ev(3, 1),
              ev(4, 0)]
    sink = ListSink("s")
    deliver_slice(0, chunked([(i, encode_event(e)) for i, e in enumerate(events)]), [sink],
                  {"s": Position(tx_seq=1, event_index=0)})
    assert [e.table for e in sink.events] == ["2.0", "2.1", "3.0", "3.1", "4.0"]


def test_deliver_slice_reports_epoch_and_offsets():
    records = [(10, encode_event(ev(5, 0))), (11, encode_event(ev(5, 1))),
               (12, encode_epoch(EpochMarker(epoch_id=1, position=Position(tx_seq=5,
                                                                          event_index=1))))]
    ahead, behind = ListSink("ahead"), ListSink("behind")
    result = deliver_slice(0, chunked(records), [ahead, behind],
                           {"ahead": Position(tx_seq=5, event_index=1), "behind": None})
    assert result.end_offset == 13 and result.epoch_position.tx_seq == 5
    assert ahead.events == [] and len(behind.events) == 2
    assert result.delivered == {"ahead": 0, "behind": 2}


def test_a_slice_not_ending_with_its_planned_epoch_writes_nothing():
    """A bus that lost its records holds other ones at the planned offsets."""
    marker = encode_epoch(EpochMarker(epoch_id=7, position=Position(tx_seq=5, event_index=1)))
    records = [(10, encode_event(ev(5, 0))), (11, encode_event(ev(5, 1))), (12, marker)]
    sink = ListSink("s")
    assert deliver_slice(0, chunked(records), [sink], {"s": None}, ends_with_epoch=7).end_offset == 13
    other = [(10, encode_event(ev(9, 0))), (11, marker), (12, encode_event(ev(9, 1)))]
    moved = ListSink("s")
    with pytest.raises(BusChanged, match="offset 12 is not the marker of epoch 7"):
        deliver_slice(0, chunked(other), [moved], {"s": None}, ends_with_epoch=7)
    assert moved.events == []


def _records_with_markers() -> list[tuple[int, bytes]]:
    """Events of three transactions with markers between them: a bus generation's start
    (epoch 0), epochs 1 and 2, the slice ending with epoch 2's."""
    marker = [encode_epoch(EpochMarker(epoch_id=i, position=Position(tx_seq=i + 1)))
              for i in range(3)]
    values = [marker[0], encode_event(ev(1, 0)), encode_event(ev(1, 1)), marker[1],
              encode_event(ev(2, 0)), encode_event(ev(3, 0)), marker[2]]
    return [(100 + i, v) for i, v in enumerate(values)]


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_a_chunk_parsed_in_one_call_is_what_its_records_are_one_by_one(size: int) -> None:
    records = _records_with_markers()
    events, sizes, result = decode_slice(0, chunked(records, size), ends_with_epoch=2)
    assert [e.table for e in events] == ["1.0", "1.1", "2.0", "3.0"]
    assert sizes == [e.ByteSize() for e in events]
    assert result.end_offset == 107 and result.events == 4
    assert result.epoch_position == Position(tx_seq=3)  # the last marker's
    with pytest.raises(BusChanged):  # the last record is epoch 2's marker, not epoch 1's
        decode_slice(0, chunked(records, size), ends_with_epoch=1)
    with pytest.raises(BusChanged):  # ...and without it the slice ends with an event
        decode_slice(0, chunked(records[:-1], size), ends_with_epoch=2)


_DOUBLE = encode_event(ev(8, 0)) + encode_event(ev(8, 1))  # one record, two events
_UNKNOWN = b"\x1a\x03abc"  # one record of a field neither event nor marker


@pytest.mark.parametrize("odd", [[b""], [_DOUBLE], [_DOUBLE, b""], [_DOUBLE, _UNKNOWN],
                                 [_UNKNOWN]],
                         ids=["empty", "two-events", "two-and-empty", "two-and-unknown",
                              "unknown"])
def test_a_record_that_is_not_one_event_or_one_marker_is_parsed_alone(odd: list[bytes]
                                                                        ) -> None:
    """Not what capture writes: an empty record, one of two events (parsed alone, the
    second merges into the first, as a BusRecord's oneof does), one of another field.
    Parsed together, two of them would pass for as many records."""
    marker = encode_epoch(EpochMarker(epoch_id=3, position=Position(tx_seq=7, event_index=1)))
    values = [encode_event(ev(7, 0)), *odd, encode_event(ev(7, 1)), marker]
    assert decode_records(values) is None
    one_by_one = [decode_record(v) for v in values]
    expected = [r.event for r in one_by_one if r.WhichOneof("record") == "event"]
    for size in (2, len(values)):  # some chunks parsed in one call, the odd ones alone
        events, sizes, result = decode_slice(0, chunked(list(enumerate(values)), size),
                                             ends_with_epoch=3)
        assert events == expected and result.end_offset == len(values)
        assert len(sizes) == len(events)
        assert result.epoch_position == Position(tx_seq=7, event_index=1)


def test_large_records_are_parsed_a_few_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk's joined copy stays under JOINED_BYTES: the same events either way."""
    records = _records_with_markers()
    whole = decode_slice(0, chunked(records, 7), ends_with_epoch=2)
    monkeypatch.setattr(runtime, "JOINED_BYTES", 40)  # about one record a call
    parts = decode_slice(0, chunked(records, 7), ends_with_epoch=2)
    assert parts[0] == whole[0] and parts[1] == whole[1]
    assert parts[2].end_offset == whole[2].end_offset == 107


def test_a_chunk_of_more_offsets_than_values_is_refused() -> None:
    with pytest.raises(ValueError, match="3 offsets and 2 values"):
        decode_slice(0, [([1, 2, 3], [encode_event(ev(1, 0)), encode_event(ev(1, 1))])])
