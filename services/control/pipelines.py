"""The pipeline registry: what capture and delivery registered, the operator's pause, and the
state shown to operators (paused, failed + reason from health reports, running).

Capture and delivery register at start with ids and types only — never DSNs, URLs or
secrets; a value that looks like one is refused.
"""

from __future__ import annotations

import re
import time

from tailrace.logs import get_logger, redact
from tailrace.proto import control_pb2 as pb
from tailrace_services.control.health import HealthStore, describe
from tailrace_services.control.owners import DeliveryOwners
from tailrace_services.control.status import InvalidArgument, NotFound, require
from tailrace_services.control.storage import Storage

log = get_logger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_LOOKS_SECRET = re.compile(r"://|@|=|\s")  # URLs, user@host, key=value DSNs


def _key(name: str) -> str:
    return f"pipeline::{name}"


def _pause_key(name: str) -> str:
    return f"pause::{name}"


class PipelineRegistry:
    def __init__(self, storage: Storage, health: HealthStore) -> None:
        self._storage = storage
        self._health = health
        self._owners = DeliveryOwners(storage)

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
        pipeline or its source; otherwise running. Also says which delivery instance owns
        the pipeline."""
        owner, _ = self._owners.get(info.name)
        if owner.generation:
            info.delivery_owner.CopyFrom(owner)
        paused = self._pause(info.name)
        if paused is not None:
            info.state = pb.PIPELINE_PAUSED
            info.reason = paused.reason or "paused by an operator"
            return info
        for subject in (info.name, info.source_id):
            report = self._health.get(subject)
            if report is not None and report.state in (pb.HEALTH_FAILED, pb.HEALTH_POSITION_LOST):
                info.state = pb.PIPELINE_FAILED
                info.reason = describe(report)
                return info
        info.state, info.reason = pb.PIPELINE_RUNNING, ""
        return info

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
