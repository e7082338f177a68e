"""The validated, immutable pipeline description. Defaults live here, one place per field."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

_TABLE_PATTERN = re.compile(r"^[A-Za-z0-9_%*$]+\.[A-Za-z0-9_%*$]+(\.[A-Za-z0-9_%*$]+)?$")
_TEMPLATE_FIELDS = {"database", "schema", "table", "op", "source_id", "tenant", "pipeline"}


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_template(value: str) -> str:
    if "$" in value:
        raise ValueError(f"{value!r}: routing templates use {{database}}, {{table}}, {{op}} "
                         "without '$' (${VAR} is environment expansion)")
    for name in re.findall(r"\{([^}]*)\}", value):
        if name not in _TEMPLATE_FIELDS:
            raise ValueError(f"unknown template field {{{name}}}; allowed: "
                             + ", ".join(sorted(_TEMPLATE_FIELDS)))
    return value


class Metadata(_Spec):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=100)]
    tenant: str = "default"


class SnapshotSpec(_Spec):
    mode: Literal["never", "initial"] = "never"
    chunk_size: Annotated[int, Field(gt=0)] = 10_000


class _SourceBase(_Spec):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    dsn: SecretStr
    tables: Annotated[list[str], Field(min_length=1)]
    on_schema_drift: Literal["adapt", "halt"] = "adapt"
    snapshot: SnapshotSpec = SnapshotSpec()
    epoch_ms: Annotated[int, Field(ge=0)] = 200
    max_tx_memory_events: Annotated[int, Field(gt=0)] = 10_000

    @field_validator("tables")
    @classmethod
    def _patterns(cls, tables: list[str]) -> list[str]:
        for t in tables:
            if not _TABLE_PATTERN.match(t):
                raise ValueError(f"{t!r} is not a table pattern; use db.table, db.*, "
                                 "db.prefix% or %.table")
        return tables


class PostgresSourceSpec(_SourceBase):
    type: Literal["postgres"]
    slot: str | None = None          # default: tailrace_<pipeline>
    publication: str | None = None   # default: tailrace_<pipeline>
    create_slot: bool = True


class MysqlSourceSpec(_SourceBase):
    type: Literal["mysql"]
    server_id: Annotated[int, Field(gt=0, lt=2**32)] | None = None


SourceSpec = Annotated[PostgresSourceSpec | MysqlSourceSpec, Field(discriminator="type")]

Envelope = Literal["native", "protobuf", "debezium", "cloudevents"]


class _SinkBase(_Spec):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    required: bool = True
    envelope: Envelope = "native"


class RedisSinkSpec(_SinkBase):
    type: Literal["redis"]
    url: SecretStr
    stream: str = "tailrace.{database}.{table}"
    maxlen: Annotated[int, Field(gt=0)] | None = None

    _tpl = field_validator("stream")(classmethod(lambda cls, v: _check_template(v)))


class KafkaSinkSpec(_SinkBase):
    type: Literal["kafka"]
    brokers: str
    topic: str = "cdc.{database}.{table}"
    exactly_once: bool = False
    checkpoint_topic: str | None = None  # default __tailrace_checkpoints (compacted)
    client_config: dict[str, str] = {}   # extra librdkafka settings (SASL, TLS, ...)

    _tpl = field_validator("topic")(classmethod(lambda cls, v: _check_template(v)))


class NatsSinkSpec(_SinkBase):
    type: Literal["nats"]
    url: SecretStr
    subject: str = "cdc.{database}.{table}"
    stream: str = "TAILRACE"
    duplicate_window_s: Annotated[float, Field(gt=0)] = 120.0

    _tpl = field_validator("subject")(classmethod(lambda cls, v: _check_template(v)))


class PostgresSinkSpec(_SinkBase):
    type: Literal["postgres"]
    dsn: SecretStr
    table: str = "{table}"
    follow_ddl: bool = False  # add columns that appear in the source to the target table

    _tpl = field_validator("table")(classmethod(lambda cls, v: _check_template(v)))


SinkSpec = Annotated[
    RedisSinkSpec | KafkaSinkSpec | NatsSinkSpec | PostgresSinkSpec, Field(discriminator="type")
]


class BusSpec(_Spec):
    brokers: str
    topic: str | None = None  # default: tailrace.<pipeline>
    partitions: Annotated[int, Field(ge=1, le=1024)] = 1


class ControlSpec(_Spec):
    address: str = "127.0.0.1:50051"
    token: SecretStr | None = None


class BatchSpec(_Spec):
    max_events: Annotated[int, Field(gt=0)] = 2000
    max_bytes: Annotated[int, Field(gt=0)] = 4 * 1024 * 1024
    max_ms: Annotated[int, Field(ge=0)] = 100
    respect_source_tx: bool = True
    max_inflight: Annotated[int, Field(ge=1)] = 1

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _size(cls, v: object) -> object:
        if isinstance(v, str):
            m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B|B)?\s*", v)
            if not m:
                raise ValueError(f"{v!r} is not a size; use bytes or e.g. 512KiB, 4MiB")
            unit = (m.group(2) or "B").replace("i", "")
            return int(m.group(1)) * {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}[unit]
        return v


class QuorumPolicy(_Spec):
    quorum: Annotated[int, Field(ge=1)]


class FilterProcessor(_Spec):
    type: Literal["filter"]
    where: str | None = None
    ops: list[Literal["insert", "update", "delete", "ddl", "truncate", "read"]] | None = None
    tables: list[str] | None = None


class TransformProcessor(_Spec):
    type: Literal["transform"]
    set: dict[str, str] = {}
    drop: list[str] = []
    rename: dict[str, str] = {}


class RouteProcessor(_Spec):
    type: Literal["route"]
    to: str

    _tpl = field_validator("to")(classmethod(lambda cls, v: _check_template(v)))


ProcessorSpec = Annotated[
    FilterProcessor | TransformProcessor | RouteProcessor, Field(discriminator="type")
]


class JournalSpec(_Spec):
    enabled: bool = False
    max_entries: Annotated[int, Field(gt=0)] = 10_000
    ttl: str = "7d"
    overflow: Literal["drop_oldest", "reject", "block"] = "drop_oldest"


class Spec(_Spec):
    source: SourceSpec
    sinks: Annotated[list[SinkSpec], Field(min_length=1)]
    bus: BusSpec
    control: ControlSpec = ControlSpec()
    processors: list[ProcessorSpec] = []
    batch: BatchSpec = BatchSpec()
    commit_policy: Literal["required", "all"] | QuorumPolicy = "required"
    journal: JournalSpec = JournalSpec()

    @field_validator("sinks")
    @classmethod
    def _unique_ids(cls, sinks: list[SinkSpec]) -> list[SinkSpec]:
        ids = [s.id for s in sinks]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"sink ids must be unique; repeated: {', '.join(dupes)}")
        return sinks


class PipelineSpec(_Spec):
    apiVersion: Literal["tailrace/v1"]  # noqa: N815 - the YAML field name
    kind: Literal["Pipeline"]
    metadata: Metadata
    spec: Spec

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def tenant(self) -> str:
        return self.metadata.tenant

    @property
    def bus_topic(self) -> str:
        return self.spec.bus.topic or f"tailrace.{self.metadata.name}"
