"""The Kafka sink's `format: json_schema`: Debezium's change event as JSON in Confluent's
JSON Schema wire format (magic byte 0, the schema's 4-byte id, the JSON text), described by
a JSON Schema (draft-07, as Confluent's `JSONSerializer`) registered with `schemaType: JSON`
under `{topic}-value` and `{topic}-key`.

Each column's JSON type comes from its Avro type (`_avro`'s table, from the source type):

| source | JSON Schema: value |
|---|---|
| boolean | `boolean` |
| integers, year | `integer` |
| numeric(p,s), decimal(p,s), bigint unsigned | `string` (`connect.parameters` p, s): exact text |
| numeric without a precision | `string`: exact text |
| real, float, double | `number` (NaN and infinities fail the event) |
| timestamp with time zone, MySQL timestamp | `string`, `date-time`: ISO-8601 UTC |
| timestamp without time zone, datetime | `integer`: microseconds since the epoch |
| date; time | `integer`: days since the epoch; microseconds |
| bytea, blobs, binary | `string`, `contentEncoding: base64` |
| uuid, json, jsonb, text and the rest | `string` |
| arrays | `array`, items nullable |

Time types carry Debezium's semantic names as `title` (io.debezium.time.ZonedTimestamp,
MicroTimestamp, Date, MicroTime; io.debezium.data.Json, Uuid, Decimal).

The row object (`definitions.Value`, `before` and `after`) is closed (`additionalProperties:
false`); key columns are required and not nullable, the others `oneOf` null and their type
and not required, so a column added later is a compatible new version (also for Confluent's
registry, which refuses a property added to an open object). A column once in the
registered schema stays in it (nullable, absent from new rows) after it is dropped, so a
drop is no new version; this is read from the subject's latest version. An unchanged TOAST
value is Debezium's placeholder in a text or bytes column (base64 of it in bytes), as in
Avro.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from tailrace.envelopes import debezium_connector, debezium_source_fields, iso_utc
from tailrace.events import ChangeEvent
from tailrace_services.delivery.sinks._avro import ColumnTable, plain_decimal
from tailrace_services.delivery.sinks._registry_encoder import RegistryEncoder

CONTENT_TYPE = "application/vnd.confluent.jsonschema"
DRAFT = "http://json-schema.org/draft-07/schema#"

_NULL = {"type": "null"}
_INTEGER = {"type": "integer"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [_NULL, schema]}


def json_type(avro: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of a column of Avro type `avro` (this module's table)."""
    kind, logical = avro["type"], avro.get("logicalType")
    if kind == "array":
        return {"type": "array", "items": nullable(json_type(avro["items"][1]))}
    if logical == "decimal":
        return {"type": "string", "title": "io.debezium.data.Decimal", "connect.parameters": {
            "precision": avro["precision"], "scale": avro["scale"]}}
    if logical == "timestamp-micros":
        return {"type": "string", "format": "date-time",
                "title": "io.debezium.time.ZonedTimestamp"}
    named = {"local-timestamp-micros": "MicroTimestamp", "date": "Date", "time-micros": "MicroTime"}
    if logical in named:
        return {"type": "integer", "title": f"io.debezium.time.{named[logical]}"}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind in ("int", "long"):
        return {"type": "integer"}
    if kind in ("float", "double"):
        return {"type": "number"}
    if kind == "bytes":
        return {"type": "string", "contentEncoding": "base64"}
    if logical == "uuid":
        return {"type": "string", "format": "uuid", "title": "io.debezium.data.Uuid"}
    if avro.get("connect.name") == "io.debezium.data.Json":
        return {"type": "string", "title": "io.debezium.data.Json"}
    return {"type": "string"}


def json_finish(avro: dict[str, Any]) -> Callable[[Any], Any] | None:
    """An Avro datum of `avro` -> its JSON value (None: the same)."""
    kind, logical = avro["type"], avro.get("logicalType")
    if kind == "array":
        item = json_finish(avro["items"][1])
        return None if item is None else lambda v: [None if i is None else item(i) for i in v]
    if logical == "decimal":
        return plain_decimal
    if logical == "timestamp-micros":
        return iso_utc
    if kind in ("float", "double"):
        return _finite
    if kind == "bytes":
        return lambda v: base64.b64encode(v).decode()
    return None


def _finite(number: float) -> float:
    if not math.isfinite(number):
        raise ValueError(f"{number} has no JSON form (JSON numbers are finite)")
    return number


def _json_bytes(datum: Any) -> bytes:
    return json.dumps(datum, separators=(",", ":"), default=_decimal).encode()


def _decimal(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _source_schema(connector: str) -> dict[str, Any]:
    types = {"string": {"type": "string"}, "int64": _INTEGER, "int32": _INTEGER}
    fields = debezium_source_fields(connector)
    return {"type": "object", "title": f"io.debezium.connector.{connector}.Source",
            "properties": {name: nullable(types[t]) if optional else types[t]
                           for name, t, optional in fields},
            "required": [name for name, _, optional in fields if not optional]}


class _JsonTable(ColumnTable):
    """One table shape's JSON Schemas (value and key); `history`: every column's property
    the value schema has (dropped ones kept)."""

    def __init__(self, event: ChangeEvent, columns: list[tuple[str, str]],
                 kept: dict[str, Any] | None) -> None:
        super().__init__(event, columns, json_finish)
        ns = self.namespace
        own = {self.names[n]: json_type(self.types[n]) if n in self.keys
               else nullable(json_type(self.types[n])) for n, _ in columns}
        self.history = {**(kept or {}), **own}
        row = {"type": "object", "title": f"{ns}.Value", "properties": self.history,
               "required": [self.names[n] for n, _ in columns if n in self.keys],
               "additionalProperties": False}
        block = {"type": "object", "title": "event.block", "properties": {
            "id": {"type": "string"}, "total_order": _INTEGER, "data_collection_order": _INTEGER},
            "required": ["id", "total_order", "data_collection_order"],
            "additionalProperties": False}
        image = nullable({"$ref": "#/definitions/Value"})
        self.value_schema = json.dumps({
            "$schema": DRAFT, "title": f"{ns}.Envelope", "type": "object",
            "definitions": {"Value": row},
            "properties": {
                "before": image, "after": image,
                "source": _source_schema(debezium_connector(event)),
                "op": {"type": "string"},
                "ts_ms": nullable(_INTEGER), "ts_us": nullable(_INTEGER),
                "ts_ns": nullable(_INTEGER), "transaction": nullable(block)},
            "required": ["source", "op"], "additionalProperties": False})
        keys = [n for n, _ in columns if n in self.keys]
        self.key_schema = json.dumps({
            "$schema": DRAFT, "title": f"{ns}.Key", "type": "object",
            "properties": {self.names[n]: json_type(self.types[n]) for n in keys},
            "required": [self.names[n] for n in keys], "additionalProperties": False}
            if keys else {"$schema": DRAFT, "type": "string"})  # keyless: the table's name

    def encode_value(self, datum: dict[str, Any]) -> bytes:
        return _json_bytes(datum)

    def encode_key(self, datum: Any) -> bytes:
        return _json_bytes(datum)


class JsonSchemaEncoder(RegistryEncoder):
    """`Encoder`'s part for `format: json_schema`."""

    content_type = CONTENT_TYPE
    schema_type = "JSON"
    table = _JsonTable
    keeps_history = True

    def history_of(self, schema: str) -> dict[str, Any] | None:
        try:
            kept = json.loads(schema)["definitions"]["Value"]["properties"]
        except (ValueError, KeyError, TypeError):
            return None  # not one of ours: nothing kept
        return {name: prop if "oneOf" in prop else nullable(prop)  # a key's: nullable now
                for name, prop in kept.items()} if isinstance(kept, dict) else None
