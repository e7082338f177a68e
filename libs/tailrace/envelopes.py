"""Outbound envelopes: how a `ChangeEvent` looks to the consumers of a sink.

- `native`: the native JSON document (`tailrace.events.event_to_json_dict`);
- `protobuf`: the `ChangeEvent` message itself, serialized;
- `debezium`: what Debezium's JSON converter (schemas enabled) would write:
  `{"schema": ..., "payload": {before, after, source, op, ts_ms, transaction}}`;
- `cloudevents`: a CloudEvents 1.0 JSON document (structured mode) whose `data` is
  the native JSON document.

Debezium values are shown the way Debezium shows them by default (time precision
`adaptive`): `timestamp` as epoch microseconds (`io.debezium.time.MicroTimestamp`),
`timestamptz` as an ISO-8601 string (`ZonedTimestamp`), `date` as days since the
epoch, `time` as microseconds since midnight, bytes as base64, JSON as text. Decimals
are exact strings, as Debezium's `decimal.handling.mode=string`, never doubles. A
PostgreSQL TOAST value the server did not send is Debezium's placeholder
`__debezium_unavailable_value`.

Message keys (`Encoder.key`, used by the Kafka sink): `key_bytes` (`{"pk", "table"}`)
for every envelope but `debezium`, whose key is Debezium's key document
`{"schema": {<server>.<db>.<schema>.<table>.Key struct}, "payload": {<key columns>}}`.
The key columns are the table's primary key (or replica-identity index) whatever the
replica identity; a table without a key gets a struct without fields (Debezium sends a
null key there, which would scatter one table's messages over the partitions).

Debezium options (`Encoder(..., schemas=, tombstones=)`, the `debezium` envelope only):
- `schemas=False` is Debezium's JsonConverter with `schemas.enable=false`: key and value
  are the bare payloads (`{"id": 5}`, `{"before": …, "op": …}`), never one without the other;
- `tombstones=True` is Debezium's `tombstones.on.delete=true`: `Encoder.records` follows
  a delete with a tombstone, the same key and a null value, so a compacted topic can drop
  the row (not for a table without a key: its one key would drop the whole table);
- an update that changes the key is, as Debezium sends it, a delete of the old key (its
  header `__debezium.newkey` = the new key), a tombstone, and a create of the new key
  (header `__debezium.oldkey`); keys in those headers are bare payloads.

An `Encoder` encodes a batch: it counts `transaction.data_collection_order` (the
event's number among the events of its table in its transaction), which is exact
when the whole transaction is in the batch (always, unless `bus.partitions` > 1).
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import quote

from tailrace.events import (
    ChangeEvent,
    Column,
    Op,
    Row,
    Value,
    event_json,
    event_to_json_dict,
    key_and_event_json,
    key_bytes,
    key_values,
)
from tailrace.events._codec import op_name

__all__ = [
    "CONTENT_TYPES",
    "ENVELOPES",
    "EnvelopeName",
    "Encoder",
    "UNAVAILABLE",
    "Record",
    "as_op",
    "changes_key",
    "cloudevent",
    "debezium",
    "debezium_connector",
    "debezium_key",
    "iso_utc",
    "debezium_op",
    "debezium_source",
    "debezium_source_fields",
    "debezium_transaction",
    "encode",
]

EnvelopeName = Literal["native", "protobuf", "debezium", "cloudevents"]
ENVELOPES: Final[tuple[str, ...]] = ("native", "protobuf", "debezium", "cloudevents")
CONTENT_TYPES: Final[dict[str, str]] = {
    "native": "application/json",
    "protobuf": "application/x-protobuf; messageType=tailrace.v1.ChangeEvent",
    "debezium": "application/json",
    "cloudevents": "application/cloudevents+json",
}

UNAVAILABLE: Final = "__debezium_unavailable_value"
_DEBEZIUM_OPS: Final = {
    Op.OP_INSERT: "c", Op.OP_UPDATE: "u", Op.OP_DELETE: "d",
    Op.OP_SNAPSHOT_READ: "r", Op.OP_TRUNCATE: "t",
}
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def encode(event: ChangeEvent, envelope: str = "native") -> bytes:
    """One event in `envelope`; see `Encoder` for batches (Debezium transaction order)."""
    return Encoder(envelope).encode(event)


@dataclass(frozen=True)
class Record:
    """One message of an event. `value` None is a tombstone; `part` names a message that
    is not the event itself (`tombstone`, or `delete` for the old key of a key change)."""

    key: bytes
    value: bytes | None
    part: str = ""
    headers: tuple[tuple[str, bytes], ...] = ()


class Encoder:
    """Encodes the events of a batch in order, in one envelope."""

    def __init__(self, envelope: str = "native", *, schemas: bool = True,
                 tombstones: bool = False) -> None:
        if envelope not in ENVELOPES:
            raise ValueError(f"unknown envelope {envelope!r}; use one of {', '.join(ENVELOPES)}")
        if envelope != "debezium" and (tombstones or not schemas):
            raise ValueError(f"schemas=False and tombstones=True are debezium options; the "
                             f"envelope is {envelope!r}: drop them or use envelope debezium")
        self.envelope = envelope
        self.content_type = CONTENT_TYPES[envelope]
        self.schemas = schemas
        self.tombstones = tombstones
        self._tx: str | None = None
        self._per_table: dict[str, int] = {}

    def encode(self, event: ChangeEvent) -> bytes:
        if self.envelope == "native":
            return event_json(event)
        if self.envelope == "protobuf":
            return event.SerializeToString()
        if self.envelope == "cloudevents":
            return _cloudevent_bytes(event)
        return _debezium_bytes(event, self._collection_order(event), self.schemas)

    def key(self, event: ChangeEvent) -> bytes:
        """The message key that goes with the envelope (see the module's docstring)."""
        if self.envelope == "debezium":
            return _debezium_key_bytes(event, self.schemas)
        return key_bytes(event)

    def keyed(self, event: ChangeEvent) -> tuple[bytes, bytes]:
        """(`key`, `encode`) of one event; the native envelope serializes it once for both."""
        if self.envelope == "native":
            return key_and_event_json(event)
        return self.key(event), self.encode(event)

    def records(self, event: ChangeEvent) -> list[Record]:
        """The keyed messages of one event, in order (see the module's docstring)."""
        if event.HasField("outbox"):  # an outbox processor's message, as the row says it
            box = event.outbox
            return [Record(box.key, box.payload,
                           headers=tuple((h.name, h.value) for h in box.headers))]
        if self.envelope == "debezium" and changes_key(event):
            return self._key_change(event)
        key, value = self.keyed(event)
        records = [Record(key, value)]
        if self.tombstones and event.op == Op.OP_DELETE and event.key_columns:
            records.append(Record(key, None, "tombstone"))
        return records

    def _key_change(self, event: ChangeEvent) -> list[Record]:
        order = self._collection_order(event)
        old, new = _as_op(event, Op.OP_DELETE), _as_op(event, Op.OP_INSERT)
        old_key, new_key = (_debezium_key_bytes(e, self.schemas) for e in (old, new))
        records = [Record(old_key, _debezium_bytes(old, order, self.schemas), "delete",
                          (("__debezium.newkey", _debezium_key_bytes(new, False)),))]
        if self.tombstones:
            records.append(Record(old_key, None, "tombstone"))
        records.append(Record(new_key, _debezium_bytes(new, order, self.schemas), "",
                              (("__debezium.oldkey", _debezium_key_bytes(old, False)),)))
        return records

    def _collection_order(self, event: ChangeEvent) -> int:
        if event.tx_id != self._tx or event.tx_index == 0:
            self._tx, self._per_table = event.tx_id, {}
        table = _qualified(event)
        self._per_table[table] = self._per_table.get(table, 0) + 1
        return self._per_table[table]


def _qualified(event: ChangeEvent) -> str:
    return ".".join(p for p in (event.database, event.schema, event.table) if p)


def changes_key(event: ChangeEvent) -> bool:
    """True for an update whose before- and after-images hold different key values."""
    if event.op != Op.OP_UPDATE or not event.key_columns:
        return False
    keys = set(event.key_columns)
    old = {c.name: c.value for c in event.before.columns if c.name in keys}
    new = {c.name: c.value for c in event.after.columns if c.name in keys}
    return len(old) == len(new) == len(keys) and old != new


def as_op(event: ChangeEvent, op: Op) -> ChangeEvent:
    """A copy of `event` as a delete (before-image only) or a create (after-image only)."""
    return _as_op(event, op)


def _as_op(event: ChangeEvent, op: Op) -> ChangeEvent:
    """A copy of `event` as a delete (before-image only) or a create (after-image only)."""
    part = ChangeEvent()
    part.CopyFrom(event)
    part.op = op
    part.ClearField("after" if op == Op.OP_DELETE else "before")
    return part


# -- CloudEvents ----------------------------------------------------------------------

def cloudevent(event: ChangeEvent) -> dict[str, Any]:
    """CloudEvents 1.0, structured JSON; extension attributes are lowercase alphanumerics."""
    return {**_cloudevent_attributes(event), "data": event_to_json_dict(event)}


def _cloudevent_bytes(event: ChangeEvent) -> bytes:
    """`cloudevent()` serialized, with the native document (`data`, last) spliced in."""
    head = _dumps(_cloudevent_attributes(event))
    return head[:-1] + b',"data":' + event_json(event) + b"}"


def _cloudevent_attributes(event: ChangeEvent) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "specversion": "1.0",
        "id": event.id,
        "source": f"/tailrace/{quote(event.tenant or 'default', safe='')}/"
                  f"{quote(event.source_id, safe='')}",
        "type": f"io.tailrace.change.{op_name(event.op)}",
        "subject": _qualified(event),
        "datacontenttype": "application/json",
    }
    if event.ts_source_micros:
        doc["time"] = iso_utc(event.ts_source_micros)
    if event.schema_version:
        doc["dataschema"] = f"urn:tailrace:schema:{event.schema_version}"
    doc["partitionkey"] = key_bytes(event).decode()
    doc["tailracetxid"] = event.tx_id
    doc["idempotencykey"] = event.idempotency_key
    return doc


def iso_utc(micros: int) -> str:
    """Microseconds since the epoch as Debezium's ZonedTimestamp text (ISO-8601, UTC, Z)."""
    moment = _EPOCH + dt.timedelta(microseconds=micros)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- Debezium ---------------------------------------------------------------------------

def debezium(event: ChangeEvent, *, data_collection_order: int = 1,
             with_schema: bool = True) -> dict[str, Any]:
    """The Debezium change event (`{"schema", "payload"}`, or the payload alone)."""
    if event.op == Op.OP_DDL:
        return _schema_change(event, with_schema)
    payload = _payload(event, data_collection_order)
    if not with_schema:
        return payload
    return {"schema": _envelope_schema(event)[0], "payload": payload}


def _debezium_bytes(event: ChangeEvent, data_collection_order: int,
                    with_schema: bool = True) -> bytes:
    """`debezium()` serialized, with the (cached) schema spliced in as ready JSON."""
    if event.op == Op.OP_DDL:
        return _dumps(_schema_change(event, with_schema))
    payload = _dumps(_payload(event, data_collection_order))
    if not with_schema:
        return payload
    return b'{"schema":' + _envelope_schema(event)[1] + b',"payload":' + payload + b"}"


def _payload(event: ChangeEvent, data_collection_order: int) -> dict[str, Any]:
    ts_us = event.ts_captured_micros or event.ts_source_micros
    return {
        "before": _values(event.before),
        "after": _values(event.after),
        "source": _source(event),
        "op": debezium_op(event),
        "ts_ms": ts_us // 1000,
        "ts_us": ts_us,
        "ts_ns": ts_us * 1000,
        "transaction": debezium_transaction(event, data_collection_order),
    }


def debezium_op(event: ChangeEvent) -> str:
    """Debezium's `op`: c, u, d, r or t."""
    return _DEBEZIUM_OPS.get(event.op, "u")


def debezium_transaction(event: ChangeEvent, data_collection_order: int) -> dict[str, Any]:
    """Debezium's `transaction` block."""
    tx_id = f"{event.tx_id}:{event.position.postgres.commit_lsn}" \
        if _connector(event) == "postgresql" else (event.position.mysql.gtid or event.tx_id)
    return {"id": tx_id, "total_order": event.tx_index + 1,
            "data_collection_order": data_collection_order}


def debezium_key(event: ChangeEvent, *, with_schema: bool = True) -> dict[str, Any]:
    """Debezium's message key: `{"schema": <Key struct>, "payload": {column: value}}`, or
    the payload alone."""
    columns = key_values(event)
    payload = {c.name: _value(c.value) for c in columns}
    if not with_schema:
        return payload
    return {"schema": _key_schema(event, columns)[0], "payload": payload}


def _debezium_key_bytes(event: ChangeEvent, with_schema: bool = True) -> bytes:
    columns = key_values(event)
    payload = _dumps({c.name: _value(c.value) for c in columns})
    if not with_schema:
        return payload
    return b'{"schema":' + _key_schema(event, columns)[1] + b',"payload":' + payload + b"}"


def _key_schema(event: ChangeEvent, columns: list[Column]) -> tuple[dict[str, Any], bytes]:
    shape = ("key", event.source_id, _qualified(event),
             tuple((c.name, c.type, c.value.WhichOneof("kind")) for c in columns))
    cached = _SCHEMAS.get(shape)
    if cached is None:
        schema = {"type": "struct", "optional": False,
                  "name": f"{event.source_id}.{_qualified(event)}.Key",
                  "fields": [{**_column_schema(c), "optional": False, "field": c.name}
                             for c in columns]}
        if len(_SCHEMAS) >= _MAX_SCHEMAS:
            _SCHEMAS.clear()
        cached = _SCHEMAS[shape] = (schema, _dumps(schema))
    return cached


# Envelope schemas by table shape: most events of a table share one, so it is built and
# serialized once (bounded: cleared when it grows past _MAX_SCHEMAS shapes).
_SCHEMAS: dict[tuple[Any, ...], tuple[dict[str, Any], bytes]] = {}
_MAX_SCHEMAS = 10_000


def _envelope_schema(event: ChangeEvent) -> tuple[dict[str, Any], bytes]:
    columns = _row_columns(event)
    shape = (event.source_id, _qualified(event), _connector(event), tuple(event.key_columns),
             tuple((c.name, c.type, c.value.WhichOneof("kind"),
                    c.value.timestamp_value.with_zone) for c in columns))
    cached = _SCHEMAS.get(shape)
    if cached is not None:
        return cached
    value_name = f"{event.source_id}.{_qualified(event)}"
    keys = set(event.key_columns)
    row_schema = {"type": "struct", "optional": True, "name": f"{value_name}.Value", "fields": [
        {**_column_schema(c), "optional": c.name not in keys, "field": c.name} for c in columns]}
    schema = {
        "type": "struct", "optional": False, "name": f"{value_name}.Envelope", "version": 2,
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {**_source_schema(_connector(event)), "field": "source"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"},
            {"type": "struct", "optional": True, "name": "event.block", "version": 1,
             "field": "transaction", "fields": [
                 {"type": "string", "optional": False, "field": "id"},
                 {"type": "int64", "optional": False, "field": "total_order"},
                 {"type": "int64", "optional": False, "field": "data_collection_order"}]},
        ],
    }
    if len(_SCHEMAS) >= _MAX_SCHEMAS:
        _SCHEMAS.clear()
    _SCHEMAS[shape] = (schema, _dumps(schema))
    return _SCHEMAS[shape]


_MARIADB_GTID: Final = re.compile(r"\d+-\d+-\d+")


def debezium_connector(event: ChangeEvent) -> str:
    """postgresql, mysql or mariadb: the connector Debezium would name in `source`."""
    return _connector(event)


def debezium_source_fields(connector: str) -> list[tuple[str, str, bool]]:
    """`source`'s fields for `connector` as (name, Connect type, optional)."""
    return _SOURCE_FIELDS["common"] + _SOURCE_FIELDS[
        "postgresql" if connector == "postgresql" else "mysql"]


def _connector(event: ChangeEvent) -> str:
    if event.position.WhichOneof("native") == "postgres":
        return "postgresql"
    return "mariadb" if _MARIADB_GTID.fullmatch(event.position.mysql.gtid) else "mysql"


_SOURCE_FIELDS: Final[dict[str, list[tuple[str, str, bool]]]] = {
    "common": [
        ("version", "string", False), ("connector", "string", False), ("name", "string", False),
        ("ts_ms", "int64", False), ("ts_us", "int64", True), ("ts_ns", "int64", True),
        ("snapshot", "string", True), ("db", "string", False), ("sequence", "string", True)],
    "postgresql": [
        ("schema", "string", False), ("table", "string", False), ("txId", "int64", True),
        ("lsn", "int64", True), ("xmin", "int64", True)],
    "mysql": [
        ("table", "string", True), ("server_id", "int64", False), ("gtid", "string", True),
        ("file", "string", False), ("pos", "int64", False), ("row", "int32", False),
        ("thread", "int64", True), ("query", "string", True)],
}


def debezium_source(event: ChangeEvent) -> dict[str, Any]:
    """Debezium's `source` block for the event's connector."""
    return _source(event)


def _source(event: ChangeEvent) -> dict[str, Any]:
    """Debezium's `source` block for the event's connector."""
    ts_us = event.ts_source_micros
    connector = _connector(event)
    block: dict[str, Any] = {
        "version": f"tailrace-{_version()}",
        "connector": connector,
        "name": event.source_id,
        "ts_ms": ts_us // 1000,
        "ts_us": ts_us,
        "ts_ns": ts_us * 1000,
        "snapshot": ("false" if event.op != Op.OP_SNAPSHOT_READ
                     else "last" if event.snapshot.last else "true"),
        "db": event.database,
    }
    if connector == "postgresql":
        pg = event.position.postgres
        block.update(
            sequence=f'["{pg.commit_lsn}","{pg.event_lsn}"]',
            schema=event.schema, table=event.table,
            txId=int(event.tx_id) if event.tx_id.isdigit() else None,
            lsn=pg.event_lsn, xmin=None,
        )
    else:
        my = event.position.mysql
        block.update(
            sequence=None, table=event.table, server_id=my.server_id, gtid=my.gtid or None,
            file=my.file, pos=my.offset, row=0, thread=None, query=None,
        )
    return block


@functools.cache
def _source_schema(connector: str) -> dict[str, Any]:
    fields = debezium_source_fields(connector)
    return {"type": "struct", "optional": False,
            "name": f"io.debezium.connector.{connector}.Source",
            "fields": [{"type": t, "optional": opt, "field": f} for f, t, opt in fields]}


def _schema_change(event: ChangeEvent, with_schema: bool) -> dict[str, Any]:
    """A DDL event as Debezium's schema change event (without `tableChanges` details)."""
    payload = {
        "source": _source(event), "ts_ms": (event.ts_captured_micros or event.ts_source_micros) // 1000,
        "databaseName": event.database, "schemaName": event.schema or None,
        "ddl": event.ddl, "tableChanges": [],
    }
    if not with_schema:
        return payload
    schema = {"type": "struct", "optional": False,
              "name": "io.debezium.connector.schema.SchemaChangeValue", "version": 1,
              "fields": [{**_source_schema(_connector(event)), "field": "source"},
                         {"type": "int64", "optional": False, "field": "ts_ms"},
                         {"type": "string", "optional": True, "field": "databaseName"},
                         {"type": "string", "optional": True, "field": "schemaName"},
                         {"type": "string", "optional": True, "field": "ddl"},
                         {"type": "array", "optional": False, "field": "tableChanges",
                          "items": {"type": "struct", "optional": False, "fields": []}}]}
    return {"schema": schema, "payload": payload}


def _values(row: Row) -> dict[str, Any] | None:
    if not row.columns:
        return None
    return {c.name: _value(c.value) for c in row.columns}


def _value(value: Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    if kind == "unchanged_toast":
        return UNAVAILABLE
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind == "timestamp_value":
        ts = value.timestamp_value
        return iso_utc(ts.epoch_micros) if ts.with_zone else ts.epoch_micros
    if kind == "array_value":
        return [_value(v) for v in value.array_value.items]
    return getattr(value, kind)  # decimal, json, uuid stay text; date days; time micros


_INT_TYPES: Final = (
    (re.compile(r"^(tinyint|smallint|int2|smallserial)\b(?!.*unsigned)"), "int16"),
    (re.compile(r"^(mediumint|int|integer|int4|serial)\b(?!.*unsigned)"), "int32"),
    (re.compile(r"^(tinyint|smallint)\b.*unsigned"), "int32"),
)
_KIND_SCHEMA: Final[dict[str, dict[str, Any]]] = {
    "bool_value": {"type": "boolean"},
    "int_value": {"type": "int64"},
    "uint_value": {"type": "int64"},
    "float_value": {"type": "double"},
    "decimal_value": {"type": "string"},
    "text_value": {"type": "string"},
    "bytes_value": {"type": "bytes"},
    "json_value": {"type": "string", "name": "io.debezium.data.Json", "version": 1},
    "date_value": {"type": "int32", "name": "io.debezium.time.Date", "version": 1},
    "time_value": {"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1},
    "uuid_value": {"type": "string", "name": "io.debezium.data.Uuid", "version": 1},
}


def _row_columns(event: ChangeEvent) -> list[Column]:
    """The columns of the before and after images, each once, typed where a value is known."""
    seen: dict[str, Column] = {}
    for column in [*event.after.columns, *event.before.columns]:
        known = seen.get(column.name)
        if known is None or known.value.WhichOneof("kind") in (None, "null", "unchanged_toast"):
            seen[column.name] = column
    return list(seen.values())


def _column_schema(column: Column) -> dict[str, Any]:
    kind = column.value.WhichOneof("kind")
    source_type = column.type.lower()
    if kind == "int_value":
        for pattern, connect_type in _INT_TYPES:
            if pattern.search(source_type):
                return {"type": connect_type}
    if kind == "float_value" and source_type in ("real", "float4", "float"):
        return {"type": "float"}
    if kind == "timestamp_value":
        if column.value.timestamp_value.with_zone:
            return {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1}
        return {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}
    if kind == "array_value":
        items = column.value.array_value.items
        first = next((v for v in items if v.WhichOneof("kind") not in (None, "null")), None)
        item = _column_schema(Column(type="", value=first)) if first is not None \
            else {"type": "string"}
        return {"type": "array", "items": {**item, "optional": True}}
    return dict(_KIND_SCHEMA.get(kind or "", {"type": "string"}))


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tailrace")
    except PackageNotFoundError:
        return "dev"
