"""Source column types to JSON Schema and Protobuf, values to their data, stable field
numbers and Confluent's message indexes (the Kafka sink's `format: json_schema | protobuf`;
pure logic)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from tailrace.events import ChangeEvent, Op, Value, value_of
from tailrace_services.control import proto_compat
from tailrace_services.delivery.sinks._avro import avro_type
from tailrace_services.delivery.sinks._json_schema import (
    JsonSchemaEncoder,
    _JsonTable,
    json_finish,
    json_type,
)
from tailrace_services.delivery.sinks._protobuf import (
    Field,
    ProtobufEncoder,
    _ProtoTable,
    message_indexes,
    numbered,
    proto_type,
)


@pytest.mark.parametrize(("source", "schema", "proto"), [
    ("integer", {"type": "integer"}, "int32"),
    ("bigint", {"type": "integer"}, "int64"),
    ("numeric(12,2)", {"type": "string", "title": "io.debezium.data.Decimal",
                       "connect.parameters": {"precision": 12, "scale": 2}}, "string"),
    ("numeric", {"type": "string"}, "string"),
    ("timestamp with time zone", {"type": "string", "format": "date-time",
                                  "title": "io.debezium.time.ZonedTimestamp"},
     "google.protobuf.Timestamp"),
    ("timestamp without time zone", {"type": "integer",
                                     "title": "io.debezium.time.MicroTimestamp"}, "int64"),
    ("date", {"type": "integer", "title": "io.debezium.time.Date"}, "int32"),
    ("time", {"type": "integer", "title": "io.debezium.time.MicroTime"}, "int64"),
    ("boolean", {"type": "boolean"}, "bool"),
    ("real", {"type": "number"}, "float"),
    ("double precision", {"type": "number"}, "double"),
    ("bytea", {"type": "string", "contentEncoding": "base64"}, "bytes"),
    ("uuid", {"type": "string", "format": "uuid", "title": "io.debezium.data.Uuid"}, "string"),
    ("jsonb", {"type": "string", "title": "io.debezium.data.Json"}, "string"),
    ("text", {"type": "string"}, "string"),
    ("text[]", {"type": "array", "items": {"oneOf": [{"type": "null"}, {"type": "string"}]}},
     "StringArray"),
    ("timestamptz[]", {"type": "array", "items": {"oneOf": [{"type": "null"}, {
        "type": "string", "format": "date-time", "title": "io.debezium.time.ZonedTimestamp"}]}},
     "TimestampArray"),
])
def test_each_source_type_has_its_json_schema_and_protobuf_type(
        source: str, schema: dict[str, object], proto: str) -> None:
    assert json_type(avro_type(source)) == schema
    assert proto_type(avro_type(source)) == proto


def test_values_become_json_as_debezium_writes_them() -> None:
    def finished(source: str, datum: object) -> object:
        finish = json_finish(avro_type(source))
        return datum if finish is None else finish(datum)

    assert finished("numeric(12,2)", Decimal("12.50")) == "12.50"
    assert finished("timestamptz", 1_700_000_000_123_456) == "2023-11-14T22:13:20.123456Z"
    assert finished("bytea", b"\x01\x00\xff") == "AQD/"
    assert finished("bytea[]", [b"\x01", None]) == ["AQ==", None]
    assert finished("integer", 7) == 7
    with pytest.raises(ValueError, match="no JSON form"):
        finished("double precision", float("nan"))


def _event(*columns: tuple[str, str, object], keys: tuple[str, ...] = ("id",)) -> ChangeEvent:
    event = ChangeEvent(source_id="pg", database="shop", schema="public", table="orders",
                        op=Op.OP_INSERT, key_columns=list(keys))
    event.position.postgres.commit_lsn = 1
    for name, type_, value in columns:
        event.after.columns.add(name=name, type=type_).value.CopyFrom(value_of(value))
    return event


def test_field_numbers_are_kept_new_columns_take_the_next_and_dropped_ones_stay() -> None:
    first = numbered([("id", "int64", True), ("note", "string", False)], None)
    assert first == {"id": Field(1, "int64", False), "note": Field(2, "string", True)}
    later = numbered([("id", "int64", True), ("qty", "int32", False)], first)
    assert later == {"id": Field(1, "int64", False), "qty": Field(3, "int32", True),
                     "note": Field(2, "string", True)}, "note dropped: its field stays"
    again = numbered([("id", "int64", True), ("note", "string", False),
                      ("extra", "StringArray", False)], later)
    assert again["note"].number == 2 and again["extra"] == Field(4, "StringArray", False)


def test_message_indexes_are_zigzag_varints_and_the_first_message_is_one_zero_byte() -> None:
    assert message_indexes([0]) == b"\x00"
    assert message_indexes([1]) == b"\x02\x02"
    assert message_indexes([0, 2]) == b"\x04\x00\x04"
    assert message_indexes([70]) == b"\x02\x8c\x01", "140 as a varint: two bytes"


def test_a_protobuf_table_writes_messages_its_own_schema_reads() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    event = _event(("id", "bigint", 5), ("placed", "timestamptz", when),
                   ("tags", "text[]", ["a", None]), ("note", "text", None))
    event.after.columns.add(name="big", type="text").value.CopyFrom(Value(unchanged_toast=True))
    columns = [(c.name, c.type) for c in event.after.columns]
    table = _ProtoTable(event, columns, None)
    assert "optional string note = 4;" in table.value_schema
    assert "google.protobuf.Timestamp placed = 2;" in table.value_schema
    payload = table.encode_value({"after": table.row(event.after.columns), "op": "c",
                                  "source": {"table": "orders"}})
    assert payload[:1] == b"\x00", "message indexes [0]"
    message = table._envelope.FromString(payload[1:])
    after = message.after
    assert (after.id, after.placed.ToDatetime(tzinfo=dt.UTC)) == (5, when)
    assert [(i.HasField("value"), i.value) for i in after.tags.items] == [(True, "a"),
                                                                          (False, "")]
    assert not after.HasField("note") and after.big == "__debezium_unavailable_value"
    assert not message.HasField("before") and message.source.table == "orders"
    assert table._key.FromString(table.encode_key({"id": 5})[1:]).id == 5


def test_a_json_table_keeps_dropped_columns_nullable_and_requires_its_keys() -> None:
    event = _event(("id", "bigint", 5), ("note", "text", "x"))
    table = _JsonTable(event, [("id", "bigint"), ("note", "text")], None)
    event2 = _event(("id", "bigint", 6))
    later = _JsonTable(event2, [("id", "bigint")], table.history)
    assert later.history == table.history, "note dropped: its property stays"
    assert '"required": ["id"]' in later.value_schema
    assert later.value_schema == table.value_schema, "so the schema does not change"


def test_what_the_registry_serves_back_gives_the_history_a_restart_numbers_from() -> None:
    event = _event(("id", "bigint", 5), ("tags", "text[]", ["a"]), ("placed", "timestamptz", None))
    columns = [(c.name, c.type) for c in event.after.columns]
    proto = _ProtoTable(event, columns, None)
    encoder = ProtobufEncoder.__new__(ProtobufEncoder)  # history_of reads its argument alone
    served = proto_compat.serialized(proto.value_schema)  # as the registry serves it
    assert encoder.history_of(served) == {"id": Field(1, "int64", False),
                                          "tags": Field(2, "StringArray", False),
                                          "placed": Field(3, "google.protobuf.Timestamp", False)}
    assert encoder.history_of(proto.value_schema) is None, "text: not a served descriptor"
    table = _JsonTable(event, columns, None)
    kept = JsonSchemaEncoder.__new__(JsonSchemaEncoder).history_of(table.value_schema)
    assert kept == {**table.history, "id": {"oneOf": [{"type": "null"}, {"type": "integer"}]}}


def test_columns_protobuf_would_give_one_json_name_are_refused_by_name() -> None:
    event = _event(("id", "bigint", 1), ("fooBar", "int", 2), ("foo_bar", "int", 3))
    with pytest.raises(ValueError, match=r"columns 'fooBar' and 'foo_bar' of public\.orders "
                                         r"have the same protobuf JSON name 'fooBar'.*avro"):
        _ProtoTable(event, [(c.name, c.type) for c in event.after.columns], None)
    kept = _event(("id", "bigint", 1), ("foo_bar", "int", 3))  # fooBar dropped: it stays
    with pytest.raises(ValueError, match="'foo_bar' and 'fooBar'"):
        _ProtoTable(kept, [(c.name, c.type) for c in kept.after.columns],
                    {"id": Field(1, "int64", False), "fooBar": Field(2, "int32", True)})
