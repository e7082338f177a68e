"""The driver's side of a batch: read checkpoints before, dead letters and commit after.

Order of the commit steps, after every task of the batch returned:
1. dead letters (per-event failures) are appended to the control service's DLQ;
2. the outcome (which sinks acknowledged, which are required) goes to the control
   service's commit policy, with each acknowledged sink's new checkpoint and the
   version read before the batch;
3. the control service advances the acknowledged sinks' checkpoints atomically,
   and only when the policy holds.
A lost compare-and-set means another delivery process owns the pipeline: fatal. Every
report carries this instance's owner generation (claimed at start): once a newer instance
claimed the pipeline, the control service refuses the commit (`FencedError`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tailrace.config import PipelineSpec
from tailrace.control_client import ControlClient
from tailrace.errors import FatalError, FencedError, RetryableError
from tailrace.events import position_key
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import Position

log = get_logger(__name__)


@dataclass
class BatchReport:
    events: int = 0
    acked: dict[str, bool] = field(default_factory=dict)
    delivered: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    error_classes: dict[str, str] = field(default_factory=dict)  # retryable | non_retryable
    write_s: dict[str, float] = field(default_factory=dict)
    e2e_ms_max: float = 0.0
    task_ms_max: float = 0.0  # the slowest task of the batch, and its bus read
    read_ms_max: float = 0.0
    dead_letters: int = 0
    policy_satisfied: bool = True
    reason: str = ""
    advanced: list[str] = field(default_factory=list)  # sinks whose checkpoint moved forward
    # exactly-once sinks: per sink and bus partition, where its stored checkpoint is now
    stored: dict[str, dict[int, Position]] = field(default_factory=dict)

    @property
    def lagging(self) -> list[str]:
        return [s for s, ok in self.acked.items() if not ok]


class BatchCommitter:
    def __init__(self, pipeline: PipelineSpec, control: ControlClient) -> None:
        self.pipeline = pipeline
        self.control = control
        self.source_id = pipeline.spec.source.id
        self.sinks = {s.id: s for s in pipeline.spec.sinks}
        self._own_versions: dict[str, int] = {}  # what this process last committed, per sink
        self.generation = 0  # this instance's owner generation (0: not claimed, unchecked)
        self.last_committed: dict[str, pb.Checkpoint] = {}
        self.detached: set[str] = set()  # sinks the control service detached (retention.py)

    def read(self, detached: set[str] | frozenset[str] = frozenset()
             ) -> dict[str, pb.Checkpoint | None]:
        """Step 0: the checkpoints as stored, of the sinks the batch writes to (not the
        `detached` ones: the control service detached them for holding the source's log
        back); one moved by someone else since our last commit means another delivery
        process runs this pipeline (a zombie one of us): fatal."""
        for sink_id in sorted(detached - self.detached):
            log.error("sink detached by the control service (it held the source log past "
                      "source.max_retained); nothing more is written to it",
                      pipeline=self.pipeline.name, sink=sink_id)
            self._own_versions.pop(sink_id, None)  # an operator's attach moves it
        self.detached = set(detached)
        current = {s: self.control.get_checkpoint(self.source_id, s) for s in self.sinks
                   if s not in detached}
        for sink_id, version in self._own_versions.items():
            cp = current.get(sink_id)
            if cp is None or cp.version != version:
                raise FatalError(
                    f"checkpoint of sink {sink_id} (pipeline {self.pipeline.name}) was moved by "
                    f"someone else (version {version} -> {cp.version if cp else 'none'}); is a "
                    "second delivery process running for this pipeline?")
        return current

    def check_owner(self, owner: pb.DeliveryOwner) -> None:
        """Before writing: a newer delivery instance that claimed the pipeline fences this one
        (the control service would refuse our commit anyway; this spares the sinks the write)."""
        if self.generation and owner.generation != self.generation:
            raise FencedError(
                f"delivery instance {owner.instance} (generation {owner.generation}) took over "
                f"pipeline {self.pipeline.name}; this instance (generation {self.generation}) "
                "stops without writing further")

    def forget_versions(self) -> None:
        """After a restart from checkpoints (e.g. an operator rewind) start from what is stored."""
        self._own_versions.clear()

    def summarize(self, rows: list[Any]) -> BatchReport:
        report = BatchReport(events=sum(r["events"] for r in rows),
                             task_ms_max=max((r["task_ms"] for r in rows), default=0.0),
                             read_ms_max=max((r["read_ms"] for r in rows), default=0.0))
        for row in rows:
            for o in json.loads(row["outcomes"]):
                sid = o["sink_id"]
                report.acked[sid] = report.acked.get(sid, True) and o["acked"]
                report.delivered[sid] = report.delivered.get(sid, 0) + o["delivered"]
                report.write_s[sid] = max(report.write_s.get(sid, 0.0), o["write_s"])
                report.e2e_ms_max = max(report.e2e_ms_max, o["e2e_ms_max"])
                if o.get("stored") is not None:
                    tx_seq, event_index = o["stored"]
                    report.stored.setdefault(sid, {})[row["partition"]] = Position(
                        tx_seq=tx_seq, event_index=event_index)
                if o["error"]:
                    report.errors[sid] = f"{o['error_class']}: {o['error']}"
                    report.error_classes[sid] = o["error_class"]
        return report

    def dead_letter(self, rows: list[Any]) -> int:
        """Step 1. Raises RetryableError when the DLQ refuses (overflow `reject`/`block`)."""
        entries = [(d["sink_id"], d["reason"], d["event"]) for r in rows
                   for d in (r["dead_letters"] or [])]
        if not entries:
            return 0
        journal = self.pipeline.spec.journal
        appended, dropped, rejected = self.control.dlq_append(
            self.pipeline.name, entries, journal.overflow, journal.max_entries,
            journal.ttl.total_seconds())
        if rejected:
            raise RetryableError(
                f"dead-letter queue of pipeline {self.pipeline.name} is full "
                f"({journal.max_entries} entries, overflow {journal.overflow}): {rejected} "
                "event(s) refused; purge or replay it (`tailrace dlq`) to go on")
        if dropped:
            log.warning("dead-letter queue full; dropped oldest entries", dropped=dropped)
        log.warning("events sent to the dead-letter queue", count=appended)
        return appended

    def new_checkpoint(self, sink_id: str, old: pb.Checkpoint | None, rows: list[Any],
                       generation_start: dict[int, int] | None = None,
                       stored: dict[int, Position] | None = None) -> pb.Checkpoint:
        """`old` moved on by the batch's `rows`; `generation_start`: where the rows' bus
        generation begins, when it is not `old`'s (`tailrace.bus_generation`); `stored`:
        where the sink's stored checkpoint is now, per partition (`BatchReport.stored`)."""
        cp = pb.Checkpoint(pipeline=self.pipeline.name, source_id=self.source_id, sink_id=sink_id)
        generation = max((row["generation"] for row in rows),
                         default=old.bus_generation if old is not None else 0)
        cp.bus_generation = generation
        if old is not None:
            cp.rewind = old.rewind  # the generation an operator's rewind set carries forward
            cp.position.CopyFrom(old.position)
        offsets = dict(old.bus_offsets) if old is not None and \
            old.bus_generation == generation else dict(generation_start or {})
        for p, o in offsets.items():
            cp.bus_offsets[p] = o
        for p, pos in [*(old.sink_stored.items() if old is not None else ()),
                       *(stored or {}).items()]:
            cp.sink_stored[p].CopyFrom(pos)  # source positions: of no bus generation
        for row in rows:
            if row["end_offset"] >= 0:
                cp.bus_offsets[row["partition"]] = max(cp.bus_offsets.get(row["partition"], 0),
                                                       row["end_offset"])
            if row["epoch_position"] is not None:
                pos = Position.FromString(row["epoch_position"])
                if position_key(pos) > position_key(cp.position):
                    cp.position.CopyFrom(pos)
        return cp

    def commit(self, before: dict[str, pb.Checkpoint | None], rows: list[Any],
               report: BatchReport) -> None:
        """Steps 2 and 3."""
        outcomes = []
        start = self._generation_start(before, rows)
        for sink_id, old in before.items():  # the sinks the batch was written to
            spec = self.sinks[sink_id]
            outcomes.append(pb.SinkOutcome(
                sink_id=sink_id, required=spec.required,
                acknowledged=report.acked.get(sink_id, True),
                checkpoint=self.new_checkpoint(sink_id, old, rows, start,
                                               report.stored.get(sink_id)),
                expected_version=old.version if old is not None else 0,
                error=report.errors.get(sink_id, "")))
        answer = self.control.report_batch(self.pipeline.name, self.source_id,
                                           self.pipeline.spec.commit_policy, outcomes,
                                           generation=self.generation)
        if getattr(answer, "fenced", False):
            raise FencedError(answer.reason)
        if getattr(answer, "conflict", False):
            raise FatalError(
                f"a sink checkpoint of pipeline {self.pipeline.name} was moved by someone else; "
                "is a second delivery process running for this pipeline?")
        report.policy_satisfied = answer.satisfied
        report.reason = answer.reason
        for cp in answer.checkpoints if answer.committed else []:
            self._own_versions[cp.sink_id] = cp.version
            self.last_committed[cp.sink_id] = cp
            if _moved(before.get(cp.sink_id), cp):
                report.advanced.append(cp.sink_id)

    def _generation_start(self, before: dict[str, pb.Checkpoint | None], rows: list[Any]
                          ) -> dict[int, int]:
        """Where the batch's bus generation begins, if a checkpoint is not of it yet (the
        first batch on a bus capture republished onto): from the latest epoch. Should an
        even newer generation be there already, nothing: the next query starts from that
        one's start whatever these offsets say."""
        generation = max((row["generation"] for row in rows), default=0)
        if generation == 0 or all(cp is not None and cp.bus_generation == generation
                                  for cp in before.values()):
            return {}
        latest = self.control.latest_epoch(self.source_id)
        if latest is None or latest.bus_generation != generation:
            return {}
        return dict(latest.generation_start)

    def blocking_failures(self, report: BatchReport) -> dict[str, str]:
        """The non-retryable errors of sinks the commit policy waits for (`required`: the
        required sinks; `all` and `quorum`: every sink): retrying cannot satisfy it."""
        gating = {s for s, spec in self.sinks.items()
                  if spec.required or self.pipeline.spec.commit_policy != "required"}
        return {s: report.errors[s].removeprefix(f"{cls}: ")
                for s, cls in report.error_classes.items()
                if cls == "non_retryable" and s in gating and not report.acked.get(s, True)}


def _moved(old: pb.Checkpoint | None, new: pb.Checkpoint) -> bool:
    if old is None:
        return True
    return position_key(new.position) > position_key(old.position) or \
        new.bus_generation != old.bus_generation or any(
            offset > old.bus_offsets.get(p, 0) for p, offset in new.bus_offsets.items())

