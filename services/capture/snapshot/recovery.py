"""After a restart: which of the chunks an earlier process handed to the bus made it
there whole (docs/snapshots.md, "Crash recovery"), and which to read again when the bus
lost its records (`read_lost_again`).

A chunk's attempt is recorded in the control service (`SnapshotTable.inflight`) before
its read transaction is published. After a kill -9 the bus may hold all of it, part of
it, or none. `BusScan` reads the bus after the latest epoch for what those attempts
published; `settle` decides, without I/O, which chunks are done and which keys the bus
holds already.

A reset read (after a lost position) publishes the table's `TRUNCATE` at the first
chunk's low watermark, as a transaction of its own. On a bus of several partitions it
may be lost while the read transaction, on another partition, landed whole: the chunk is
done only with its `TRUNCATE` on the bus too.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from tailrace.bus import BusReader
from tailrace.config import PipelineSpec
from tailrace.control_client import ControlClient
from tailrace.events import decode_record
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import EpochMarker, Op
from tailrace_services.capture.publisher import write_markers
from tailrace_services.capture.snapshot.chunks import Key, TablePlan, key_of, table_of

__all__ = ["BusScan", "Found", "OnBus", "Settled", "ahead_of_a_gap", "read_lost_again",
           "settle", "still_in_flight"]

SCAN_TIMEOUT_S = 60.0
WINDOW_EPOCHS = 256  # recorded epochs looked at first to place a transaction (`_window`)

log = get_logger(__name__)


@dataclass
class OnBus:
    """What a restart found of one read transaction: its keys, its size, and where."""

    size: int
    keys: set[Key] = field(default_factory=set)
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition: [from, to)

    @property
    def whole(self) -> bool:
        return len(self.keys) == self.size > 0


@dataclass
class Found:
    """The bus after the latest epoch, as far as one table's attempts go."""

    reads: dict[int, OnBus] = field(default_factory=dict)  # by the read's tx_seq
    truncates: set[int] = field(default_factory=set)  # tx_seqs of the table's TRUNCATEs


class Settled(NamedTuple):
    """`settle`'s answer: chunks done (in order), the keys the bus holds already, and the
    attempts to keep in the record (found part-way) with how many rows they add."""

    done: list[pb.SnapshotChunk]
    exclude: set[Key]
    partial: list[pb.SnapshotChunk]
    newly_found: int


def settle(entry: pb.SnapshotTable, covered: int, found: Found) -> Settled:
    """A chunk whose latest attempt is in a recorded epoch (`covered`: the epoch's
    tx_seq), or whole on the bus after it with its `TRUNCATE` (a reset's first chunk), is
    done, in chunk order and only right after the one before: ranges read on several
    connections reach the bus in any order, and the cursor must not pass one that did not.
    From the first one that is not, the table is read again, without the keys of any other
    attempt the bus holds.

    An attempt found part-way is kept with where its events are on the bus (`partial_from`/
    `partial_to`) until the table is done: a later restart reads the same keys there (by
    then epochs of later processes may number past it, so the epoch rule cannot tell it was
    cut; and chunk numbers no longer match key ranges once rows were inserted). In a reset
    read, attempts published before the `TRUNCATE` that the first chunk's done attempt
    published (or, while it is not done, will publish again) exclude nothing: it cleared
    them."""
    attempts = sorted(entry.inflight, key=lambda c: (c.chunk, c.tx_seq))
    latest = {c.chunk: c for c in attempts if c.chunk > entry.chunks_done}
    done: list[pb.SnapshotChunk] = []
    expected = entry.chunks_done + 1
    for number in sorted(latest):
        chunk = latest[number]
        on_bus = found.reads.get(chunk.tx_seq)
        truncated = chunk.cleared_tx_seq <= covered or chunk.cleared_tx_seq in found.truncates
        whole = not chunk.partial_from and (
            chunk.tx_seq <= covered or (on_bus is not None and on_bus.whole and truncated))
        if number != expected or not whole:
            break
        done.append(chunk)
        expected += 1
    cleared_at: int | None = 0  # attempts at or before it exclude nothing; None: all
    if entry.reset and entry.chunks_done == 0:
        first = next((c for c in done if c.chunk == 1), None)
        cleared_at = first.cleared_tx_seq if first is not None else None
    finished = {c.tx_seq for c in done}
    exclude: set[Key] = set()
    partial: list[pb.SnapshotChunk] = []
    newly_found = 0
    for attempt in attempts:
        on_bus = found.reads.get(attempt.tx_seq)
        if attempt.tx_seq in finished or on_bus is None or not on_bus.keys:
            continue
        if cleared_at is not None and attempt.tx_seq > cleared_at:  # after the TRUNCATE
            exclude |= on_bus.keys
        kept = pb.SnapshotChunk()
        kept.CopyFrom(attempt)
        if not attempt.partial_from:  # found part-way now: counted once, kept
            newly_found += len(on_bus.keys)
            for partition, (first_offset, after) in on_bus.ranges.items():
                kept.partial_from[partition] = first_offset
                kept.partial_to[partition] = after
        partial.append(kept)
    return Settled(done, exclude, partial, newly_found)


def still_in_flight(inflight: Iterable[pb.SnapshotChunk], done: pb.SnapshotChunk
                    ) -> list[pb.SnapshotChunk]:
    """The attempts to keep once chunk `done` is stored: later chunks', and those found
    part-way, for their keys, until the table is done (`settle`). Not those once a
    reset's `TRUNCATE` is stored (`done.cleared_tx_seq`): they were published before it,
    so the sinks no longer hold their rows, and a later restart must read them again."""
    return [c for c in inflight
            if not (c.partial_from and done.cleared_tx_seq)
            and (c.chunk > done.chunk or (c.partial_from and not done.last))]


def read_lost_again(entry: pb.SnapshotTable, covered: int) -> bool:
    """After the bus lost its records: send the table's reading back to the last chunk the
    sinks' checkpoint (`covered`, a tx_seq) includes, or to its start when the chunk before
    the first lost one is no longer in `recent`; chunks in flight are dropped (read
    again). Whether the reading went back."""
    del entry.inflight[:]

    def on_bus_only(chunk: pb.SnapshotChunk) -> bool:  # its rows, or its TRUNCATE (reset)
        return max(chunk.tx_seq, chunk.cleared_tx_seq) > covered

    lost = [c for c in entry.recent if on_bus_only(c)]
    if not lost:
        return False
    first_lost = min(c.chunk for c in lost)  # ranges reach the bus in any order
    kept = [c for c in entry.recent if c.chunk < first_lost]
    before = kept[-1] if kept and kept[-1].chunk == first_lost - 1 else None
    if before is not None or first_lost == 1:
        entry.cursor = before.cursor if before is not None else ""
        entry.chunks_done = first_lost - 1
        entry.rows_done = max(0, entry.rows_done - sum(c.rows for c in entry.recent
                                                       if c.chunk >= first_lost))
    else:
        entry.cursor, entry.chunks_done, entry.rows_done = "", 0, 0
    del entry.recent[:]
    entry.recent.extend(kept if before is not None else [])
    entry.state = pb.SNAPSHOT_RUNNING
    return True


def ahead_of_a_gap(entry: pb.SnapshotTable, covered: int) -> list[pb.SnapshotChunk]:
    """Fresh attempts a recorded epoch covers (`covered`) that sit past a chunk not done:
    ranges read on several connections reach the bus in any order, and a chunk with nothing
    to publish leaves no attempt. The epoch rule says they are whole, but the cursor cannot
    pass the gap before them, so their keys must be found on the bus (`BusScan.find`)."""
    fresh = sorted((c for c in entry.inflight if not c.partial_from
                    and c.chunk > entry.chunks_done), key=lambda c: (c.chunk, c.tx_seq))
    expected = entry.chunks_done + 1
    ahead: list[pb.SnapshotChunk] = []
    for chunk in fresh:
        if not ahead and chunk.chunk == expected and chunk.tx_seq <= covered:
            expected += 1  # done by the epoch rule, in order (`settle`)
        elif chunk.tx_seq <= covered:
            ahead.append(chunk)
    return ahead


class BusScan:
    """Reads what earlier processes published of a table's attempts."""

    def __init__(self, pipeline: PipelineSpec, control: ControlClient) -> None:
        self.pipeline = pipeline
        self.control = control

    def reader(self) -> BusReader:
        bus = self.pipeline.spec.bus
        return BusReader(bus.brokers, self.pipeline.bus_topic, client_config=bus.client_config,
                         client_id=f"tailrace-capture-snapshot-{self.pipeline.spec.source.id}",
                         committed_only=False)

    def find(self, entry: pb.SnapshotTable, plan: TablePlan, epoch: pb.Epoch | None) -> Found:
        """The attempts' read transactions (and reset `TRUNCATE`s) past the latest epoch,
        and those found part-way before, where they were found."""
        covered = epoch.position.tx_seq if epoch is not None else 0
        found = Found()
        fresh = [c for c in entry.inflight if not c.partial_from]
        positions = {c.tx_seq for c in fresh if c.tx_seq > covered} | {
            c.cleared_tx_seq for c in fresh if c.cleared_tx_seq > covered}
        earlier = [c for c in entry.inflight if c.partial_from]
        ahead = ahead_of_a_gap(entry, covered) if epoch is not None else []
        if not positions and not earlier and not ahead:
            return found
        ends = self._fence(epoch) if positions else {}
        with self.reader() as reader:
            for partition, end in ends.items():
                start = epoch.end_offsets.get(partition, 0) if epoch is not None else 0
                self._collect(reader, partition, start, end, entry, plan, positions, found)
            for attempt in earlier:
                for partition, first in attempt.partial_from.items():
                    self._collect(reader, partition, first, attempt.partial_to[partition],
                                  entry, plan, {attempt.tx_seq}, found)
            for attempt in ahead:
                assert epoch is not None
                window = self._window(attempt.tx_seq, epoch)
                if window is None:
                    log.warning("snapshot chunk before the retained epochs: its keys may be "
                                "read again", table=entry.table, chunk=attempt.chunk)
                    continue
                for partition, end in window[1].items():
                    self._collect(reader, partition, window[0].get(partition, 0), end, entry,
                                  plan, {attempt.tx_seq}, found)
        return found

    def _window(self, tx_seq: int, latest: pb.Epoch
                ) -> tuple[dict[int, int], dict[int, int]] | None:
        """Where on the bus a transaction an epoch covers lies: from the end of the last
        epoch before it to the end of the first epoch at or after it, per partition (the
        recent epochs first, further back when it is older); None when it is older than the
        retained epochs."""
        source_id = self.pipeline.spec.source.id
        back = WINDOW_EPOCHS
        while True:
            after = max(0, latest.epoch_id - back)
            epochs = self.control.epoch_range(source_id, after_epoch_id=after,
                                              up_to_epoch_id=latest.epoch_id, limit=back + 1)
            if epochs and epochs[0].position.tx_seq < tx_seq:
                break
            if after == 0:
                return None
            back *= 4
        for before, epoch in itertools.pairwise(epochs):
            if epoch.position.tx_seq >= tx_seq:
                return dict(before.end_offsets), dict(epoch.end_offsets)
        return None

    def _fence(self, epoch: pb.Epoch | None) -> dict[int, int]:
        """Where each partition ends after everything an earlier process sent: the offset of
        a marker written now (the latest epoch's, again: nothing new for delivery). Asking
        the broker for the end is not enough: the test broker, after a kill -9 of the
        producer, kept its high watermark below records it had appended until something
        more was written, and a chunk found short there is read twice."""
        bus = self.pipeline.spec.bus
        source_id = self.pipeline.spec.source.id
        now_us = time.time_ns() // 1000
        return write_markers(bus.brokers, self.pipeline.bus_topic, [
            EpochMarker(epoch_id=epoch.epoch_id if epoch is not None else 0,
                        source_id=source_id, partition=partition, ts_micros=now_us,
                        position=epoch.position if epoch is not None else None)
            for partition in range(bus.partitions)], f"tailrace-capture-fence-{source_id}",
            bus.client_config, SCAN_TIMEOUT_S,
            "find where an earlier capture's snapshot chunks end")

    @staticmethod
    def _collect(reader: BusReader, partition: int, start: int, end: int,
                 entry: pb.SnapshotTable, plan: TablePlan, positions: Iterable[int],
                 found: Found) -> None:
        wanted = set(positions)
        for offsets, values in reader.read_range(partition, start, end, SCAN_TIMEOUT_S):
            for offset, value in zip(offsets, values, strict=True):
                record = decode_record(value)
                if record.WhichOneof("record") != "event":
                    continue
                event = record.event
                if event.position.tx_seq not in wanted:
                    continue
                if event.op == Op.OP_TRUNCATE and table_of(event) == entry.table:
                    found.truncates.add(event.position.tx_seq)
                elif event.op == Op.OP_SNAPSHOT_READ and \
                        event.snapshot.request_id == entry.request_id:
                    on_bus = found.reads.setdefault(event.position.tx_seq, OnBus(event.tx_size))
                    on_bus.keys.add(key_of(event.after, plan.key_columns))
                    first, after = on_bus.ranges.get(partition, (offset, offset + 1))
                    on_bus.ranges[partition] = (min(first, offset), max(after, offset + 1))
