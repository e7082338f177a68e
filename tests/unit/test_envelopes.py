"""Each envelope read back by a sample consumer of that format."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import uuid
from decimal import Decimal
from typing import Any

import pytest

from tailrace.envelopes import CONTENT_TYPES, UNAVAILABLE, Encoder, Record, changes_key, encode
from tailrace.events import (
    UNCHANGED_TOAST,
    ChangeEvent,
    Column,
    Op,
    Position,
    Row,
    event_to_json_dict,
    value_of,
)
from tailrace.proto.event_pb2 import MysqlPosition
from tests.fix_sinks import source_events

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

VALUES: list[tuple[str, str, Any]] = [
    ("id", "integer", 42),
    ("small", "smallint", 7),
    ("big", "bigint", 2**40),
    ("price", "numeric(30,10)", Decimal("12345678901234567890.0123456789")),
    ("ratio", "double precision", 0.25),
    ("name", "text", "Zoë"),
    ("flag", "boolean", True),
    ("blob", "bytea", b"\x00\xffdata"),
    ("doc", "jsonb", None),  # set below: JSON kept verbatim
    ("at_local", "timestamp without time zone", dt.datetime(2024, 2, 29, 23, 59, 59, 123456)),
    ("at_utc", "timestamp with time zone",
     dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.UTC)),
    ("day", "date", dt.date(1999, 12, 31)),
    ("clock", "time without time zone", dt.time(13, 14, 15, 16)),
    ("ref", "uuid", uuid.UUID(int=5)),
    ("empty", "text", None),
]


def rich_event(op: int = Op.OP_UPDATE) -> ChangeEvent:
    cols = []
    for name, type_, value in VALUES:
        v = value_of(value)
        if name == "doc":
            v.json_value = '{"a": [1, 2.5, "x"]}'
        cols.append(Column(name=name, type=type_, value=v))
    event = source_events(1)[0]
    event.op = op
    event.after.CopyFrom(Row(columns=cols))
    event.before.CopyFrom(Row(columns=[Column(name="id", type="integer", value=value_of(42))]))
    event.key_columns[:] = ["id"]
    return event


# -- a sample Debezium consumer ----------------------------------------------------------

def debezium_consume(message: bytes) -> dict[str, Any]:
    """What a Debezium consumer does: unwrap schema/payload, map op, decode typed values."""
    doc = json.loads(message)
    schema, payload = (doc["schema"], doc["payload"]) if "payload" in doc else (None, doc)
    op = {"c": "create", "u": "update", "d": "delete", "r": "read", "t": "truncate"}[payload["op"]]
    out = {"op": op, "source": payload["source"], "transaction": payload["transaction"],
           "ts_ms": payload["ts_ms"]}
    fields = {f["field"]: f for f in schema["fields"]} if schema else {}
    for image in ("before", "after"):
        row = payload[image]
        if row is None:
            out[image] = None
            continue
        columns = {f["field"]: f for f in fields[image]["fields"]} if schema else {}
        assert set(row) <= set(columns), f"{image} has fields its schema does not declare"
        out[image] = {k: _connect_value(columns[k], v) for k, v in row.items()}
    return out


def _connect_value(field: dict[str, Any], value: Any) -> Any:
    if value is None:
        assert field["optional"], f"{field['field']} is null but not optional"
        return None
    name, kind = field.get("name"), field["type"]
    if name == "io.debezium.time.MicroTimestamp":
        return (EPOCH + dt.timedelta(microseconds=value)).replace(tzinfo=None)
    if name == "io.debezium.time.ZonedTimestamp":
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if name == "io.debezium.time.Date":
        return dt.date(1970, 1, 1) + dt.timedelta(days=value)
    if name == "io.debezium.time.MicroTime":
        return (dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=value)).time()
    if name == "io.debezium.data.Uuid":
        return uuid.UUID(value)
    if name == "io.debezium.data.Json":
        return json.loads(value)
    if kind == "bytes":
        return base64.b64decode(value)
    if kind in ("int16", "int32", "int64"):
        assert isinstance(value, int)
        return value
    return value


def test_debezium_envelope_read_by_a_debezium_consumer() -> None:
    event = rich_event()
    got = debezium_consume(encode(event, "debezium"))
    expected = {name: value for name, _, value in VALUES}
    expected["doc"] = {"a": [1, 2.5, "x"]}
    expected["price"] = "12345678901234567890.0123456789"  # exact string, never a double
    assert got["op"] == "update"
    assert got["after"] == expected
    assert Decimal(got["after"]["price"]) == Decimal("12345678901234567890.0123456789")
    assert got["before"] == {"id": 42}
    src = got["source"]
    assert src["connector"] == "postgresql" and src["name"] == event.source_id
    assert (src["db"], src["schema"], src["table"]) == ("shop", "public", event.table)
    assert src["txId"] == int(event.tx_id) and src["lsn"] == event.position.postgres.event_lsn
    assert src["ts_ms"] == event.ts_source_micros // 1000 and src["snapshot"] == "false"
    assert json.loads(src["sequence"])[1] == str(event.position.postgres.event_lsn)
    assert got["transaction"] == {"id": f"{event.tx_id}:{event.position.postgres.commit_lsn}",
                                  "total_order": 1, "data_collection_order": 1}
    assert got["ts_ms"] == event.ts_captured_micros // 1000


def test_debezium_schema_types_follow_the_source_types() -> None:
    event = rich_event()
    doc = json.loads(encode(event, "debezium"))
    fields = {f["field"]: f for f in doc["schema"]["fields"]}
    after = {f["field"]: f for f in fields["after"]["fields"]}
    assert after["id"]["type"] == "int32" and not after["id"]["optional"]
    assert after["small"]["type"] == "int16" and after["big"]["type"] == "int64"
    assert after["price"] == {"type": "string", "optional": True, "field": "price"}
    assert after["at_utc"]["name"] == "io.debezium.time.ZonedTimestamp"
    assert doc["schema"]["name"] == f"src1.shop.public.{event.table}.Envelope"
    assert fields["source"]["name"] == "io.debezium.connector.postgresql.Source"


@pytest.mark.parametrize(("op", "letter"), [
    (Op.OP_INSERT, "c"), (Op.OP_UPDATE, "u"), (Op.OP_DELETE, "d"), (Op.OP_SNAPSHOT_READ, "r"),
    (Op.OP_TRUNCATE, "t")])
def test_debezium_op_mapping(op: int, letter: str) -> None:
    event = rich_event(op)
    if op == Op.OP_DELETE:
        event.ClearField("after")
    if op == Op.OP_TRUNCATE:
        event.ClearField("after")
        event.ClearField("before")
    payload = json.loads(encode(event, "debezium"))["payload"]
    assert payload["op"] == letter
    if op == Op.OP_DELETE:
        assert payload["after"] is None and payload["before"] == {"id": 42}
    if op == Op.OP_TRUNCATE:
        assert payload["before"] is None and payload["after"] is None
    assert payload["source"]["snapshot"] == ("true" if op == Op.OP_SNAPSHOT_READ else "false")


def test_debezium_mysql_and_mariadb_source_blocks() -> None:
    event = rich_event()
    event.position.CopyFrom(Position(tx_seq=9, mysql=MysqlPosition(
        gtid="3E11FA47-71CA-11E1-9E33-C80AA9429562:23", file="binlog.000003", offset=4711,
        server_id=223344)))
    event.tx_id = "3E11FA47-71CA-11E1-9E33-C80AA9429562:23"
    src = debezium_consume(encode(event, "debezium"))["source"]
    assert src["connector"] == "mysql"
    assert (src["gtid"], src["file"], src["pos"], src["server_id"]) == (
        event.position.mysql.gtid, "binlog.000003", 4711, 223344)
    assert src["table"] == event.table and src["db"] == "shop"
    event.position.mysql.gtid = "0-1-77"
    doc = json.loads(encode(event, "debezium"))
    assert doc["payload"]["source"]["connector"] == "mariadb"
    assert doc["payload"]["transaction"]["id"] == "0-1-77"


def test_debezium_unchanged_toast_is_the_placeholder_and_ddl_a_schema_change() -> None:
    event = rich_event()
    event.after.columns[5].value.CopyFrom(value_of(UNCHANGED_TOAST))
    assert json.loads(encode(event, "debezium"))["payload"]["after"]["name"] == UNAVAILABLE
    ddl = source_events(1)[0]
    ddl.op, ddl.ddl = Op.OP_DDL, "ALTER TABLE orders ADD COLUMN x int"
    ddl.ClearField("after")
    doc = json.loads(encode(ddl, "debezium"))
    assert doc["schema"]["name"] == "io.debezium.connector.schema.SchemaChangeValue"
    assert doc["payload"]["ddl"] == ddl.ddl and doc["payload"]["databaseName"] == "shop"


def test_data_collection_order_counts_per_table_within_a_transaction() -> None:
    events = [e for e in source_events(200, max_tx=8) if e.tx_size >= 4]
    encoder = Encoder("debezium")
    seen: dict[tuple[str, str], int] = {}
    for event in events:
        tx = json.loads(encoder.encode(event))["payload"]["transaction"]
        seen[(event.tx_id, event.table)] = seen.get((event.tx_id, event.table), 0) + 1
        assert tx["total_order"] == event.tx_index + 1
        assert tx["data_collection_order"] == seen[(event.tx_id, event.table)]


# -- Debezium keys, schemas.enable, tombstones, key changes ---------------------------

def _key_event(op: int, before: dict[str, Any] | None, after: dict[str, Any] | None
               ) -> ChangeEvent:
    event = source_events(1)[0]
    event.op = op
    for image, row in (("before", before), ("after", after)):
        event.ClearField(image)
        for name, value in (row or {}).items():
            getattr(event, image).columns.add(name=name, type="integer" if name == "id" else "text",
                                               value=value_of(value))
    return event


def test_debezium_key_is_the_pk_struct_with_a_schema_or_the_bare_payload() -> None:
    event = _key_event(Op.OP_UPDATE, {"id": 5}, {"id": 5, "note": "x"})
    key = json.loads(Encoder("debezium").key(event))
    assert key == {"schema": {"type": "struct", "optional": False,
                              "name": f"src1.shop.public.{event.table}.Key",
                              "fields": [{"type": "int32", "optional": False, "field": "id"}]},
                   "payload": {"id": 5}}
    assert json.loads(Encoder("debezium", schemas=False).key(event)) == {"id": 5}


def test_schemas_enable_false_makes_key_and_value_bare_payloads() -> None:
    event = rich_event()
    with_schema = json.loads(Encoder("debezium").encode(event))
    bare = json.loads(Encoder("debezium", schemas=False).encode(event))
    assert set(with_schema) == {"schema", "payload"}
    assert bare == with_schema["payload"]  # the same payload, without the wrapper
    assert {"before", "after", "source", "op", "ts_ms"} <= set(bare)
    ddl = source_events(1)[0]
    ddl.op, ddl.ddl = Op.OP_DDL, "ALTER TABLE orders ADD COLUMN x int"
    assert "schema" not in json.loads(Encoder("debezium", schemas=False).encode(ddl))


@pytest.mark.parametrize("schemas", [True, False])
def test_a_delete_is_followed_by_a_tombstone_with_the_same_key(schemas: bool) -> None:
    delete = _key_event(Op.OP_DELETE, {"id": 5}, None)
    encoder = Encoder("debezium", schemas=schemas, tombstones=True)
    first, tombstone = encoder.records(delete)
    assert json.loads(first.value or b"null") == (
        json.loads(encode(delete, "debezium")) if schemas
        else json.loads(encode(delete, "debezium"))["payload"])
    assert first.part == "" and first.key == encoder.key(delete)
    assert tombstone == Record(first.key, None, "tombstone")
    # every other op is one record; tombstones off, a delete is one record too
    insert = _key_event(Op.OP_INSERT, None, {"id": 5, "note": "x"})
    assert len(encoder.records(insert)) == 1
    assert [r.value is None for r in Encoder("debezium").records(delete)] == [False]


def test_no_tombstone_for_a_table_without_a_key() -> None:
    delete = _key_event(Op.OP_DELETE, {"id": 5, "note": "x"}, None)
    delete.ClearField("key_columns")  # its key is the table's: a tombstone would drop it all
    assert len(Encoder("debezium", tombstones=True).records(delete)) == 1


def test_a_key_change_is_a_delete_a_tombstone_and_a_create_as_debezium_sends_it() -> None:
    change = _key_event(Op.OP_UPDATE, {"id": 5}, {"id": 7, "note": "moved"})
    assert changes_key(change)
    assert not changes_key(_key_event(Op.OP_UPDATE, {"id": 5}, {"id": 5, "note": "x"}))
    assert not changes_key(_key_event(Op.OP_UPDATE, None, {"id": 5, "note": "x"}))
    delete, tombstone, create = Encoder("debezium", tombstones=True).records(change)
    old_doc, new_doc = json.loads(delete.value or b""), json.loads(create.value or b"")
    assert json.loads(delete.key)["payload"] == {"id": 5} and delete.part == "delete"
    assert (old_doc["payload"]["op"], old_doc["payload"]["before"],
            old_doc["payload"]["after"]) == ("d", {"id": 5}, None)
    assert delete.headers == (("__debezium.newkey", b'{"id":7}'),)
    assert tombstone == Record(delete.key, None, "tombstone")
    assert json.loads(create.key)["payload"] == {"id": 7} and create.part == ""
    assert (new_doc["payload"]["op"], new_doc["payload"]["before"],
            new_doc["payload"]["after"]) == ("c", None, {"id": 7, "note": "moved"})
    assert create.headers == (("__debezium.oldkey", b'{"id":5}'),)
    assert [r.part for r in Encoder("debezium").records(change)] == ["delete", ""]
    # other envelopes keep the event whole: one record, keyed as ever
    native = Encoder("native").records(change)
    assert native == [Record(Encoder("native").key(change), encode(change))]


def test_debezium_options_are_refused_for_other_envelopes() -> None:
    for envelope in ("native", "protobuf", "cloudevents"):
        with pytest.raises(ValueError, match="debezium options"):
            Encoder(envelope, tombstones=True)
        with pytest.raises(ValueError, match="debezium options"):
            Encoder(envelope, schemas=False)


# -- CloudEvents ------------------------------------------------------------------------

_ATTRIBUTE = re.compile(r"^[a-z0-9]{1,20}$")


def test_cloudevents_structured_json_is_valid_and_carries_the_native_document() -> None:
    event = rich_event()
    doc = json.loads(encode(event, "cloudevents"))
    # the spec's REQUIRED attributes, and its naming rule for every attribute
    assert doc["specversion"] == "1.0"
    assert doc["id"] == event.id and doc["type"] == "io.tailrace.change.update"
    assert doc["source"] == "/tailrace/acme/src1"
    assert all(_ATTRIBUTE.match(name) for name in doc if name != "data")
    assert dt.datetime.fromisoformat(doc["time"].replace("Z", "+00:00")) == \
        EPOCH + dt.timedelta(microseconds=event.ts_source_micros)
    assert doc["datacontenttype"] == "application/json"
    assert doc["subject"] == f"shop.public.{event.table}"
    assert doc["data"] == json.loads(json.dumps(event_to_json_dict(event)))
    assert doc["idempotencykey"] == event.idempotency_key
    assert CONTENT_TYPES["cloudevents"] == "application/cloudevents+json"


# -- native ------------------------------------------------------------------------------

def test_native_json_and_protobuf_round_trip() -> None:
    event = rich_event()
    assert json.loads(encode(event)) == json.loads(json.dumps(event_to_json_dict(event)))
    assert json.loads(encode(event))["after"]["price"] == "12345678901234567890.0123456789"
    assert ChangeEvent.FromString(encode(event, "protobuf")) == event


def test_unknown_envelope_names_the_choices() -> None:
    with pytest.raises(ValueError, match="native, protobuf, debezium, cloudevents"):
        Encoder("avro")
