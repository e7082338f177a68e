"""Health reports of sources and pipelines: what capture and delivery say about themselves.

The control service's own `/health` is 503 while any source lost its position or any
pipeline failed or is degraded (restarting without progress), with that reason; the admin
API shows a pipeline's state from them.
"""

from __future__ import annotations

import builtins
import time

from tailrace.logs import get_logger, redact
from tailrace.proto import control_pb2 as pb
from tailrace_services.control.storage import Storage

log = get_logger(__name__)

STATE_NAMES = {pb.HEALTH_RUNNING: "running", pb.HEALTH_POSITION_LOST: "position_lost",
               pb.HEALTH_FAILED: "failed", pb.HEALTH_PAUSED: "paused",
               pb.HEALTH_DEGRADED: "degraded"}
UNHEALTHY = (pb.HEALTH_POSITION_LOST, pb.HEALTH_FAILED, pb.HEALTH_DEGRADED)


def describe(report: pb.HealthReport) -> str:
    """`subject: state: reason`, without repeating a state the reason already starts with."""
    state = STATE_NAMES.get(report.state, "unspecified").replace("_", " ")
    if not report.reason:
        return f"{report.subject_id}: {state}"
    if report.reason.lower().startswith(state):
        return f"{report.subject_id}: {report.reason}"
    return f"{report.subject_id}: {state}: {report.reason}"


def _key(subject_id: str) -> str:
    return f"health::{subject_id}"


class HealthStore:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def report(self, report: pb.HealthReport) -> pb.HealthReport:
        stored = pb.HealthReport()
        stored.CopyFrom(report)
        stored.reason = redact(report.reason)[:2000]
        for sink in stored.sinks:
            sink.last_error = redact(sink.last_error)[:1000]
        stored.ts_unix_ms = stored.ts_unix_ms or int(time.time() * 1000)
        previous = self.get(report.subject_id)
        if stored.state == pb.HEALTH_UNSPECIFIED and previous is not None:  # a measurement
            stored.state, stored.reason = previous.state, previous.reason  # only: the state
            stored.sinks.extend(previous.sinks)  # stays as reported
        if stored.HasField("retained_bytes"):
            stored.retained_unix_ms = stored.retained_unix_ms or stored.ts_unix_ms
        elif previous is not None and previous.HasField("retained_bytes"):  # kept until
            stored.retained_bytes = previous.retained_bytes  # the next measurement
            stored.retained_what = previous.retained_what
            stored.retained_unix_ms = previous.retained_unix_ms
        self._storage.kv_put(_key(report.subject_id), stored.SerializeToString())
        if stored.state != pb.HEALTH_UNSPECIFIED and (previous is None or
                                                      previous.state != stored.state):
            log_fn = log.error if stored.state in UNHEALTHY else log.info
            log_fn("health changed", subject=stored.subject_id,
                   state=STATE_NAMES.get(stored.state, "unspecified"), reason=stored.reason)
        return stored

    def get(self, subject_id: str) -> pb.HealthReport | None:
        found = self._storage.kv_get(_key(subject_id))
        return pb.HealthReport.FromString(found[0]) if found else None

    def list(self) -> list[pb.HealthReport]:
        return [pb.HealthReport.FromString(v) for _, v, _ in self._storage.kv_scan("health::")]

    def problems(self) -> builtins.list[pb.HealthReport]:  # `list` is a method here
        """Reports that make the control service unhealthy: a lost position, a failure, a
        pipeline that restarts without progress."""
        return [r for r in self.list() if r.state in UNHEALTHY]

    def check(self) -> tuple[bool, str]:
        """For `/health`: (ok, reason)."""
        problems = self.problems()
        if not problems:
            return True, "ok"
        return False, "; ".join(describe(r) for r in problems)
