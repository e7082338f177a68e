"""Plain-Python delivery of one bus partition's slice of a batch. Spark runs it; tests call it.

A slice is read in offset order: change events are collected, epoch markers
tell the position the slice ends at. Each sink gets the events past its own
high-water mark (its checkpoint, then the events it has seen), so a sink that
is ahead skips what it has, and copies of a transaction that a restarted
capture published twice are delivered once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tailrace.events import decode_record, position_key
from tailrace.proto.event_pb2 import ChangeEvent, Position
from tailrace_services.delivery.sinks import Sink


@dataclass
class SliceResult:
    partition: int
    end_offset: int = -1          # offset just past the last record read; -1 if none
    epoch_position: Position | None = None  # position of the last epoch marker in the slice
    events: int = 0
    delivered: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


def decode_slice(partition: int, records: Iterable[tuple[int, bytes]]
                 ) -> tuple[list[ChangeEvent], SliceResult]:
    result = SliceResult(partition=partition)
    events: list[ChangeEvent] = []
    for offset, value in records:
        record = decode_record(value)
        kind = record.WhichOneof("record")
        if kind == "event":
            events.append(record.event)
        elif kind == "epoch":
            result.epoch_position = record.epoch.position
        result.end_offset = offset + 1
    result.events = len(events)
    return events, result


def pending_for(events: Sequence[ChangeEvent], after: Position | None) -> list[ChangeEvent]:
    """Events past the high-water mark `after`, in bus order, each position once."""
    hwm = position_key(after) if after is not None else (-1, -1)
    out = []
    for event in events:
        key = position_key(event.position)
        if key > hwm:
            out.append(event)
            hwm = key
    return out


def deliver_slice(partition: int, records: Iterable[tuple[int, bytes]], sinks: Sequence[Sink],
                  checkpoints: dict[str, Position | None]) -> SliceResult:
    """Write the slice to every sink; raises the first sink error (the batch is then retried)."""
    events, result = decode_slice(partition, records)
    for sink in sinks:
        todo = pending_for(events, checkpoints.get(sink.id))
        if todo:
            sink.write(todo)
        result.delivered[sink.id] = len(todo)
        result.skipped[sink.id] = len(events) - len(todo)
    return result
