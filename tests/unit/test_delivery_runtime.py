"""Plain-Python delivery: skipping what a sink has, and bus duplicates delivered once."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tailrace.events import ChangeEvent, EpochMarker, Position, encode_epoch, encode_event
from tailrace_services.delivery.runtime import BusChanged, deliver_slice
from tailrace_services.delivery.sinks.base import BatchCommit, Sink


class ListSink(Sink):
    def __init__(self, sink_id: str) -> None:
        self.id, self.required, self.events = sink_id, True, []

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        self.events.extend(events)


def ev(tx: int, idx: int) -> ChangeEvent:
    return ChangeEvent(table=f"{tx}.{idx}", position=Position(tx_seq=tx, event_index=idx))


def test_a_sink_gets_what_is_past_its_checkpoint_and_duplicate_copies_once():
    # tx 1..3 published, capture restarted mid tx 3 and re-published 2..4
    events = [ev(1, 0), ev(2, 0), ev(2, 1), ev(3, 0), ev(2, 0), ev(2, 1), ev(3, 0), ev(3, 1),
              ev(4, 0)]
    sink = ListSink("s")
    deliver_slice(0, [(i, encode_event(e)) for i, e in enumerate(events)], [sink],
                  {"s": Position(tx_seq=1, event_index=0)})
    assert [e.table for e in sink.events] == ["2.0", "2.1", "3.0", "3.1", "4.0"]


def test_deliver_slice_reports_epoch_and_offsets():
    records = [(10, encode_event(ev(5, 0))), (11, encode_event(ev(5, 1))),
               (12, encode_epoch(EpochMarker(epoch_id=1, position=Position(tx_seq=5,
                                                                          event_index=1))))]
    ahead, behind = ListSink("ahead"), ListSink("behind")
    result = deliver_slice(0, records, [ahead, behind],
                           {"ahead": Position(tx_seq=5, event_index=1), "behind": None})
    assert result.end_offset == 13 and result.epoch_position.tx_seq == 5
    assert ahead.events == [] and len(behind.events) == 2
    assert result.delivered == {"ahead": 0, "behind": 2}


def test_a_slice_not_ending_with_its_planned_epoch_writes_nothing():
    """A bus that lost its records holds other ones at the planned offsets."""
    marker = encode_epoch(EpochMarker(epoch_id=7, position=Position(tx_seq=5, event_index=1)))
    records = [(10, encode_event(ev(5, 0))), (11, encode_event(ev(5, 1))), (12, marker)]
    sink = ListSink("s")
    assert deliver_slice(0, records, [sink], {"s": None}, ends_with_epoch=7).end_offset == 13
    other = [(10, encode_event(ev(9, 0))), (11, marker), (12, encode_event(ev(9, 1)))]
    moved = ListSink("s")
    with pytest.raises(BusChanged, match="offset 12 is not the marker of epoch 7"):
        deliver_slice(0, other, [moved], {"s": None}, ends_with_epoch=7)
    assert moved.events == []
