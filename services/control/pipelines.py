"""The pipeline registry: what capture and delivery registered, the operator's pause, and the
state shown to operators (paused, failed or degraded + reason from health reports, running),
with each sink's last error as delivery reported it (a running pipeline whose optional sink
fails, or whose required sink fails retryably before it turns degraded, says so in its
reason).

Capture and delivery register at start with ids and types only — never DSNs, URLs or
secrets; a value that looks like one is refused.
"""

from __future__ import annotations

import re
import time

from tailrace.logs import get_logger, redact
from tailrace.proto import control_pb2 as pb
from tailrace_services.control.checkpoints import CheckpointStore
from tailrace_services.control.health import HealthStore, describe
from tailrace_services.control.owners import DeliveryOwners
from tailrace_services.control.retention import over_limit, why_over
from tailrace_services.control.status import InvalidArgument, NotFound, require
from tailrace_services.control.storage import Storage

log = get_logger(__name__)

SINK_STARTS = ("", "earliest", "now", "snapshot")  # a sink's `start` ("": earliest); sink_start.py
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_LOOKS_SECRET = re.compile(r"://|@|=|\s")  # URLs, user@host, key=value DSNs


# Health reports that change a pipeline's state, the worst first.
_BY_SEVERITY = (((pb.HEALTH_FAILED, pb.HEALTH_POSITION_LOST), pb.PIPELINE_FAILED),
                ((pb.HEALTH_DEGRADED,), pb.PIPELINE_DEGRADED))


def failing_sinks(info: pb.PipelineInfo) -> str:
    """Why a running pipeline is not all well: `sink <id> failing (<n> batches): <error>`."""
    return "; ".join(f"sink {s.id} failing ({s.failed_batches} batch"
                     f"{'' if s.failed_batches == 1 else 'es'} in a row): {s.last_error}"
                     for s in info.sinks if s.last_error)


def _key(name: str) -> str:
    return f"pipeline::{name}"


def _pause_key(name: str) -> str:
    return f"pause::{name}"


class PipelineRegistry:
    def __init__(self, storage: Storage, health: HealthStore) -> None:
        self._storage = storage
        self._health = health
        self._owners = DeliveryOwners(storage)
        self._checkpoints = CheckpointStore(storage)

    def register(self, info: pb.PipelineInfo) -> pb.PipelineInfo:
        require(info, "name", "source_id")
        for what, value in [("name", info.name), ("source_id", info.source_id),
                            ("source_type", info.source_type), ("tenant", info.tenant),
                            *[(f"sinks[{i}]", v) for i, s in enumerate(info.sinks)
                              for v in (s.id, s.type)]]:
            if value and _LOOKS_SECRET.search(value):
                raise InvalidArgument(f"pipeline {redact(info.name)}: {what} looks like a DSN, "
                                      "URL or secret; register ids and types only")
        if not _NAME.match(info.name):
            raise InvalidArgument(f"pipeline name {info.name!r} is not valid; use letters, digits, "
                                  "'.', '_' and '-'")
        ids = [s.id for s in info.sinks]
        if not ids or "" in ids or len(set(ids)) != len(ids):
            raise InvalidArgument(f"pipeline {info.name}: sinks need unique, non-empty ids; "
                                  f"got {ids}")
        for s in info.sinks:
            if s.start not in SINK_STARTS:
                raise InvalidArgument(f"pipeline {info.name}: sink {s.id} start {s.start!r} is "
                                      f"not one of {', '.join(SINK_STARTS[1:])}")
        stored = pb.PipelineInfo()
        stored.CopyFrom(info)
        stored.tenant = info.tenant or "default"
        stored.registered_unix_ms = int(time.time() * 1000)
        stored.ClearField("state")
        stored.ClearField("reason")
        self._storage.kv_put(_key(info.name), stored.SerializeToString())
        log.info("pipeline registered", pipeline=info.name, source=info.source_id, sinks=ids)
        return self.with_state(stored)

    def get(self, name: str) -> pb.PipelineInfo | None:
        found = self._storage.kv_get(_key(name))
        return self.with_state(pb.PipelineInfo.FromString(found[0])) if found else None

    def must_get(self, name: str) -> pb.PipelineInfo:
        info = self.get(name)
        if info is None:
            known = [p.name for p in self.list()]
            raise NotFound(f"pipeline {name!r} is not registered; registered: "
                           + (", ".join(known) if known else "none (start its services first)"))
        return info

    def list(self) -> list[pb.PipelineInfo]:
        return [self.with_state(pb.PipelineInfo.FromString(v))
                for _, v, _ in self._storage.kv_scan("pipeline::")]

    def state(self, name: str) -> tuple[int, str]:
        info = self.get(name)
        if info is None:
            return pb.PIPELINE_UNKNOWN, f"pipeline {name} is not registered"
        return info.state, info.reason

    def with_state(self, info: pb.PipelineInfo) -> pb.PipelineInfo:
        """Paused (by an operator) wins; then a failure or lost position reported by the
        pipeline or its source; then degraded (delivery restarting without progress);
        otherwise running. Also says which delivery instance owns the pipeline and how much
        source log the server keeps for it (its capture's last report)."""
        owner, _ = self._owners.get(info.name)
        if owner.generation:
            info.delivery_owner.CopyFrom(owner)
        failing = self.sink_health(info.name)
        for sink in info.sinks:
            found = failing.get(sink.id, pb.SinkHealth())
            sink.last_error = found.last_error
            sink.failing_since_unix_ms = found.failing_since_unix_ms
            sink.failed_batches = found.failed_batches
            detached = self._checkpoints.detached(info.source_id, sink.id)
            if detached is not None:
                sink.detached.CopyFrom(detached)
        paused = self._pause(info.name)
        if paused is not None:
            info.state = pb.PIPELINE_PAUSED
            info.reason = paused.reason or "paused by an operator"
            return info
        source = self._health.get(info.source_id)
        if source is not None and source.HasField("retained_bytes"):
            info.retained_bytes = source.retained_bytes
            info.retained_what = source.retained_what
            info.retained_unix_ms = source.retained_unix_ms
        reports = [r for r in (self._health.get(info.name), source) if r is not None]
        for states, pipeline_state in _BY_SEVERITY:
            report = next((r for r in reports if r.state in states), None)
            if report is not None:
                info.state, info.reason = pipeline_state, describe(report)
                return info
        retention = self._retention(info, source)
        if retention:
            info.state, info.reason = pb.PIPELINE_DEGRADED, retention
            return info
        info.state, info.reason = pb.PIPELINE_RUNNING, failing_sinks(info)
        return info

    def _retention(self, info: pb.PipelineInfo, source: pb.HealthReport | None) -> str:
        """Degraded for the source's disk (retention.py): the log past its limit, or sinks
        detached for it that wait for an operator."""
        reasons = [why_over(info, source, self._checkpoints)] if source is not None and \
            over_limit(source) else []
        reasons += [f"sink {s.id} detached ({s.detached.reason}): it needs its tables again "
                    f"(tailrace attach {info.name} {s.id}, then tailrace snapshot)"
                    for s in info.sinks if s.HasField("detached")]
        return "; ".join(reasons)

    def sink_health(self, name: str) -> dict[str, pb.SinkHealth]:
        """The sinks that failed their last batch, as the pipeline's delivery reported."""
        report = self._health.get(name)
        return {s.sink_id: s for s in report.sinks if s.last_error} if report else {}

    def pause(self, name: str, reason: str) -> pb.PipelineInfo:
        self.must_get(name)
        text = redact(reason) or "paused by an operator"
        self._storage.kv_put(_pause_key(name), pb.PauseRequest(name=name, reason=text)
                             .SerializeToString())
        log.warning("pipeline paused", pipeline=name, reason=text)
        return self.must_get(name)

    def resume(self, name: str) -> pb.PipelineInfo:
        self.must_get(name)
        self._storage.kv_put(_pause_key(name), b"")  # empty: not paused
        log.warning("pipeline resumed", pipeline=name)
        return self.must_get(name)

    def _pause(self, name: str) -> pb.PauseRequest | None:
        found = self._storage.kv_get(_pause_key(name))
        return pb.PauseRequest.FromString(found[0]) if found and found[0] else None

    def is_paused(self, name: str) -> bool:
        return self._pause(name) is not None
