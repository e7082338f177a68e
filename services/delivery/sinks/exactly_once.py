"""Exactly-once sinks: the checkpoint stored with the data, in the same atomic write.

Redis (MULTI/EXEC), PostgreSQL (one transaction) and Kafka with `exactly_once: true`
(one Kafka transaction) keep beside the data the position of the last batch they
wrote, one per pipeline, sink, bus partition and rewind generation
(`_common.checkpoint_name`). A write with a `BatchCommit` is always these steps, owned
here:
1. begin the sink's atomic unit and read the stored checkpoint inside it (`begin`);
2. skip the events at or before it: a replayed batch (a retry, a restart from an older
   control-service checkpoint, a batch another worker wrote) is not written twice;
3. write the rest and the batch's position as one unit (`AtomicWrite.write`). A batch's
   position is that of its last event, so whatever is left to write moves it forward;
   when nothing is left and the position does not move, nothing is written.
A crash anywhere leaves both or neither, so the next attempt reads the checkpoint and
skips exactly what was written. A write without a `BatchCommit` (a tool, a test)
writes every event as it comes: at-least-once (`write_unchecked`).

The stored checkpoint read in step 1 is also checked against `BatchCommit.floor`, what the
sink acknowledged storing: found behind, the sink lost writes it had acknowledged (a server
restarted without its log, a restored backup) and the pipeline stops (`SinkLostWrites`)
rather than write on past the gap.

A failed write goes through `write_failed`, where the sink drops what the failure
spoiled (a connection, a producer) and turns the error into a Tailrace error; it is
raised outside the `except` block, so no traceback keeps the spoiled client alive.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager

from tailrace.errors import FatalError
from tailrace.events import ChangeEvent, Position, position_key
from tailrace.logs import get_logger
from tailrace_services.delivery.sinks._common import advances, fresh_indexes
from tailrace_services.delivery.sinks.base import BatchCommit, Sink

__all__ = ["AtomicWrite", "ExactlyOnceSink", "SinkLostWrites"]

log = get_logger(__name__)


class SinkLostWrites(FatalError):
    """An exactly-once sink's stored checkpoint is behind what it acknowledged storing:
    writes it had acknowledged are gone from it. Says how to deliver them again."""

    def __init__(self, sink_id: str, pipeline: str, partition: int, stored: Position | None,
                 acked: Position) -> None:
        held = (f"tx {stored.tx_seq}.{stored.event_index}" if stored is not None
                else "nothing (no checkpoint at all)")
        back = f"--to-sequence {stored.tx_seq}" if stored is not None else "--reset"
        super().__init__(
            f"sink {sink_id} lost writes it had acknowledged: on bus partition {partition} "
            f"its stored checkpoint holds {held}, but it acknowledged storing tx "
            f"{acked.tx_seq}.{acked.event_index}; the changes in between are gone from it "
            "(was it restarted without its log, or restored from a backup?). Delivery stops "
            "rather than write on past the gap. To deliver them again: "
            f"tailrace pause {pipeline}; tailrace rewind {pipeline} {sink_id} {back} "
            f"--confirm {sink_id}; tailrace resume {pipeline}; then start delivery")

    @staticmethod
    def check(sink_id: str, commit: BatchCommit | None, stored: Position | None) -> None:
        """Raise when `stored` is behind `commit.floor`."""
        if commit is None or commit.floor is None:
            return
        if stored is None or position_key(stored) < position_key(commit.floor):
            raise SinkLostWrites(sink_id, commit.pipeline, commit.partition, stored,
                                 commit.floor)


class AtomicWrite(ABC):
    """One atomic unit of an exactly-once sink, begun: `stored` is the checkpoint as read
    inside it."""

    stored: Position | None

    @abstractmethod
    def write(self, events: Sequence[ChangeEvent], indexes: list[int],
              commit: BatchCommit) -> None:
        """Write `events[i]` for each of `indexes`, in order, and `commit.position` as the
        stored checkpoint, as one unit: committed once this returns (or once the `begin`
        context exits without error), or not at all. A `PerEventError` names indexes of
        `events`."""


class ExactlyOnceSink(Sink):
    """A sink that stores its checkpoint with the data. Subclasses say how to begin an
    atomic unit, how to read a checkpoint outside one, and how to write without one."""

    pipeline: str | None = None  # whose checkpoints: from `build_sink`, else the first commit

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        failure: Exception | None = None
        try:
            if commit is None:
                self.write_unchecked(events)
            else:
                self._write_checked(events, commit)
        except Exception as e:  # noqa: BLE001 - turned into a Tailrace error by the sink
            failure = self.write_failed(e, commit)
            if isinstance(e, SinkLostWrites):
                failure = e  # the sink tidied up; the pipeline stops with this
        if failure is not None:
            raise failure

    def _write_checked(self, events: Sequence[ChangeEvent], commit: BatchCommit) -> None:
        self.pipeline = commit.pipeline
        with self.begin(commit) as unit:
            SinkLostWrites.check(self.id, commit, unit.stored)
            todo = fresh_indexes(events, unit.stored, commit.ascending)
            if len(todo) < len(events):
                log.info("replayed events skipped", sink=self.id, skipped=len(events) - len(todo))
            if todo or advances(commit, unit.stored):
                unit.write(events, todo, commit)

    def stored_position(self, partition: int = 0, rewind: int = 0) -> Position | None:
        if self.pipeline is None:
            return None  # not known before the first commit; write() still skips replays
        return self.read_checkpoint(self.pipeline, partition, rewind)

    @abstractmethod
    def begin(self, commit: BatchCommit) -> AbstractContextManager[AtomicWrite]:
        """Open the atomic unit for `commit`'s checkpoint (its partition and rewind
        generation) and read the checkpoint in it; leaving the context ends the unit."""

    @abstractmethod
    def read_checkpoint(self, pipeline: str, partition: int, rewind: int) -> Position | None:
        """The stored checkpoint, read outside a write; errors as Tailrace errors."""

    @abstractmethod
    def write_unchecked(self, events: Sequence[ChangeEvent]) -> None:
        """Every event, in order, without a checkpoint (at-least-once)."""

    @abstractmethod
    def write_failed(self, error: Exception, commit: BatchCommit | None) -> Exception:
        """Drop what `error` spoiled and return what the runtime should see: a Tailrace
        error naming this sink."""
