"""Where a capture session resumes: one rule for both sources.

Every session starts from a `ResumePoint`, made of three positions:

- `checkpoint`: the minimum position every sink has checkpointed. It is the only
  position a source may let its server discard log up to (the PostgreSQL slot is
  confirmed up to it, never further), and the one checked against the server on
  every (re)connect (identity, reachability). With a lost bus, it is what
  guarantees no loss (DESIGN guarantee 1).
- `published`: the furthest transaction known to be on the bus whole: what this
  process published in an earlier session, when that session ended with the bus
  having acknowledged everything (`published_up_to`, kept until `forget`); else
  what the bus provably holds (`published_tail` below).
- `start` = the furthest of the two: publishing continues after it. Transactions
  up to it are read again (the server sends them) but not published again.

The per-source hook is `skip_published`: whether `start` may pass the checkpoint.

- MySQL/MariaDB: yes. A transaction is named by its GTID, the stream skips GTIDs
  the start state contains, and a start past the checkpoint is checked for
  reachability on the server like the checkpoint itself. Without it, a kill -9
  of capture would publish again everything since the last delivery.
- PostgreSQL: no, `start` is the checkpoint. Its slot sends everything after the
  checkpoint again anyway (it is confirmed only up to the checkpoint transaction's
  last change, so that the re-read can be verified, `capture_postgres/history.py`),
  so skipping would save re-publishing, not reading; and its transactions are
  named by WAL byte offsets, which a promoted standby or another copy of the
  cluster reuses for other transactions, so every transaction past the checkpoint
  is published again from what the server sends now, with the same ids when it is
  the same transaction. Its `published` is not looked for (the bus is not read);
  its position checks use the latest recorded epoch instead.

`published_tail`: the latest epoch recorded in the control service is trusted only
if its marker is still on the bus at the recorded offset (a broker that lost its
data, or a recreated topic, fails this: then the checkpoint decides). With one
partition (the default) the records after that marker are read to the end: the
last event ending a transaction (`tx_end`) marks the last transaction the bus holds
whole — a partition keeps the producer's order, so everything before it is there
too; a transaction cut by a kill has no `tx_end` and is published again, whole.
With several partitions only the marker is used (partitions are not ordered among
themselves).

`highest_published`: the highest tx_seq anything downstream may hold or be shown of this
source — the checkpoint, the latest epoch, what this process published, and every event
on the bus after the latest epoch (on every partition; from offset 0 when the marker is
not there), whole or cut short. A source that starts its numbering again somewhere else
(MySQL/MariaDB, after accepting a server as it is now) numbers above it, so that a
delivery, which keeps each position once and forward only, keeps the new transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tailrace.bus import BusMessage, BusReader, BusReadError
from tailrace.config import PipelineSpec
from tailrace.control_client import ControlClient
from tailrace.errors import RetryableError
from tailrace.logs import get_logger
from tailrace.proto.control_pb2 import Checkpoint, Epoch
from tailrace.proto.event_pb2 import Position

__all__ = ["BusUnanswered", "ResumePoint", "ResumeRule", "bus_lost_epoch", "highest_on_bus",
           "published_tail"]

log = get_logger(__name__)

TAIL_TIMEOUT_S = 20.0
AT_TIMEOUT_S = 5.0  # a marker read at its offset, before the partition is read from its start


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Checkpoint | None  # the minimum sink checkpoint
    latest_epoch: Epoch | None  # the latest epoch recorded in the control service
    published: Position | None  # the furthest transaction known to be on the bus whole

    @property
    def start(self) -> Position | None:
        """Publishing continues after this: the furthest of checkpoint and published (the
        checkpoint when they are the same transaction); None when neither names a source
        position (nothing checkpointed or published yet: the source decides)."""
        candidates = [p for p in (self.checkpoint.position if self.checkpoint else None,
                                  self.published)
                      if p is not None and p.WhichOneof("native") is not None]
        return max(candidates, key=lambda p: p.tx_seq) if candidates else None


class ResumeRule:
    """The resume rule of one source, across its sessions (module docstring)."""

    def __init__(self, pipeline: PipelineSpec, control: ControlClient, *,
                 skip_published: bool) -> None:
        self.pipeline = pipeline
        self.control = control
        self.source_id = pipeline.spec.source.id
        self.sink_ids = [s.id for s in pipeline.spec.sinks]
        self.skip_published = skip_published
        self.published: Position | None = None  # by this process, acknowledged by the bus

    def published_up_to(self, position: Position) -> None:
        """A transaction was handed to the bus (the assembler calls this after each one)."""
        self.published = position

    def forget(self) -> None:
        """The bus may not have what this process published (a session ended with a bus or
        control failure): the next session asks the bus again."""
        self.published = None

    def read(self, accept: Callable[[Position], bool] = lambda _: True) -> ResumePoint:
        """The resume point now; `accept` is asked about a published position from the bus
        or this process (a source refuses one it cannot use; the checkpoint decides then)."""
        checkpoint = self.control.minimum_checkpoint(self.source_id, self.sink_ids)
        epoch = self.control.latest_epoch(self.source_id)
        if not self.skip_published:
            return ResumePoint(checkpoint, epoch, None)
        published = self.published
        if published is not None:  # this process's, from before: unless the bus lost it since
            bus = self.pipeline.spec.bus
            if bus_lost_epoch(bus.brokers, self.pipeline.bus_topic, bus.partitions,
                              self.source_id, epoch, client_config=bus.client_config):
                published = self.published = None
        if published is None:
            bus = self.pipeline.spec.bus
            published = published_tail(bus.brokers, self.pipeline.bus_topic, bus.partitions,
                                       self.source_id, epoch, client_config=bus.client_config)
        if published is not None and not accept(published):
            published = None
        return ResumePoint(checkpoint, epoch, published)


    def highest_published(self, point: ResumePoint) -> int:
        """The highest tx_seq of this source anything downstream may hold (module
        docstring); RetryableError when the bus cannot tell it now."""
        known = [p.tx_seq for p in (point.checkpoint.position if point.checkpoint else None,
                                    point.latest_epoch.position if point.latest_epoch else None,
                                    point.published, self.published) if p is not None]
        bus = self.pipeline.spec.bus
        on_bus = highest_on_bus(bus.brokers, self.pipeline.bus_topic, bus.partitions,
                                self.source_id, point.latest_epoch,
                                client_config=bus.client_config)
        return max([*known, on_bus])


def published_tail(brokers: str, topic: str, partitions: int, source_id: str,
                   epoch: Epoch | None, timeout_s: float = TAIL_TIMEOUT_S,
                   client_config: Mapping[str, str] | None = None) -> Position | None:
    """The position of the last transaction the bus holds whole, or None when unknown."""
    with BusReader(brokers, topic, client_id=f"tailrace-capture-tail-{source_id}",
                   client_config=client_config, committed_only=False) as reader:
        if epoch is not None:
            present = _marker_present(reader, partitions, epoch, timeout_s)
            if present is False:
                log.warning("the latest epoch's marker is not on the bus; resuming from the "
                            "sinks' checkpoint", epoch=epoch.epoch_id)
                return None
            if present is None:  # could not tell in time: the epoch is what we know
                return epoch.position
        best = epoch.position if epoch is not None else None
        if partitions != 1:
            return best
        start = epoch.end_offsets.get(0, 0) if epoch is not None else 0
        tail = _last_complete(reader, start, source_id, timeout_s)
        return tail if tail is not None else best


class BusUnanswered(RetryableError):
    """The bus did not answer whether it still holds an epoch's marker."""


def bus_lost_epoch(brokers: str, topic: str, partitions: int, source_id: str,
                   epoch: Epoch | None, timeout_s: float = TAIL_TIMEOUT_S,
                   client_config: Mapping[str, str] | None = None,
                   probe: Callable[[], object] | None = None) -> bool:
    """Whether the bus lost the latest epoch's marker (a broker restarted empty, the topic
    made again): then what this source published is gone from it, and a new bus
    generation begins (`tailrace.bus_generation`). RetryableError when the bus does not
    answer in time: a generation must not be opened on a guess. `probe` writes something
    to every partition: the test broker, after a kill -9 of a producer, kept a partition's
    end below records it had appended until something more was written (see
    `snapshot.recovery.BusScan._fence`), so a marker not found is looked for again after
    it."""
    if epoch is None:
        return False
    with BusReader(brokers, topic, client_id=f"tailrace-capture-generation-{source_id}",
                   client_config=client_config, committed_only=False) as reader:
        present = _marker_present(reader, partitions, epoch, timeout_s,
                                  ask_end=probe is not None)
        if present is False and probe is not None:
            try:
                probe()
            except BusUnanswered:
                raise  # a slow bus is not a lost one
            except RetryableError as e:  # the bus answered, without our marker, and takes
                log.warning("cannot write to the bus to look for the latest epoch's marker "
                            "again", error=str(e))  # nothing: not the bus we published on
                return True
            present = _marker_present(reader, partitions, epoch, timeout_s, ask_end=True)
    if present is None:
        raise BusUnanswered(f"bus {topic}: cannot tell whether the latest epoch's marker "
                            "is there; not publishing until it answers")
    return not present


def _marker_present(reader: BusReader, partitions: int, epoch: Epoch, timeout_s: float,
                    ask_end: bool = False) -> bool | None:
    """True / False, or None when the bus did not answer in time. `ask_end`: first ask
    where the partition ends, as a broker may not answer a read past it (Tansu) — only
    where a False is looked at again after a write (`bus_lost_epoch`): the test broker
    gives a partition's end as one past the start of its last batch, below the marker
    when the marker shared that batch with the records before it."""
    for partition in range(partitions):
        end = epoch.end_offsets.get(partition)
        if not end:
            return False
        try:
            if ask_end and reader.end_offset(partition, min(timeout_s, AT_TIMEOUT_S)) < end:
                return False  # the partition ends before the marker now
            try:
                message = reader.read_at(partition, end - 1, min(timeout_s, AT_TIMEOUT_S))
            except TimeoutError:
                # a broker may not answer a read past a partition's end (Tansu): look for the
                # offset from the partition's start instead
                message = _scan_to(reader, partition, end - 1, timeout_s)
        except (TimeoutError, BusReadError) as e:
            log.warning("cannot read the latest epoch's marker", epoch=epoch.epoch_id,
                        partition=partition, error=str(e))
            return None
        if message is None or message.offset != end - 1:
            return False  # nothing at that offset: the bus lost it
        record = message.record()
        if (record.WhichOneof("record") != "epoch" or record.epoch.epoch_id != epoch.epoch_id
                or record.epoch.source_id != epoch.source_id):
            return False
    return True


def _scan_to(reader: BusReader, partition: int, offset: int, timeout_s: float
             ) -> BusMessage | None:
    """The record at `offset`, read from the partition's first record on; None when the
    partition ends before it."""
    for message in reader.read_to_end(partition, 0, timeout_s):
        if message.offset >= offset:
            return message
    return None


def _last_complete(reader: BusReader, start: int, source_id: str, timeout_s: float
                   ) -> Position | None:
    last: Position | None = None
    try:
        for message in reader.read_to_end(0, start, timeout_s):
            record = message.record()
            kind = record.WhichOneof("record")
            if kind == "event" and record.event.source_id == source_id and record.event.tx_end:
                last = Position()
                last.CopyFrom(record.event.position)
            elif kind == "epoch" and record.epoch.source_id == source_id and \
                    record.epoch.epoch_id:  # 0: a bus generation's start, names nothing
                last = Position()
                last.CopyFrom(record.epoch.position)
    except BusReadError as e:
        log.warning("cannot read the bus tail", error=str(e))
        return None
    except TimeoutError:
        log.warning("reading the bus tail timed out; resuming from the latest epoch")
        return None
    return last


def highest_on_bus(brokers: str, topic: str, partitions: int, source_id: str,
                   epoch: Epoch | None, timeout_s: float = TAIL_TIMEOUT_S,
                   client_config: Mapping[str, str] | None = None) -> int:
    """The highest tx_seq of `source_id`'s events on the bus after `epoch` (0 when none);
    RetryableError when the bus does not answer in time: a number must not be guessed."""
    highest = 0
    with BusReader(brokers, topic, client_id=f"tailrace-capture-highest-{source_id}",
                   client_config=client_config, committed_only=False) as reader:
        present = _marker_present(reader, partitions, epoch, timeout_s) if epoch else False
        if present is None:
            raise RetryableError(f"bus {topic}: cannot tell whether the latest epoch's marker "
                                 "is there; the highest published position is not known yet")
        for partition in range(partitions):
            start = epoch.end_offsets.get(partition, 0) if present and epoch else 0
            try:
                for message in reader.read_to_end(partition, start, timeout_s):
                    record = message.record()
                    if record.WhichOneof("record") == "event" and \
                            record.event.source_id == source_id:
                        highest = max(highest, record.event.position.tx_seq)
            except (BusReadError, TimeoutError) as e:
                raise RetryableError(f"bus {topic}[{partition}]: cannot read it to the end to "
                                     f"find the highest published position: {e}") from None
    return highest
