"""The audit log: every accepted call that changes state — who, when, which RPC and what.

Records live in the control storage, one log per caller role (`admin`, `service`, and
`none` when the service runs with `--insecure-no-auth`), each trimmed to the newest
`keep` records: the steady stream of service calls (epochs, batch reports) never pushes
an operator's action out. A summary names what the call was about (pipeline, sink,
position, ...) from the request's fields; row data (dead-letter events), schemas and
server attributes are left out, and free text goes through `redact`.
"""

from __future__ import annotations

import builtins
import time
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from tailrace.logs import redact
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.status import InvalidArgument
from tailrace_services.control.storage import Storage

ROLES = ("admin", "service", "none")
DEFAULT_KEEP = 10_000
SUMMARY_MAX = 400
# request fields never summarized: row data, schema text, server attributes, long lists
_SKIPPED = frozenset({"event", "entries", "schema_json", "attributes", "drift", "old_identity",
                      "new_identity", "text"})  # text: a spec, maybe with literal secrets


def _log_name(role: str) -> str:
    return f"audit::{role}"


class AuditLog:
    """Append and list audit records; each role's log keeps the newest `keep` records (plus
    at most a tenth more until the next trim)."""

    def __init__(self, storage: Storage, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"--audit-keep must be at least 1, got {keep}")
        self._storage = storage
        self.keep = keep
        self._trim_every = max(1, min(1000, keep // 10))

    def append(self, record: pb.AuditRecord) -> int:
        role = record.role if record.role in ROLES else "none"
        now_ns = time.time_ns()
        record.ts_unix_ns = record.ts_unix_ns or now_ns
        record.ts_unix_ms = record.ts_unix_ms or now_ns // 1_000_000
        seq = self._storage.log_append(_log_name(role), record.SerializeToString())
        if seq > self.keep and seq % self._trim_every == 0:
            self._storage.log_truncate(_log_name(role), seq - self.keep)
        return seq

    def list(self, role: str = "", pipeline: str = "", limit: int = 100) -> list[pb.AuditRecord]:
        """The newest `limit` records (of one role and pipeline, when given), oldest first."""
        if role and role not in ROLES:
            raise InvalidArgument(f"audit role {role!r} is unknown; use one of "
                                  f"{', '.join(ROLES)} or leave it empty for all")
        found: list[pb.AuditRecord] = []
        for name in [role] if role else ROLES:
            for record in self._read(name):
                if not pipeline or record.pipeline == pipeline:
                    found.append(record)
        # in the order the calls were accepted: one role's log is in order by itself, and
        # records of two roles in the same millisecond are told apart by the nanoseconds
        found.sort(key=lambda r: (r.ts_unix_ns or r.ts_unix_ms * 1_000_000, r.role, r.sequence))
        return found[-limit:]

    def _read(self, role: str) -> builtins.list[pb.AuditRecord]:  # `list` is a method here
        out: list[pb.AuditRecord] = []
        after = 0
        while True:
            page = self._storage.log_read(_log_name(role), after=after, limit=1000)
            for seq, value in page:
                record = pb.AuditRecord.FromString(value)
                record.sequence = seq
                out.append(record)
            if len(page) < 1000:
                return out
            after = page[-1][0]


def pipeline_of(request: Message) -> str:
    """The pipeline a request is about, when it names one."""
    value: Any = getattr(request, "pipeline", None)  # a string field in the requests that have it
    if isinstance(value, str):
        return value
    if isinstance(request, pb.PipelineRef | pb.PauseRequest | pb.PipelineInfo |
                  pb.DeleteSpecRequest | pb.SpecRef):
        return request.name
    if isinstance(request, pb.ApplySpecRequest):
        from tailrace_services.control.specs import spec_name

        return spec_name(request.text)
    if isinstance(request, pb.CommitCheckpointRequest):
        return request.checkpoint.pipeline
    return ""


def summarize(request: Message) -> str:
    """`name=orders reason=maintenance`: the request's set fields, short and without secrets."""
    text = " ".join(_fields(request, depth=0))
    text = redact(text)
    return text if len(text) <= SUMMARY_MAX else text[:SUMMARY_MAX - 1] + "…"


def _fields(message: Message, depth: int) -> list[str]:
    parts: list[str] = []
    for fd, value in message.ListFields():
        if fd.name in _SKIPPED:
            if _repeated(fd):
                parts.append(f"{fd.name}={len(value)}")
            continue
        parts.append(f"{fd.name}={_value(fd, value, depth)}")
    return parts


def _value(fd: FieldDescriptor, value: Any, depth: int) -> str:
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        items = sorted(value.items())
        shown = ",".join(f"{k}:{_scalar(fd.message_type.fields_by_name['value'], v)}"
                         for k, v in items[:8])
        return "{" + shown + (",…" if len(items) > 8 else "") + "}"
    if _repeated(fd):
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            return "[" + ",".join(_scalar(fd, v) for v in list(value)[:8]) + "]"
        ids = [getattr(v, "sink_id", "") or getattr(v, "id", "") for v in value]
        return "[" + ",".join(ids[:8]) + "]" if all(ids) else str(len(value))
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        return "{" + " ".join(_fields(value, depth + 1)) + "}" if depth < 2 else "{…}"
    return _scalar(fd, value)


def _repeated(fd: FieldDescriptor) -> bool:
    flag = getattr(fd, "is_repeated", None)  # protobuf >= 6; `label` before
    return bool(flag) if flag is not None else fd.label == FieldDescriptor.LABEL_REPEATED


def _scalar(fd: FieldDescriptor, value: Any) -> str:
    if fd.type == FieldDescriptor.TYPE_ENUM:
        named = fd.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return f"<{len(value)} bytes>"
    if isinstance(value, str):
        shown = value if len(value) <= 80 else value[:79] + "…"
        return repr(shown) if " " in shown or not shown else shown
    return str(value)


class AuditServicer(rpc.AuditServicer):
    def __init__(self, log: AuditLog) -> None:
        self._log = log

    def List(self, request: pb.ListAuditRequest, context: grpc.ServicerContext
             ) -> pb.ListAuditResponse:
        return pb.ListAuditResponse(records=self._log.list(
            request.role, request.pipeline, request.limit or 100))
