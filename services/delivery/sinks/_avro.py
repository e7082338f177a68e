"""The Kafka sink's `format: avro`: Debezium's change event in Avro, in Confluent's wire
format (magic byte 0, the schema's 4-byte id, the Avro body), its schemas registered in a
Confluent-compatible registry (the control service's own, or another) under
`{topic}-value` and `{topic}-key`, as Confluent's `AvroSerializer` does.

Each column's Avro type comes from its source type, never from a value, so a NULL does
not change a schema:

| source | Avro |
|---|---|
| boolean | `boolean` |
| smallint, integer, tinyint/smallint/mediumint/int (signed), year | `int` |
| bigint, int unsigned, mediumint unsigned | `long` |
| bigint unsigned | `decimal(20,0)` |
| numeric(p,s), decimal(p,s) | `bytes` with logical type `decimal(p,s)`: exact |
| numeric without a precision | `string`, exact text (Avro's decimal needs one) |
| real, float | `float`; double precision, double: `double` |
| timestamp with time zone, MySQL timestamp | `long` `timestamp-micros` (UTC) |
| timestamp without time zone, datetime | `long` `local-timestamp-micros` |
| date | `int` `date`; time: `long` `time-micros` |
| uuid | `string` `uuid`; json, jsonb: `string` (`connect.name` io.debezium.data.Json) |
| bytea, blobs, binary | `bytes` |
| arrays | `array` of the element's type, items nullable |
| everything else (text, varchar, enum, set, inet, ...) | `string` |

Key columns are not nullable; every other column is `["null", T]` with default null, so a
column added later is a BACKWARD-compatible new version. A PostgreSQL TOAST value the
server did not send (unchanged, not NULL) is Debezium's placeholder
`__debezium_unavailable_value` in a string or bytes column; in a column of another type it
cannot be told from NULL, so that event fails alone (to the DLQ with the journal on): set
REPLICA IDENTITY FULL on such a table. DDL events are not written (the registry's new
version records the change); a TRUNCATE is Debezium's `op: t` with no row.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import urllib.error
import urllib.request
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from io import BytesIO
from typing import Any
from urllib.parse import quote

import fastavro

from tailrace.config import KafkaSinkSpec
from tailrace.envelopes import (
    UNAVAILABLE,
    Record,
    as_op,
    changes_key,
    debezium_connector,
    debezium_op,
    debezium_source,
    debezium_source_fields,
    debezium_transaction,
)
from tailrace.errors import ConfigError, NonRetryableError, RetryableError
from tailrace.events import ChangeEvent, Column, Op, Value, json_of, key_values
from tailrace.logs import get_logger, redact

log = get_logger(__name__)

CONTENT_TYPE = "application/vnd.confluent.avro"
_MAGIC = b"\x00"

Converter = Callable[[Value], Any]


class RegistryRefused(Exception):
    """The registry refused a schema (incompatible, invalid): the event cannot be written."""


class SchemaRegistryClient:
    """Registers schemas over Confluent's REST API; a schema's id is cached per process."""

    def __init__(self, url: str, *, token: str | None = None, basic: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        elif basic:
            self._headers["Authorization"] = "Basic " + base64.b64encode(basic.encode()).decode()
        self._timeout_s = timeout_s
        self._ids: dict[tuple[str, str], int] = {}

    def register(self, subject: str, schema: str) -> int:
        cached = self._ids.get((subject, schema))
        if cached is not None:
            return cached
        body = json.dumps({"schema": schema}).encode()
        request = urllib.request.Request(
            f"{self.url}/subjects/{quote(subject, safe='')}/versions",
            data=body, headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as answer:
                schema_id = int(json.loads(answer.read())["id"])
        except urllib.error.HTTPError as e:
            detail = _detail(e)
            if e.code in (401, 403):
                raise NonRetryableError(f"schema registry {self.url} refused the sink's "
                                        f"credentials ({e.code}: {detail}); check "
                                        "schema_registry.token_file or basic_auth_user_info"
                                        ) from None
            if e.code in (409, 422):
                raise RegistryRefused(f"schema registry {self.url} refused the schema of "
                                      f"subject {subject} ({e.code}: {detail})") from None
            raise RetryableError(f"schema registry {self.url}: {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            raise RetryableError(f"schema registry {self.url} unreachable: "
                                 f"{redact(str(getattr(e, 'reason', e)))}") from None
        if (subject, schema) not in self._ids:
            log.info("avro schema registered", subject=subject, id=schema_id)
        self._ids[(subject, schema)] = schema_id
        return schema_id


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(error.read()).get("message", ""))
    except (ValueError, OSError):
        return error.reason


def registry_client(spec: KafkaSinkSpec) -> SchemaRegistryClient:
    registry = spec.schema_registry
    if registry is None:
        raise ConfigError(f"kafka sink {spec.id}: format avro needs schema_registry.url")
    token = None
    if registry.token_file:
        try:
            with open(registry.token_file) as f:
                token = f.readline().strip()
        except OSError as e:
            raise ConfigError(f"kafka sink {spec.id}: schema_registry.token_file "
                              f"{registry.token_file}: {e.strerror}") from None
    basic = registry.basic_auth_user_info.get_secret_value() \
        if registry.basic_auth_user_info else None
    return SchemaRegistryClient(registry.url, token=token, basic=basic)


# -- names and types -------------------------------------------------------------------

def avro_name(text: str) -> str:
    """An Avro name: letters, digits and _, not starting with a digit."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text) or "_"
    return f"_{name}" if name[0].isdigit() else name


def _namespace(event: ChangeEvent) -> str:
    return ".".join(avro_name(p) for p in (event.source_id, event.database, event.schema,
                                            event.table) if p)


_DECIMAL = re.compile(r"^(?:numeric|decimal)\s*\((\d+)\s*,\s*(\d+)\)")
_DECIMAL_P = re.compile(r"^(?:numeric|decimal)\s*\((\d+)\)")
_INT = re.compile(r"^(smallint|integer|int2|int4|tinyint|mediumint|int|year|smallserial|serial)"
                  r"\b(?!.*unsigned)")
_LONG = re.compile(r"^(bigint|int8|bigserial)\b(?!.*unsigned)|^(tinyint|smallint|mediumint|int|"
                   r"integer)\b.*unsigned")


def avro_type(source_type: str) -> dict[str, Any]:
    """The Avro type of a column of `source_type` (this module's table)."""
    t = source_type.strip().lower()
    if t.endswith("[]"):
        return {"type": "array", "items": ["null", avro_type(t[:-2])]}
    if t in ("boolean", "bool"):
        return {"type": "boolean"}
    if _INT.match(t):
        return {"type": "int"}
    if _LONG.match(t):
        return {"type": "long"}
    if t.startswith("bigint") and "unsigned" in t:
        return _decimal(20, 0)
    if m := _DECIMAL.match(t):
        return _decimal(int(m.group(1)), int(m.group(2)))
    if m := _DECIMAL_P.match(t):
        return _decimal(int(m.group(1)), 0)
    if t.startswith(("real", "float4")) or t == "float":
        return {"type": "float"}
    if t.startswith(("double", "float8")):
        return {"type": "double"}
    if t.startswith("timestamp") and ("with time zone" in t or t.startswith("timestamptz")):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if t.startswith("timestamp") and "time zone" not in t:
        # MySQL's timestamp (UTC); PostgreSQL names its own with or without time zone
        return {"type": "long", "logicalType": "timestamp-micros"}
    if t.startswith(("timestamp", "datetime")):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if t == "date":
        return {"type": "int", "logicalType": "date"}
    if t.startswith("time") and "with time zone" not in t:
        return {"type": "long", "logicalType": "time-micros"}
    if t == "uuid":
        return {"type": "string", "logicalType": "uuid"}
    if t in ("json", "jsonb"):
        return {"type": "string", "connect.name": "io.debezium.data.Json"}
    if t == "bytea" or t.endswith("blob") or t.startswith(("binary", "varbinary")):
        return {"type": "bytes"}
    return {"type": "string"}


def _decimal(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


def converter(avro: dict[str, Any], column: str) -> Converter:
    """Value -> the datum fastavro writes for `avro`; a value that does not fit raises
    ValueError naming the column."""
    kind_of = avro["type"]
    logical = avro.get("logicalType")
    if kind_of == "array":
        item = converter(avro["items"][1], f"{column}[]")
        return lambda v: [None if i.WhichOneof("kind") in (None, "null") else item(i)
                          for i in v.array_value.items]
    if logical == "decimal":
        quantum = Decimal(1).scaleb(-avro["scale"])

        def decimal(v: Value) -> Decimal:
            text = v.decimal_value if v.WhichOneof("kind") == "decimal_value" else str(json_of(v))
            try:
                number = Decimal(text).quantize(quantum)
            except InvalidOperation:
                raise ValueError(f"column {column}: {text!r} is not a number Avro's "
                                 f"decimal({avro['precision']},{avro['scale']}) can hold"
                                 ) from None
            if not number.is_finite():
                raise ValueError(f"column {column}: {text} has no Avro decimal form")
            return number
        return decimal
    if logical in ("timestamp-micros", "local-timestamp-micros"):
        return lambda v: v.timestamp_value.epoch_micros
    if logical == "date":
        return lambda v: v.date_value
    if logical == "time-micros":
        return lambda v: v.time_value
    if kind_of == "boolean":
        return lambda v: v.bool_value
    if kind_of in ("int", "long"):
        return lambda v: v.uint_value if v.WhichOneof("kind") == "uint_value" else v.int_value
    if kind_of in ("float", "double"):
        return lambda v: v.float_value
    if kind_of == "bytes":
        return lambda v: v.bytes_value if v.WhichOneof("kind") == "bytes_value" \
            else str(json_of(v)).encode()
    return _text


def _text(v: Value) -> str:
    kind = v.WhichOneof("kind")
    if kind in ("text_value", "json_value", "uuid_value", "decimal_value"):
        return str(getattr(v, kind))
    shown = json_of(v)
    return shown if isinstance(shown, str) else json.dumps(shown)


def _datum(column: Column, avro: dict[str, Any], convert: Converter) -> Any:
    kind = column.value.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    if kind == "unchanged_toast":
        if avro["type"] == "string" and "logicalType" not in avro:
            return UNAVAILABLE
        if avro["type"] == "bytes" and "logicalType" not in avro:
            return UNAVAILABLE.encode()
        raise ValueError(f"column {column.name}: an unchanged TOAST value (not sent by the "
                         f"server) has no Avro form for {column.type}; set REPLICA IDENTITY "
                         "FULL on the table")
    try:
        return convert(column.value)
    except (AttributeError, TypeError) as e:
        raise ValueError(f"column {column.name} ({column.type}): {kind} does not fit Avro "
                         f"{avro}: {e}") from None


# -- schemas ---------------------------------------------------------------------------

_SOURCE_TYPES = {"string": "string", "int64": "long", "int32": "int"}


def _source_schema(connector: str) -> dict[str, Any]:
    return {"type": "record", "name": "Source",
            "namespace": f"io.debezium.connector.{connector}",
            "fields": [{"name": name, "type": ["null", _SOURCE_TYPES[t]], "default": None}
                       if optional else {"name": name, "type": _SOURCE_TYPES[t]}
                       for name, t, optional in debezium_source_fields(connector)]}


class _Table:
    """One table shape's Avro schemas (value and key) and the converters of its columns."""

    def __init__(self, event: ChangeEvent, columns: list[tuple[str, str]]) -> None:
        namespace = _namespace(event)
        keys = set(event.key_columns)
        self.columns = columns  # (name, source type), in order
        self.names = {name: avro_name(name) for name, _ in columns}
        if len(set(self.names.values())) != len(self.names):
            raise ValueError(f"columns {sorted(self.names)} are not distinct as Avro names")
        self.types = {name: avro_type(t) for name, t in columns}
        self.converters = {name: converter(self.types[name], name) for name, _ in columns}
        fields = [{"name": self.names[n], "type": self.types[n]} if n in keys else
                  {"name": self.names[n], "type": ["null", self.types[n]], "default": None}
                  for n, _ in columns]
        value = {"type": "record", "name": "Value", "namespace": namespace, "fields": fields}
        connector = debezium_connector(event)
        self.value_schema = json.dumps({
            "type": "record", "name": "Envelope", "namespace": namespace,
            "connect.name": f"{namespace}.Envelope",
            "fields": [
                {"name": "before", "type": ["null", value], "default": None},
                {"name": "after", "type": ["null", f"{namespace}.Value"], "default": None},
                {"name": "source", "type": _source_schema(connector)},
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None},
                {"name": "ts_us", "type": ["null", "long"], "default": None},
                {"name": "ts_ns", "type": ["null", "long"], "default": None},
                {"name": "transaction", "default": None, "type": ["null", {
                    "type": "record", "name": "block", "namespace": "event", "fields": [
                        {"name": "id", "type": "string"},
                        {"name": "total_order", "type": "long"},
                        {"name": "data_collection_order", "type": "long"}]}]},
            ]})
        key_fields = [{"name": self.names[n], "type": self.types[n]}
                      for n, _ in columns if n in keys]
        self.key_schema = json.dumps(
            {"type": "record", "name": "Key", "namespace": namespace, "fields": key_fields}
            if key_fields else {"type": "string"})  # keyless: the table's name
        self.parsed_value = fastavro.parse_schema(json.loads(self.value_schema))
        self.parsed_key = fastavro.parse_schema(json.loads(self.key_schema))

    def row(self, columns: Any) -> dict[str, Any] | None:
        if not columns:
            return None
        given = {c.name: c for c in columns}
        return {self.names[name]: _datum(given[name], self.types[name], self.converters[name])
                if name in given else None for name, _ in self.columns}


def _shape(event: ChangeEvent) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for column in [*event.after.columns, *event.before.columns]:
        seen.setdefault(column.name, column.type)
    return list(seen.items())


class AvroEncoder:
    """`Encoder`'s part for `format: avro`: each event's keyed messages, in order."""

    content_type = CONTENT_TYPE

    def __init__(self, spec: KafkaSinkSpec, registry: SchemaRegistryClient,
                 topic_of: Callable[[ChangeEvent], str]) -> None:
        self._tombstones = spec.tombstones_on_delete
        self._registry = registry
        self._topic_of = topic_of
        self._tables: dict[tuple[str, ...], _Table] = {}  # by (table, column shape)
        self._latest: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}
        self._tx: str | None = None
        self._per_table: dict[str, int] = {}

    def records(self, event: ChangeEvent) -> list[Record]:
        """[] for a DDL event (see the module's docstring)."""
        if event.HasField("outbox"):  # an outbox processor's message, as the row says it
            box = event.outbox
            return [Record(box.key, box.payload,
                           headers=tuple((h.name, h.value) for h in box.headers))]
        if event.op == Op.OP_DDL:
            return []
        order = self._collection_order(event)
        table = self._table(event)
        topic = self._topic_of(event)
        if changes_key(event):
            old, new = as_op(event, Op.OP_DELETE), as_op(event, Op.OP_INSERT)
            records = [Record(self._key(old, table, topic), self._value(old, table, topic, order),
                              "delete")]
            if self._tombstones:
                records.append(Record(records[0].key, None, "tombstone"))
            records.append(Record(self._key(new, table, topic),
                                  self._value(new, table, topic, order)))
            return records
        key = self._key(event, table, topic)
        records = [Record(key, self._value(event, table, topic, order))]
        if self._tombstones and event.op == Op.OP_DELETE and event.key_columns:
            records.append(Record(key, None, "tombstone"))
        return records

    def _table(self, event: ChangeEvent) -> _Table:
        name = (event.source_id, event.database, event.schema, event.table)
        shape = tuple(_shape(event))
        latest = self._latest.get(name)
        if latest is not None and set(shape) <= set(latest):
            shape = latest  # a delete's key-only image, say: the table's full shape
        table = self._tables.get((*name, *map(str, shape)))
        if table is None:
            table = self._tables[(*name, *map(str, shape))] = _Table(event, list(shape))
        self._latest[name] = shape
        return table

    def _value(self, event: ChangeEvent, table: _Table, topic: str, order: int) -> bytes:
        schema_id = self._id(f"{topic}-value", table.value_schema)
        ts_us = event.ts_captured_micros or event.ts_source_micros
        datum = {
            "before": table.row(event.before.columns), "after": table.row(event.after.columns),
            "source": debezium_source(event), "op": debezium_op(event),
            "ts_ms": ts_us // 1000, "ts_us": ts_us, "ts_ns": ts_us * 1000,
            "transaction": debezium_transaction(event, order),
        }
        return _framed(schema_id, table.parsed_value, datum)

    def _key(self, event: ChangeEvent, table: _Table, topic: str) -> bytes:
        schema_id = self._id(f"{topic}-key", table.key_schema)
        if not event.key_columns:
            name = ".".join(p for p in (event.database, event.schema, event.table) if p)
            return _framed(schema_id, table.parsed_key, name)
        datum = {table.names[c.name]: _datum(c, table.types[c.name], table.converters[c.name])
                 for c in key_values(event)}
        return _framed(schema_id, table.parsed_key, datum)

    def _id(self, subject: str, schema: str) -> int:
        try:
            return self._registry.register(subject, schema)
        except RegistryRefused as e:
            raise ValueError(str(e)) from None  # this event fails alone, with the reason

    def _collection_order(self, event: ChangeEvent) -> int:
        if event.tx_id != self._tx or event.tx_index == 0:
            self._tx, self._per_table = event.tx_id, {}
        table = ".".join((event.database, event.schema, event.table))
        self._per_table[table] = self._per_table.get(table, 0) + 1
        return self._per_table[table]


def _framed(schema_id: int, parsed: Any, datum: Any) -> bytes:
    out = BytesIO()
    out.write(_MAGIC + struct.pack(">I", schema_id))
    try:
        fastavro.schemaless_writer(out, parsed, datum)
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"the row does not fit its Avro schema: {e}") from None
    return out.getvalue()
