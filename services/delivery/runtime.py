"""Plain-Python delivery of one bus partition's slice of a batch. Spark runs it; tests call it.

A slice is read in offset order: change events are collected, epoch markers
tell the position the slice ends at. The processors run, the events are cut
into batches (whole transactions), and every sink gets the events past its
own high-water mark (its checkpoint, then the events it has seen), so a sink
that is ahead skips what it has, and copies of a transaction that a restarted
capture published twice are delivered once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tailrace.config import BatchSpec
from tailrace.errors import NonRetryableError, RetryableError
from tailrace.events import EPOCH_RECORD_HEAD, decode_record, decode_records, position_key
from tailrace.proto.event_pb2 import ChangeEvent, Position
from tailrace_services.delivery.batching import split_batches
from tailrace_services.delivery.fanout import SinkOutcome, fan_out
from tailrace_services.delivery.processors import ProcessorChain
from tailrace_services.delivery.sinks.base import BatchCommit, Sink


@dataclass
class SliceResult:
    partition: int
    end_offset: int = -1          # offset just past the last record read; -1 if none
    epoch_position: Position | None = None  # position of the last epoch marker in the slice
    events: int = 0
    outcomes: list[SinkOutcome] = field(default_factory=list)
    dead_letters: list[tuple[str, ChangeEvent, str]] = field(default_factory=list)

    @property
    def delivered(self) -> dict[str, int]:
        return {o.sink_id: o.delivered for o in self.outcomes}

    @property
    def skipped(self) -> dict[str, int]:
        return {o.sink_id: o.skipped for o in self.outcomes}


class BusChanged(RetryableError):
    """The range does not end with the epoch it was planned on: the bus lost its records
    (capture republishes onto a new bus generation) and holds others at those offsets."""


Chunk = tuple[Sequence[int], Sequence[bytes]]
"""Records of a slice as the bus read gives them: their offsets and their values."""

JOINED_BYTES = 8 * 1024 * 1024  # records parsed in one call (`decode_records`): at most this


def decode_slice(partition: int, chunks: Iterable[Chunk], ends_with_epoch: int = 0
                 ) -> tuple[list[ChangeEvent], list[int], SliceResult]:
    """The slice's events, each one's serialized size (`split_batches`), and its result.
    `ends_with_epoch`: the epoch whose marker must be the slice's last record (0: not
    checked). A chunk is parsed in one call (`decode_records`), or in a few when its
    records are large (JOINED_BYTES: the joined copy is made for the call)."""
    result = SliceResult(partition=partition)
    events: list[ChangeEvent] = []
    sizes: list[int] = []
    last_epoch = 0
    for offsets, values in chunks:
        if len(offsets) != len(values):
            raise ValueError(f"a chunk of {len(offsets)} offsets and {len(values)} values")
        if not values:
            continue
        parts = -(-sum(map(len, values)) // JOINED_BYTES)
        step = -(-len(values) // parts)
        for start in range(0, len(values), step):
            last_epoch = _decode(values[start:start + step], events, sizes, result)
        result.end_offset = offsets[-1] + 1
    if ends_with_epoch and result.end_offset >= 0 and last_epoch != ends_with_epoch:
        raise BusChanged(f"bus partition {partition}: offset {result.end_offset - 1} is not "
                         f"the marker of epoch {ends_with_epoch} it was planned on; the bus "
                         "lost its records (nothing written: delivery starts again once "
                         "capture republished them)")
    result.events = len(events)
    return events, sizes, result


def _decode(values: Sequence[bytes], events: list[ChangeEvent], sizes: list[int],
            result: SliceResult) -> int:
    """Records of a chunk into `events`, `sizes` and `result.epoch_position`; returns the
    epoch its last record is the marker of (0: none)."""
    records = decode_records(values)
    if records is None:
        return _decode_one_by_one(values, events, sizes, result)
    events.extend(records.event)
    if not records.epoch:
        sizes.extend(map(event_size, map(len, values)))
        return 0
    sizes.extend(event_size(len(v)) for v in values if v[0] != EPOCH_RECORD_HEAD)
    for marker in records.epoch:
        if marker.epoch_id:  # 0: a bus generation's start
            result.epoch_position = marker.position
    return records.epoch[-1].epoch_id if values[-1][0] == EPOCH_RECORD_HEAD else 0


def _decode_one_by_one(values: Sequence[bytes], events: list[ChangeEvent], sizes: list[int],
                       result: SliceResult) -> int:
    """A chunk `decode_records` cannot take; returns the epoch its last record is the
    marker of (0: none)."""
    last_epoch = 0
    for value in values:
        record = decode_record(value)
        kind = record.WhichOneof("record")
        last_epoch = 0
        if kind == "event":
            events.append(record.event)
            sizes.append(event_size(len(value)))
        elif kind == "epoch" and record.epoch.epoch_id:
            result.epoch_position = record.epoch.position
            last_epoch = record.epoch.epoch_id
    return last_epoch


def event_size(record_bytes: int) -> int:
    """The serialized size of the event a bus record of `record_bytes` holds: the record is
    the event's field tag (one byte) and the varint of its length, then the event. (The
    event's own `ByteSize` serializes it again: ~4 µs an event, a tenth of the plain loop.)"""
    inner = record_bytes - 1
    width = 1
    while inner - width >= 1 << (7 * width):
        width += 1
    return inner - width


def deliver_slice(partition: int, chunks: Iterable[Chunk], sinks: Sequence[Sink],
                  checkpoints: dict[str, Position | None], *, pipeline: str = "",
                  source_id: str = "", batch: BatchSpec | None = None,
                  processors: ProcessorChain | None = None, journal: bool = False,
                  rewinds: dict[str, int] | None = None, ends_with_epoch: int = 0,
                  acked: dict[str, Position] | None = None,
                  delivered: Callable[[Sequence[ChangeEvent]], None] | None = None
                  ) -> SliceResult:
    """Process and fan the slice out; sink failures are reported in `outcomes`, not raised.
    `rewinds`: each sink's checkpoint rewind generation (see `BatchCommit.rewind`);
    `acked`: what each exactly-once sink acknowledged storing in this partition
    (`fanout.deliver_to_sink`); `delivered`: called with the events every sink
    acknowledged (dead letters left out), once they all did (`outbox_cleanup`)."""
    events, sizes, result = decode_slice(partition, chunks, ends_with_epoch)
    if processors:
        floor = min((position_key(p) for p in checkpoints.values() if p is not None),
                    default=(-1, -1)) if all(checkpoints.get(s.id) for s in sinks) else (-1, -1)
        fresh = [e for e in events if position_key(e.position) > floor]
        kept, failures = processors.apply(fresh)
        if failures and not journal:
            event, reason = failures[0]
            raise NonRetryableError(
                f"processor failed on {event.database}.{event.table} event {event.id}: {reason}; "
                f"fix the processor or set spec.journal.enabled: true to send such events to the "
                f"dead-letter queue ({len(failures)} event(s) failed in this batch)")
        result.dead_letters.extend(("processor", e, r) for e, r in failures)
        events = kept
    keys = [position_key(e.position) for e in events]  # read once: batches, then each sink
    batches = list(split_batches(events, batch or BatchSpec(),
                                 None if processors else sizes, keys))  # processors change events
    batch_keys, start = [], 0
    for one in batches:  # consecutive runs of the events
        batch_keys.append(keys[start:start + len(one)])
        start += len(one)

    def commit_for(sink: Sink, position: Position) -> BatchCommit:
        return BatchCommit(pipeline=pipeline, source_id=source_id, sink_id=sink.id,
                           position=position, partition=partition,
                           rewind=(rewinds or {}).get(sink.id, 0))

    result.outcomes = fan_out(sinks, batches, checkpoints, commit_for, dead_letter=journal,
                              partition=partition, rewinds=rewinds, acked=acked, keys=batch_keys)
    for outcome in result.outcomes:
        result.dead_letters.extend((outcome.sink_id, e, r) for e, r in outcome.dead_letters)
    if delivered is not None and result.outcomes and all(o.acked for o in result.outcomes):
        dead = {e.id for _, e, _ in result.dead_letters}
        delivered([e for e in events if e.id not in dead])
    return result
