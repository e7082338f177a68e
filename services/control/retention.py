"""The source's disk is safe (DESIGN guarantee 13): past `source.max_retained`, the laggiest
optional sink stops holding the source's log back.

Capture measures the log its server keeps for the pipeline every few seconds and reports it
with its limit (`HealthReport.retained_bytes`, `max_retained_bytes`). Over the limit:
1. the least advanced sink not detached is the one that holds the log (`holder`);
2. an optional sink (`required: false` under commit policy `required`) that is not the
   pipeline's last attached one is detached: minimum checkpoints leave it out, so capture's
   next confirmation releases the log; delivery writes nothing more to it; a reconcile
   record and an error log say so, and the pipeline is `degraded` until an operator attaches
   it again (`tailrace attach`, then a snapshot);
3. a required sink (or every sink, under `all` or `quorum`) is never detached: the pipeline
   is `degraded` with the reason and `tailrace_control_retained_over_limit` is 1 (alert).
One sink per report: the next one, measured after the log was released, says whether
another must go.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from tailrace.events import position_key
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace_services.control.checkpoints import CheckpointStore
from tailrace_services.control.identities import IdentityStore

if TYPE_CHECKING:
    from tailrace_services.control.pipelines import PipelineRegistry

log = get_logger(__name__)

OVER_LIMIT = Gauge("tailrace_control_retained_over_limit",
                   "1 while a pipeline's source log is past source.max_retained and no sink "
                   "can be detached (a required sink holds it back)", ["pipeline"])
DETACHED = Counter("tailrace_control_sinks_detached",
                   "Optional sinks detached for holding the source log past max_retained",
                   ["pipeline", "sink"])


def size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def over_limit(report: pb.HealthReport | None) -> bool:
    return report is not None and report.HasField("max_retained_bytes") and \
        report.HasField("retained_bytes") and report.retained_bytes > report.max_retained_bytes


def detachable(info: pb.PipelineInfo, sink: pb.SinkInfo) -> bool:
    """Only an optional sink, and only where the commit policy lets sinks fall behind."""
    return not sink.required and info.commit_policy.kind == pb.POLICY_REQUIRED


def holder(info: pb.PipelineInfo, checkpoints: CheckpointStore
           ) -> tuple[pb.SinkInfo, pb.Checkpoint | None] | None:
    """The attached sink whose checkpoint is least advanced, which holds the log back (a
    sink with no checkpoint yet holds all of it); None when every sink is detached."""
    found = [(sink, checkpoints.get(info.source_id, sink.id)) for sink in info.sinks
             if checkpoints.detached(info.source_id, sink.id) is None]
    return min(found, key=lambda f: position_key(f[1].position) if f[1] else (-1, -1),
               default=None)


def why_over(info: pb.PipelineInfo, report: pb.HealthReport, checkpoints: CheckpointStore
             ) -> str:
    """The pipeline's reason while its source log is past the limit."""
    text = (f"source log kept {size(report.retained_bytes)} ({report.retained_what}) is past "
            f"source.max_retained {size(report.max_retained_bytes)}")
    held = holder(info, checkpoints)
    if held is None:
        return text
    sink, cp = held
    if detachable(info, sink):
        return f"{text}; optional sink {sink.id} is being detached"
    at = f"at tx {cp.position.tx_seq}" if cp is not None else "with no checkpoint yet"
    return (f"{text}: required sink {sink.id} holds it back {at}; required sinks are never "
            "detached: make it acknowledge again, or raise the limit")


class RetentionGuard:
    def __init__(self, pipelines: PipelineRegistry, checkpoints: CheckpointStore,
                 identities: IdentityStore) -> None:
        self._pipelines = pipelines
        self._checkpoints = checkpoints
        self._identities = identities

    def judge(self, report: pb.HealthReport) -> pb.ReportHealthResponse:
        """A source's retained-log report against its limit, for each of its pipelines."""
        answer = pb.ReportHealthResponse()
        if not report.HasField("retained_bytes"):
            return answer
        for info in self._pipelines.list():
            if info.source_id != report.subject_id:
                continue
            if not over_limit(report):
                OVER_LIMIT.labels(info.name).set(0)
                continue
            held = holder(info, self._checkpoints)
            attached = [s for s in info.sinks
                        if self._checkpoints.detached(info.source_id, s.id) is None]
            if held is None or not detachable(info, held[0]) or len(attached) < 2:
                OVER_LIMIT.labels(info.name).set(1)
                answer.over_limit = why_over(info, report, self._checkpoints)
                log.error("source log past max_retained; no sink can be detached",
                          pipeline=info.name, reason=answer.over_limit)
                continue
            OVER_LIMIT.labels(info.name).set(0)
            answer.detached.append(self._detach(info, held[0], held[1], report))
        return answer

    def _detach(self, info: pb.PipelineInfo, sink: pb.SinkInfo, cp: pb.Checkpoint | None,
                report: pb.HealthReport) -> pb.SinkDetached:
        at = f"at tx {cp.position.tx_seq}" if cp is not None else "with no checkpoint yet"
        reason = (f"it held {size(report.retained_bytes)} of source log "
                  f"({report.retained_what}) past source.max_retained "
                  f"{size(report.max_retained_bytes)}, {at}")
        record = pb.SinkDetached(pipeline=info.name, source_id=info.source_id, sink_id=sink.id,
                                 reason=reason, retained_bytes=report.retained_bytes,
                                 ts_unix_ms=int(time.time() * 1000), checkpoint=cp)
        self._checkpoints.detach(record)
        DETACHED.labels(info.name, sink.id).inc()
        self._identities.add_reconcile(pb.ReconcileRecord(
            source_id=info.source_id, decision=f"detach sink {sink.id}",
            drift=[f"pipeline {info.name}: optional sink {sink.id} detached: {reason}",
                   "it receives nothing more and needs its tables again: tailrace pause, "
                   f"tailrace attach {info.name} {sink.id} --confirm {sink.id}, tailrace "
                   "resume, then tailrace snapshot"]))
        log.error("optional sink detached: it held the source log past max_retained; it "
                  "needs a re-snapshot", pipeline=info.name, sink=sink.id, reason=reason)
        return record
