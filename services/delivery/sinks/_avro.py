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

`format: json_schema` and `format: protobuf` derive their column types from these (see
`_json_schema`, `_protobuf`); what every registry format shares is in `_registry_encoder`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from io import BytesIO
from typing import Any

import fastavro

from tailrace.envelopes import UNAVAILABLE, debezium_connector, debezium_source_fields
from tailrace.events import ChangeEvent, Column, Value, json_of
from tailrace_services.delivery.sinks._registry_encoder import RegistryEncoder

CONTENT_TYPE = "application/vnd.confluent.avro"

Converter = Callable[[Value], Any]


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
        return _checked(column, logical, ("timestamp_value",),
                        lambda v: v.timestamp_value.epoch_micros)
    if logical == "date":
        return _checked(column, logical, ("date_value",), lambda v: v.date_value)
    if logical == "time-micros":
        return _checked(column, logical, ("time_value",), lambda v: v.time_value)
    if kind_of == "boolean":
        return _checked(column, kind_of, ("bool_value",), lambda v: v.bool_value)
    if kind_of in ("int", "long"):
        return _checked(column, kind_of, ("int_value", "uint_value"),
                        lambda v: v.uint_value if v.WhichOneof("kind") == "uint_value"
                        else v.int_value)
    if kind_of in ("float", "double"):
        return _checked(column, kind_of, ("float_value",), lambda v: v.float_value)
    if kind_of == "bytes":
        return lambda v: v.bytes_value if v.WhichOneof("kind") == "bytes_value" \
            else str(json_of(v)).encode()
    return _text


def plain_decimal(number: Decimal) -> str:
    """A decimal as Debezium writes its text: `0.0000000000`, never `0E-10`."""
    return format(number, "f")


def _checked(column: str, typed: str, kinds: tuple[str, ...],
             convert: Converter) -> Converter:
    """`convert`, for values of `kinds` only: a value the source kept as text because it
    has no such form (PostgreSQL's `infinity`, a BC date, `24:00:00`) would read as 0 from
    an unset field; it fails its event instead (the DLQ names the column)."""
    def checked(v: Value) -> Any:
        if v.WhichOneof("kind") not in kinds:
            raise ValueError(f"column {column}: {json_of(v)!r} has no {typed} form")
        return convert(v)
    return checked


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
                         f"server) has a placeholder in text and bytes columns only, not in "
                         f"{column.type}; set REPLICA IDENTITY FULL on the table")
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


class ColumnTable:
    """One table shape's columns: their names in the schema, their Avro types (from the
    source types; the other formats derive theirs from these) and their converters.
    `finish(avro_type)` turns an Avro datum into the format's own (None: as it is)."""

    def __init__(self, event: ChangeEvent, columns: list[tuple[str, str]],
                 finish: Callable[[dict[str, Any]], Callable[[Any], Any] | None] | None = None
                 ) -> None:
        self.namespace = _namespace(event)
        self.keys = set(event.key_columns)
        self.columns = columns  # (name, source type), in order
        self.names = {name: avro_name(name) for name, _ in columns}
        if len(set(self.names.values())) != len(self.names):
            raise ValueError(f"columns {sorted(self.names)} are not distinct as schema names")
        self.types = {name: avro_type(t) for name, t in columns}
        self.converters = {name: converter(self.types[name], name) for name, _ in columns}
        self._finish = {name: finish(self.types[name]) for name, _ in columns} if finish else {}

    def datum(self, column: Column) -> Any:
        value = _datum(column, self.types[column.name], self.converters[column.name])
        done = self._finish.get(column.name)
        return value if done is None or value is None else done(value)

    def row(self, columns: Sequence[Column]) -> dict[str, Any] | None:
        if not columns:
            return None
        given = {c.name: c for c in columns}
        return {self.names[name]: self.datum(given[name]) if name in given else None
                for name, _ in self.columns}

    def key_datum(self, columns: Sequence[Column]) -> dict[str, Any]:
        return {self.names[c.name]: self.datum(c) for c in columns}


class _AvroTable(ColumnTable):
    """One table shape's Avro schemas (value and key)."""

    history = None  # Avro keeps none: its resolution rules let a dropped field go

    def __init__(self, event: ChangeEvent, columns: list[tuple[str, str]],
                 history: None = None) -> None:
        super().__init__(event, columns)
        namespace, keys = self.namespace, self.keys
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
        self._parsed_value = fastavro.parse_schema(json.loads(self.value_schema))
        self._parsed_key = fastavro.parse_schema(json.loads(self.key_schema))

    def encode_value(self, datum: dict[str, Any]) -> bytes:
        return _written(self._parsed_value, datum)

    def encode_key(self, datum: Any) -> bytes:
        return _written(self._parsed_key, datum)


class AvroEncoder(RegistryEncoder):
    """`Encoder`'s part for `format: avro`."""

    content_type = CONTENT_TYPE
    schema_type = "AVRO"
    table = _AvroTable


def _written(parsed: Any, datum: Any) -> bytes:
    out = BytesIO()
    try:
        fastavro.schemaless_writer(out, parsed, datum)
    except (ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"the row does not fit its Avro schema: {e}") from None
    return out.getvalue()
