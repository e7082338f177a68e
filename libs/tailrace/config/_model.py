"""The validated, immutable pipeline description. Defaults live here, one place per field."""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tailrace.config._dsn import check_mysql_dsn, check_postgres_dsn
from tailrace.config._expressions import compile_expression
from tailrace.config._units import parse_duration, parse_size
from tailrace.logs import redact_mapping
from tailrace.tables import TableMatcher

_TABLE_PATTERN = re.compile(r"^[A-Za-z0-9_%*$]+\.[A-Za-z0-9_%*$]+(\.[A-Za-z0-9_%*$]+)?$")
# what `sinks/templates.render` fills in
_TEMPLATE_FIELDS = {"database", "schema", "table", "op", "source_id", "tenant"}


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_template(value: str) -> str:
    """A routing template as `str.format` will fill it: known fields only, no format specs."""
    if "$" in value:
        raise ValueError(f"{value!r}: routing templates use {{database}}, {{table}}, {{op}} "
                         "without '$' (${VAR} is environment expansion)")
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion
                  in string.Formatter().parse(value) if name is not None]
    except ValueError as e:  # an unbalanced brace
        raise ValueError(f"{value!r} is not a routing template: {e}; write fields as "
                         "{table} and a literal brace as {{ or }}") from None
    for name, spec, conversion in fields:
        if name not in _TEMPLATE_FIELDS:
            raise ValueError(f"unknown template field {{{name}}}; allowed: "
                             + ", ".join(sorted(_TEMPLATE_FIELDS)))
        if spec or conversion:
            raise ValueError(f"{{{name}}} takes no format or conversion in {value!r}; write "
                             f"{{{name}}}")
    return value


def _check_table_pattern(value: str) -> str:
    if not _TABLE_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a table pattern; use db.table, db.*, db.prefix% "
                         "or %.table")
    return value


def _check_dsn(value: SecretStr, check: Callable[[str], None]) -> SecretStr:
    """A DSN that cannot work is refused at load; the message never shows the password."""
    check(value.get_secret_value())
    return value


# Validated one by one, so an error names the item: `spec.source.tables[2]`.
TablePattern = Annotated[str, AfterValidator(_check_table_pattern)]


def _check_condition(value: str) -> str:
    compile_expression(value, boolean=True)
    return value


def _check_computed(value: str) -> str:
    compile_expression(value, boolean=False)
    return value


# Spark SQL expressions of processors, compiled at load (see _expressions.py); kept as text
Condition = Annotated[str, AfterValidator(_check_condition)]
Computed = Annotated[str, AfterValidator(_check_computed)]
Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class _ClientSettings(dict[str, str]):
    """Extra client settings passed through as they are; printed with secret values
    (`sasl.password`, `ssl.key.password`, ...) hidden."""

    def __repr__(self) -> str:
        return repr(redact_mapping(self))

    __str__ = __repr__


def _as_text(value: object) -> object:
    """librdkafka takes every setting as text: `linger.ms: 5` and `true` are written as such."""
    if not isinstance(value, dict):
        return value
    return {k: ("true" if v else "false") if isinstance(v, bool) else
            str(v) if isinstance(v, int | float) else v for k, v in value.items()}


def _not_owned(owned: dict[str, str]) -> Callable[[dict[str, str]], _ClientSettings]:
    """Refuse the settings Tailrace sets itself: a value given here would be overridden
    (or would override a guarantee)."""
    def check(value: dict[str, str]) -> _ClientSettings:
        for key in value:
            if key in owned:
                raise ValueError(f"{key} is set by Tailrace ({owned[key]}); remove it")
        return _ClientSettings(value)

    return check


_CHECKPOINT_READER = "the checkpoint reader's setting"
# librdkafka settings (SASL, TLS, ...) for the bus or a Kafka sink
BusClientSettings = Annotated[dict[str, str], BeforeValidator(_as_text), AfterValidator(
    _not_owned({"bootstrap.servers": "from bus.brokers"}))]
SinkClientSettings = Annotated[dict[str, str], BeforeValidator(_as_text), AfterValidator(
    _not_owned({
        "bootstrap.servers": "from the sink's brokers",
        "enable.idempotence": "always on: a retry never duplicates or reorders",
        "acks": "all, for no loss",
        "transactional.id": "one per pipeline, sink and bus partition",
        "message.timeout.ms": "from the sink's write timeout",
        "transaction.timeout.ms": "from the sink's write timeout",
        "group.id": _CHECKPOINT_READER, "isolation.level": _CHECKPOINT_READER,
        "enable.auto.commit": _CHECKPOINT_READER, "auto.offset.reset": _CHECKPOINT_READER,
        "enable.partition.eof": _CHECKPOINT_READER,
    }))]


class TlsSpec(_Spec):
    """Paths of PEM files. `ca`: the CA that signed the server's certificate (default: the
    system's trusted CAs); `cert` and `key`: this client's certificate, for mutual TLS."""

    ca: Annotated[str, Field(min_length=1)] | None = None  # the CA to trust (a PEM file)
    cert: Annotated[str, Field(min_length=1)] | None = None  # this client's certificate
    key: Annotated[str, Field(min_length=1)] | None = None  # its private key (with cert)

    @model_validator(mode="after")
    def _pair(self) -> TlsSpec:
        if bool(self.cert) != bool(self.key):
            raise ValueError("cert and key go together (mutual TLS); give both or neither")
        return self


class Metadata(_Spec):
    # the pipeline's name: what the CLI and the control service call it, and the default
    # bus topic, slot and publication (tailrace.<name>, tailrace_<name>)
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", max_length=100)]
    tenant: str = "default"  # stamped on every event; {tenant} in routing templates


class SnapshotSpec(_Spec):
    """How a source reads its tables' existing rows (docs/snapshots.md)."""

    # never: stream only (`tailrace snapshot` still works); initial: snapshot every selected
    # table never snapshotted, then stream; initial_only: the same, then stop (exit 0);
    # when_needed: as initial, and after a lost position take the server as it is now and
    # read every table again, without waiting for `tailrace resnapshot`
    mode: Literal["never", "initial", "initial_only", "when_needed"] = "never"
    # rows read per chunk, between a low and a high watermark written through the source's
    # log; a kill resumes at the first chunk not committed
    chunk_size: Annotated[int, Field(gt=0, le=1_000_000)] = 10_000
    # tables read at once, each by its own connection (one table: one connection, in order)
    parallelism: Annotated[int, Field(ge=1, le=16)] = 2
    # a key for a table without one of its own (schema.table, db.table on mysql: [columns]):
    # its chunks are read by it and its events, streamed and read, are keyed by it
    # (PostgreSQL: the table needs REPLICA IDENTITY FULL, MySQL/MariaDB binlog_row_image=FULL,
    # so that updates and deletes carry those columns)
    key_columns: dict[str, Annotated[list[str], Field(min_length=1)]] = {}

    @field_validator("key_columns")
    @classmethod
    def _key_columns(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for table, columns in value.items():
            if len(table.split(".")) != 2 or not all(table.split(".")) or "*" in table \
                    or "%" in table:
                raise ValueError(f"{table!r}: name one table as schema.table (no wildcards)")
            if len(set(columns)) != len(columns) or not all(columns):
                raise ValueError(f"{table}: {columns} must name each column once")
        return value
    # mysql only: the table the watermarks are written to (`db.table`; default
    # tailrace.snapshot_signal, created when missing; capture_mysql/signal_table.py)
    signal_table: Annotated[str, Field(pattern=r"^[A-Za-z0-9_$]+\.[A-Za-z0-9_$]+$")] | None = None


class _SourceBase(_Spec):
    # names the source in the control service (its identity, checkpoints, schemas);
    # keep it when the server behind it is replaced, so the change is noticed
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    dsn: SecretStr  # how to reach the server (a replication-capable user)
    tables: Annotated[list[TablePattern], Field(min_length=1)]  # the tables to capture
    # when a server's identity changed (failover, restore) and its tables' schemas differ
    # from those registered: adapt records the drift and goes on, halt stops the pipeline;
    # also when a Kafka sink's schema registry refuses a table's new schema (format avro,
    # json_schema, protobuf): adapt sends its events to the DLQ, halt stops the pipeline
    on_schema_drift: Literal["adapt", "halt"] = "adapt"
    snapshot: SnapshotSpec = SnapshotSpec()  # reading the tables' existing rows
    # how often, at most, an epoch closes after a transaction: the unit delivery plans its
    # batches by and checkpoints at (0: after every transaction); a change waits for its
    # epoch, so this much is added to its latency at most
    epoch_ms: Annotated[int, Field(ge=0)] = 100
    # events of one open transaction held in memory; past it the rest spill to disk, so a
    # 1 GB transaction needs no 1 GB of memory (PostgreSQL: as many again for the
    # transactions it streams while open, all together: stream_transactions_over)
    max_tx_memory_events: Annotated[int, Field(gt=0)] = 10_000
    # at most every so many ms, the checkpoints may move to where the source's log is while
    # the captured tables are idle and the rest of the server writes; 0: only with captured
    # changes. PostgreSQL: a transactional pg_logical_emit_message written into the captured
    # database (the slot then releases the WAL; capture_postgres/position.py); MySQL/MariaDB:
    # a binlog transaction of other tables (a restart does not need binlogs the server may
    # have purged since; capture_mysql/events.py)
    heartbeat_ms: Annotated[int, Field(ge=0)] = 0
    # the most source log (bytes: 50GiB, 500MiB) the server may keep for this pipeline;
    # past it the control service detaches the laggiest optional sink (required: false) so
    # the log is released, and says so (a required sink is never detached: the pipeline is
    # degraded instead). Measured every 10 s (capture/retained.py). None: no limit
    max_retained: Annotated[int, BeforeValidator(parse_size), Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _key_columns_selected(self) -> Self:
        matcher = TableMatcher(self.tables)
        for table in self.snapshot.key_columns:
            if not matcher.matches(*table.split(".")):
                raise ValueError(f"snapshot.key_columns names {table}, which spec.source.tables "
                                 f"({', '.join(self.tables)}) does not select")
        return self


class PostgresSourceSpec(_SourceBase):
    type: Literal["postgres"]
    slot: str | None = None          # the logical replication slot; default: tailrace_<pipeline>
    publication: str | None = None   # default: tailrace_<pipeline>
    # create the slot and the publication when missing; false: a DBA made them, and
    # capture needs no CREATE rights
    create_slot: bool = True
    # PostgreSQL's decoding memory for capture's session (its logical_decoding_work_mem): once
    # the open transactions' changes pass it, the server sends the largest to capture while
    # it is still open (pgoutput streaming), so a large transaction reaches the sinks sooner
    # after its COMMIT; capture holds each (past max_tx_memory_events, all of them together,
    # on disk) and publishes it only once it commits, dropping what rolls back; one the server
    # cannot stream yet it spills to its own disk past this. null: no streaming, every
    # transaction sent after its COMMIT (the server's own logical_decoding_work_mem, 64MB by
    # default)
    stream_transactions_over: Annotated[int, BeforeValidator(parse_size),
                                        Field(ge=64 * 1024, le=2**40)] | None = 4 * 2**20

    _dsn = field_validator("dsn")(classmethod(lambda cls, v: _check_dsn(v, check_postgres_dsn)))

    @model_validator(mode="after")
    def _no_signal_table(self) -> PostgresSourceSpec:
        if self.snapshot.signal_table is not None:
            raise ValueError("snapshot.signal_table applies to mysql sources only (PostgreSQL "
                             "writes its watermarks with pg_logical_emit_message); remove it")
        return self


class MysqlSourceSpec(_SourceBase):
    type: Literal["mysql"]
    # the replica server_id capture connects with (unique among the server's replicas);
    # default: one derived from the pipeline's name and the source id
    server_id: Annotated[int, Field(gt=0, lt=2**32)] | None = None

    _dsn = field_validator("dsn")(classmethod(lambda cls, v: _check_dsn(v, check_mysql_dsn)))


SourceSpec = Annotated[PostgresSourceSpec | MysqlSourceSpec, Field(discriminator="type")]

Envelope = Literal["native", "protobuf", "debezium", "cloudevents"]

_StartName = Literal["earliest", "now", "snapshot"]
_SINK_STARTS = get_args(_StartName)


def _check_start(value: object) -> object:
    """A sink's `start`, refused with the three choices and what each means."""
    if value in _SINK_STARTS:
        return value
    hint = " (did you mean now?)" if value in ("latest", "end", "tail") else \
        " (did you mean earliest?)" if value in ("beginning", "oldest", "start") else ""
    raise ValueError(f"{value!r} is not where a sink starts{hint}; use earliest (the oldest "
                     "position the bus holds), now (changes committed from the sink's "
                     "registration on) or snapshot (as now, its tables read first)")


SinkStart = Annotated[_StartName, BeforeValidator(_check_start)]


class _SinkBase(_Spec):
    # names the sink's checkpoint in the control service: keep it, or the sink starts over
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    # whether a batch commits only once this sink wrote it (commit_policy required); an
    # optional sink may lag, and be detached past source.max_retained. Under commit_policy
    # `all` or `quorum` every sink counts: `required: false` is refused there.
    required: bool = True
    # where the sink starts while it has no checkpoint yet (a sink added to a running
    # pipeline, or a new id); a sink that has one resumes from it whatever this says.
    # earliest: the oldest position the bus still holds; now: just after the latest epoch
    # when the pipeline is registered with the sink (capture or delivery starting with
    # this spec: every change committed from then on reaches it, none before); snapshot:
    # as now, and every table capture selected is read again, so the sink ends with each
    # row's current value — those read events reach the pipeline's other sinks too, as
    # Debezium's on-demand snapshots do (docs/snapshots.md)
    start: SinkStart = "earliest"


class RedisSinkSpec(_SinkBase):
    type: Literal["redis"]
    envelope: Envelope = "native"  # how each event is written (README: envelopes)
    url: SecretStr  # redis:// or rediss://
    stream: str = "tailrace.{database}.{table}"  # the stream each event is added to
    maxlen: Annotated[int, Field(gt=0)] | None = None  # trim each stream to about so many entries

    _tpl = field_validator("stream")(classmethod(lambda cls, v: _check_template(v)))


class SchemaRegistrySpec(_Spec):
    """A Confluent-compatible schema registry: the control service's HTTP side
    (`tailrace-control --http-port`) or any other."""

    url: Annotated[str, Field(pattern=r"^https?://[^/\s]+")]  # http(s)://host:port
    # a file holding the token sent as `Authorization: Bearer` (the control service's
    # registry takes the service token)
    token_file: Annotated[str, Field(min_length=1)] | None = None
    # user:password for basic auth (another registry; Confluent Cloud's key:secret)
    basic_auth_user_info: SecretStr | None = None

    @model_validator(mode="after")
    def _one_credential(self) -> Self:
        if self.token_file and self.basic_auth_user_info is not None:
            raise ValueError("give token_file or basic_auth_user_info, not both")
        return self


class KafkaSinkSpec(_SinkBase):
    type: Literal["kafka"]
    envelope: Envelope = "native"  # how each event is written (README: envelopes)
    brokers: str  # bootstrap servers, host:port[,host:port]
    topic: str = "cdc.{database}.{table}"  # the topic each event goes to; key: its primary key
    # write each batch and its checkpoint in one Kafka transaction: a replay after a crash
    # writes nothing twice for read_committed consumers
    exactly_once: bool = False
    checkpoint_topic: str | None = None  # default __tailrace_checkpoints (compacted)
    client_config: SinkClientSettings = {}  # extra librdkafka settings (SASL, TLS, ...)
    # envelope: debezium only, with Debezium's defaults: JsonConverter `schemas.enable`
    # (key and value as {"schema", "payload"}) and `tombstones.on.delete`
    schemas_enable: bool = True
    tombstones_on_delete: bool = True  # envelope debezium: a delete is followed by a null record
    # json: the envelope as JSON (or protobuf) text; the registry formats write Debezium's
    # change event in Confluent's wire format (magic byte, schema id, payload), its schemas
    # registered under {topic}-value and {topic}-key in schema_registry (they need envelope:
    # debezium): avro (Avro), json_schema (JSON described by a draft-07 JSON Schema),
    # protobuf (a proto3 message per table, stable field numbers; README: schema registry)
    format: Literal["json", "avro", "protobuf", "json_schema"] = "json"
    # where format avro, json_schema or protobuf registers its schemas
    schema_registry: SchemaRegistrySpec | None = None

    _tpl = field_validator("topic")(classmethod(lambda cls, v: _check_template(v)))

    @field_validator("checkpoint_topic")
    @classmethod
    def _exactly_once_only(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not info.data.get("exactly_once", True):
            raise ValueError("applies to exactly_once: true only (the checkpoint is written "
                             "in the Kafka transaction); remove it or set exactly_once: true")
        return value

    @model_validator(mode="after")
    def _format(self) -> Self:
        if self.format in ("avro", "json_schema", "protobuf"):
            if self.envelope != "debezium":
                raise ValueError(f"format {self.format} writes Debezium's change event: set "
                                 "envelope: debezium")
            if "schemas_enable" in self.model_fields_set:
                raise ValueError("schemas_enable is for format json (the schema travels in "
                                 f"the registry with format {self.format}); remove it")
            if self.schema_registry is None:
                raise ValueError(f"format {self.format} needs schema_registry: {{url: ...}}, "
                                 "the control service's HTTP side (tailrace-control "
                                 "--http-port) or another Confluent-compatible registry")
        elif self.schema_registry is not None:
            raise ValueError("schema_registry is for format avro, json_schema or protobuf; "
                             "remove it or set one of those formats")
        return self

    @field_validator("schemas_enable", "tombstones_on_delete")
    @classmethod
    def _debezium_only(cls, value: bool, info: ValidationInfo) -> bool:
        envelope = info.data.get("envelope", "debezium")
        if envelope != "debezium":
            raise ValueError(f"applies to envelope: debezium only, and this sink's envelope is "
                             f"{envelope}; remove the field or set envelope: debezium")
        return value


class NatsSinkSpec(_SinkBase):
    type: Literal["nats"]
    envelope: Envelope = "native"  # how each event is written (README: envelopes)
    url: SecretStr  # nats://, or tls:// for TLS with the system's CAs
    tls: TlsSpec | None = None      # TLS with this CA and/or a client certificate
    credentials: str | None = None  # a .creds file (user JWT and NKey seed)
    subject: str = "cdc.{database}.{table}"  # the subject each event is published on
    stream: str = "TAILRACE"  # the JetStream stream that holds the subjects (made if missing)
    # the stream's de-duplication window (raised to it if shorter): a replay within it
    # is stored once, by the event's idempotency key
    duplicate_window_s: Annotated[float, Field(gt=0)] = 120.0

    _tpl = field_validator("subject")(classmethod(lambda cls, v: _check_template(v)))


class PostgresSinkSpec(_SinkBase):
    type: Literal["postgres"]
    dsn: SecretStr  # the target database
    table: str = "{table}"  # the target table each source table's rows are upserted into
    follow_ddl: bool = False  # add columns that appear in the source to the target table
    envelope: None = None  # only to say why it is refused: rows are written, not envelopes

    _dsn = field_validator("dsn")(classmethod(lambda cls, v: _check_dsn(v, check_postgres_dsn)))

    _tpl = field_validator("table")(classmethod(lambda cls, v: _check_template(v)))

    @field_validator("envelope", mode="before")
    @classmethod
    def _no_envelope(cls, value: object) -> None:
        raise ValueError("the postgres sink writes rows into tables, not envelopes; remove "
                         "envelope")


SinkSpec = Annotated[
    RedisSinkSpec | KafkaSinkSpec | NatsSinkSpec | PostgresSinkSpec, Field(discriminator="type")
]


class BusSpec(_Spec):
    brokers: str  # the internal Kafka-protocol broker, host:port[,host:port]
    topic: str | None = None  # default: tailrace.<pipeline>
    # the bus topic's partitions, by primary key: each micro-batch gets so many Spark tasks
    # (order per key holds; a source transaction is atomic per partition)
    partitions: Annotated[int, Field(ge=1, le=1024)] = 1
    client_config: BusClientSettings = {}  # extra librdkafka settings (SASL, TLS, ...)


def control_addresses(address: str | list[str]) -> list[str]:
    """`host1:port,host2:port` (or a list): control replicas sharing one PostgreSQL storage."""
    parts = address.split(",") if isinstance(address, str) else address
    addresses = [str(part).strip() for part in parts if str(part).strip()]
    if not addresses:
        raise ValueError("no control address: give host:port, or replicas as "
                         "host1:port,host2:port")
    for one in addresses:
        host, _, port = one.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"control address {one!r} is not host:port")
    return addresses


class ControlSpec(_Spec):
    """Where the control service is and how to prove who we are. The service token comes from
    `token_file` or $TAILRACE_SERVICE_TOKEN, never from the spec itself. `address` names one
    control service, or replicas on one PostgreSQL storage (`host1:port,host2:port` or a
    list): capture and delivery go to the next when one does not answer."""

    address: str = "127.0.0.1:50051"  # host:port, or replicas host1:port,host2:port
    token_file: Annotated[str, Field(min_length=1)] | None = None  # a file holding the token
    tls: TlsSpec | None = None  # talk TLS to the control service (mutual with cert and key)

    @field_validator("address", mode="before")
    @classmethod
    def _replicas(cls, value: object) -> object:
        if isinstance(value, str | list):
            return ",".join(control_addresses(value))
        return value

    @property
    def addresses(self) -> list[str]:
        return control_addresses(self.address)

    @model_validator(mode="before")
    @classmethod
    def _no_clear_text_token(cls, data: object) -> object:
        if isinstance(data, dict) and "token" in data:
            raise ValueError("token is not accepted: a token written in the spec is clear "
                             "text; put it in a file named by token_file, or set "
                             "TAILRACE_SERVICE_TOKEN")
        return data


MIN_BATCH_MS = 100  # the shortest micro-batch interval delivery runs


class BatchSpec(_Spec):
    max_events: Annotated[int, Field(gt=0)] = 20_000  # per micro-batch and per sink write
    # per sink write; a transaction larger than the limits still goes whole, alone
    max_bytes: Annotated[int, BeforeValidator(parse_size), Field(gt=0)] = 4 * 1024 * 1024
    max_ms: int = MIN_BATCH_MS  # the micro-batch interval
    # a sink write holds whole source transactions (false: it may split one)
    respect_source_tx: bool = True
    max_inflight: int = 1  # only 1 for now: accepted so a spec written for later keeps working

    @field_validator("max_ms")
    @classmethod
    def _interval(cls, value: int) -> int:
        if value < MIN_BATCH_MS:
            raise ValueError(f"{value} ms is shorter than the shortest micro-batch interval "
                             f"delivery runs; use {MIN_BATCH_MS} or more")
        return value

    @field_validator("max_inflight")
    @classmethod
    def _one_in_flight(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"{value} is not supported yet: delivery keeps one batch in flight "
                             "per pipeline (pipelined batches are planned); set 1 or remove "
                             "the field")
        return value


class QuorumPolicy(_Spec):
    quorum: Annotated[int, Field(ge=1)]  # a batch commits once so many sinks wrote it


class FilterProcessor(_Spec):
    """Keeps the events that pass every condition given; the others are not sent."""

    type: Literal["filter"]
    where: Condition | None = None  # a Spark SQL condition on the row's columns
    # these operations only (read: a snapshot's rows)
    ops: list[Literal["insert", "update", "delete", "ddl", "truncate", "read"]] | None = None
    tables: list[TablePattern] | None = None  # these tables only


class TransformProcessor(_Spec):
    """Changes each event's row: computed columns, then dropped ones, then renamed ones."""

    type: Literal["transform"]
    set: dict[str, Computed] = {}  # column: a Spark SQL expression of the row's columns
    drop: list[str] = []  # columns to leave out (a secret, a large blob)
    rename: dict[str, str] = {}  # old name: new name


class RouteProcessor(_Spec):
    """Sends each event to the destination `to` names instead of the sink's own template."""

    type: Literal["route"]
    to: str  # a topic, stream, subject or table template

    _tpl = field_validator("to")(classmethod(lambda cls, v: _check_template(v)))


_COLUMN = Annotated[str, Field(min_length=1)]


class OutboxProcessor(_Spec):
    """Debezium's outbox event router: the inserts of the outbox `table` become messages —
    topic from `route` (`{routedByValue}` is the `route_by` column's value), key the `key`
    column, value the `payload` column as written, header `id` the `id` column, and each
    `additional_fields` column as the header it names. The outbox table's updates,
    deletes and snapshot reads are dropped (an application may delete the row in the
    same transaction); other tables' events go on unchanged."""

    type: Literal["outbox"]
    table: TablePattern  # the outbox table
    id: _COLUMN = "id"  # the column sent as header `id`
    key: _COLUMN = "aggregateid"  # the column that keys the message (order per aggregate)
    route_by: _COLUMN = "aggregatetype"  # the column whose value fills {routedByValue}
    route: Annotated[str, Field(min_length=1)] = "outbox.event.{routedByValue}"  # the topic
    payload: _COLUMN = "payload"  # the column sent as the message's value, as written
    additional_fields: dict[str, Annotated[str, Field(min_length=1)]] = {}  # column: header
    # delete each outbox row from the source once every sink of its batch acknowledged its
    # message (delivery connects with spec.source.dsn, which needs DELETE on the table; the
    # row's delete event sends nothing); PostgreSQL sources. Off: the application deletes
    # the rows itself, e.g. in the transaction that inserts them (Debezium's pattern)
    delete_delivered: bool = False

    @field_validator("route")
    @classmethod
    def _route(cls, value: str) -> str:
        try:
            fields = [(name, form, conversion) for _, name, form, conversion
                      in string.Formatter().parse(value) if name is not None]
        except ValueError as e:
            raise ValueError(f"{value!r} is not a route: {e}") from None
        shaped = [name for name, form, conversion in fields if form or conversion]
        if shaped:
            raise ValueError(f"{{{shaped[0]}}} takes no format or conversion in a route; "
                             "write {routedByValue} as it is")
        unknown = [name for name, _, _ in fields if name != "routedByValue"]
        if unknown:
            raise ValueError(f"unknown route field {{{unknown[0]}}}; the one field is "
                             "{routedByValue}, the route_by column's value (Debezium's "
                             "${routedByValue})")
        return value


ProcessorSpec = Annotated[
    FilterProcessor | TransformProcessor | RouteProcessor | OutboxProcessor,
    Field(discriminator="type")
]


class JournalSpec(_Spec):
    """The dead-letter queue: events no sink accepts wait here (`tailrace dlq`)."""

    # on: an event that fails alone (a processor's error, a value a sink refuses) goes to
    # the journal and the rest flows; off: such an event fails its batch
    enabled: bool = False
    max_entries: Annotated[int, Field(gt=0)] = 10_000  # entries kept per pipeline
    ttl: Duration = timedelta(days=7)  # how long an entry is kept: `7d`, `12h`, `30m`, ...
    # when full: drop_oldest makes room; reject refuses what does not fit, block stores what
    # fits: either way delivery retries the batch until `tailrace dlq` purges or replays
    overflow: Literal["drop_oldest", "reject", "block"] = "drop_oldest"


class Spec(_Spec):
    source: SourceSpec  # the database to capture
    sinks: Annotated[list[SinkSpec], Field(min_length=1)]  # where the changes go
    bus: BusSpec  # the internal topic between capture and delivery
    control: ControlSpec = ControlSpec()  # the control service
    processors: list[ProcessorSpec] = []  # applied in order, per batch, before the sinks
    batch: BatchSpec = BatchSpec()  # delivery's micro-batches
    # when a batch counts as delivered: required (every required sink wrote it), all, or
    # {quorum: N}
    commit_policy: Literal["required", "all"] | QuorumPolicy = "required"
    journal: JournalSpec = JournalSpec()  # the dead-letter queue

    @field_validator("sinks")
    @classmethod
    def _unique_ids(cls, sinks: list[SinkSpec]) -> list[SinkSpec]:
        ids = [s.id for s in sinks]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"sink ids must be unique; repeated: {', '.join(dupes)}")
        return sinks


class PipelineSpec(_Spec):
    """A pipeline: one source, its sinks, and how changes get from one to the others."""

    apiVersion: Literal["tailrace/v1"]  # noqa: N815 - the YAML field name
    kind: Literal["Pipeline"]  # with apiVersion: what this file is
    metadata: Metadata  # its name and tenant
    spec: Spec  # what it does

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def tenant(self) -> str:
        return self.metadata.tenant

    @property
    def bus_topic(self) -> str:
        return self.spec.bus.topic or f"tailrace.{self.metadata.name}"
