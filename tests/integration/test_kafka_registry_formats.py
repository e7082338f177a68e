"""`format: json_schema` and `format: protobuf` through the whole pipeline: PostgreSQL ->
capture -> Spark delivery -> Kafka (exactly_once), the schemas registered in the control
service's own registry, read by Confluent's `JSONDeserializer` (which validates each value
against the schema its id names) and `ProtobufDeserializer` (which reads the writer's
schema from the registry as a serialized descriptor) with Confluent's `SchemaRegistryClient`.

Each: every column type the Avro test covers and NULLs; a column added mid-stream registers
version 2 (JSON: the new schema validates the old data; Protobuf: a consumer still holding
version 1's message reads version 2's data, and the new column takes a new field number);
a TOAST value the server did not send is Debezium's placeholder, not NULL; a delete and its
tombstone; a column's type change, which the registry refuses, sends that event to the
DLQ, loudly, while the pipeline goes on; and a dropped column keeps its field (no new
version, no number used again).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from tests.fix_registry import RegistryRun

pytestmark = pytest.mark.integration

BIG = "".join(f"{i:08x}" for i in range(4000))  # 32 kB of little redundancy: stored TOASTed
PLACED = dt.datetime(2026, 11, 28, 12, 30, 15, 123456, tzinfo=dt.UTC)
EPOCH = dt.datetime(1970, 1, 1)
COLUMNS = ("total", "placed", "local_at", "day", "note", "doc", "raw", "tags", "big", "qty")


class Run(RegistryRun):
    """The pipeline of `orders` with a column of each type (and `qty`, retyped later)."""

    def __init__(self, pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any, fmt: str) -> None:
        super().__init__(pg_db, pg_redis_pipeline, noida_kafka, fmt,
                         "CREATE TABLE orders (id bigint PRIMARY KEY, total numeric(12,2), "
                         "placed timestamptz, local_at timestamp, day date, note text, "
                         "doc jsonb, raw bytea, tags text[], big text, qty int)")

    def first_rows(self) -> None:
        with psycopg.connect(self.pg_db, autocommit=True) as conn:
            for i in range(1, 41):
                conn.execute("INSERT INTO orders (id, " + ", ".join(COLUMNS) + ") VALUES ("
                             + ", ".join(["%s"] * (len(COLUMNS) + 1)) + ")",
                             (i, Decimal(i) / 4, PLACED, PLACED.replace(tzinfo=None),
                              dt.date(2026, 1, i % 28 + 1), f"n{i}", json.dumps({"i": i}),
                              bytes([i, 0, 255]), [f"t{i}", None], BIG, i))
        self.sql("INSERT INTO orders (id) VALUES (41)")  # every other column NULL

    def evolve(self) -> None:
        self.sql("ALTER TABLE orders ADD COLUMN extra int",
                 "INSERT INTO orders (id, total, extra) VALUES (42, 1.5, 7)",
                 "UPDATE orders SET total = 9.99 WHERE id = 1",  # big: unchanged TOAST
                 "DELETE FROM orders WHERE id = 2")

    def refused_type_change(self, count: int) -> str:
        """qty int -> text (refused: row 43 to the DLQ) -> int again (row 44 goes on)."""
        self.sql("ALTER TABLE orders ALTER COLUMN qty TYPE text",
                 "INSERT INTO orders (id, qty) VALUES (43, 'x')",
                 "ALTER TABLE orders ALTER COLUMN qty TYPE int USING NULLIF(qty, 'x')::int",
                 "INSERT INTO orders (id, qty) VALUES (44, 3)")
        reason = self.refused(count, [1, 2])
        assert "qty" in reason, reason
        return reason

    def dropped_column(self, count: int) -> list[Any]:
        """note dropped: its field stays in the schema, so no new version."""
        self.sql("ALTER TABLE orders DROP COLUMN note",
                 "INSERT INTO orders (id, qty) VALUES (45, 5)")
        messages = self.wait_for(count, "the record after the dropped column")
        assert self.registry.get_versions(self.subject) == [1, 2]
        return messages


def test_json_schema_read_by_confluents_deserializer_with_schema_evolution(
        pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any) -> None:
    run = Run(pg_db, pg_redis_pipeline, noida_kafka, "json_schema")
    registry = run.registry
    keys, values = JSONDeserializer(None, schema_registry_client=registry), \
        JSONDeserializer(None, schema_registry_client=registry)  # validates by the writer's
    run.first_rows()
    first = run.decoded(run.wait_for(41, "the first 41 records"), keys, values)
    key, value = first[0]
    assert key == {"id": 1}
    after = value["after"]
    assert (value["op"], value["before"]) == ("c", None)
    assert after == {
        "id": 1, "total": "0.25", "placed": "2026-11-28T12:30:15.123456Z",
        "local_at": (PLACED.replace(tzinfo=None) - EPOCH) // dt.timedelta(microseconds=1),
        "day": (dt.date(2026, 1, 2) - EPOCH.date()).days, "note": "n1", "doc": '{"i": 1}',
        "raw": base64.b64encode(bytes([1, 0, 255])).decode(), "tags": ["t1", None],
        "big": BIG, "qty": 1}
    assert value["source"]["table"] == "orders" and value["source"]["connector"] == "postgresql"
    assert first[-1][1]["after"] == {"id": 41, **{c: None for c in COLUMNS}}
    v1 = registry.get_version(run.subject, 1)
    assert v1.schema.schema_type == "JSON"
    assert json.loads(v1.schema.schema_str)["$schema"] == "http://json-schema.org/draft-07/schema#"

    run.evolve()
    later = run.decoded(run.wait_for(45, "the records after the new column")[41:], keys, values)
    assert registry.get_versions(run.subject) == [1, 2], "the new column: version 2"
    assert [(k["id"], v and v["op"]) for k, v in later] == [(42, "c"), (1, "u"), (2, "d"),
                                                           (2, None)], "delete, then tombstone"
    assert later[0][1]["after"]["extra"] == 7
    assert later[1][1]["after"]["total"] == "9.99"
    assert later[1][1]["after"]["big"] == "__debezium_unavailable_value"
    v2 = registry.get_version(run.subject, 2).schema
    upgraded = JSONDeserializer(v2, schema_registry_client=registry)  # validates by v2
    assert [v["after"]["id"] for _, v in run.decoded(run.received()[:41], keys, upgraded)] \
        == list(range(1, 42)), "version 2 reads what version 1 wrote"

    reason = run.refused_type_change(46)
    assert [k["id"] for k, _ in run.decoded(run.received()[45:], keys, values)] == [44]
    [(_, dropped)] = run.decoded(run.dropped_column(47)[46:], keys, values)
    assert dropped["after"]["qty"] == 5 and "note" not in dropped["after"]
    print(f"\n47 records in JSON Schema; the refused change in the DLQ: {reason[:200]}")


def _message_class(run: Run, subject: str, version: int, name: str) -> Any:
    """The message `name` of a registered Protobuf schema, as Confluent's client serves it."""
    served = run.client().get_version(subject, version, fmt="serialized").schema.schema_str
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(served))
    proto.name = f"{subject}-{version}.proto"
    timestamp = descriptor_pb2.FileDescriptorProto.FromString(
        timestamp_pb2.DESCRIPTOR.serialized_pb)
    classes = message_factory.GetMessages([timestamp, proto], descriptor_pool.DescriptorPool())
    return classes[f"{proto.package}.{name}"]


def test_protobuf_read_by_confluents_deserializer_with_schema_evolution(
        pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any) -> None:
    run = Run(pg_db, pg_redis_pipeline, noida_kafka, "protobuf")
    registry, serde = run.registry, run.client()
    run.first_rows()
    messages = run.wait_for(41, "the first 41 records")
    assert messages[0].value()[5:6] == b"\x00", "message indexes [0]: one byte 0"
    envelope_v1 = _message_class(run, run.subject, 1, "Envelope")
    keys = ProtobufDeserializer(_message_class(run, f"{run.topic}-key", 1, "Key"),
                                schema_registry_client=serde)
    values = ProtobufDeserializer(envelope_v1, schema_registry_client=serde)
    first = run.decoded(messages, keys, values)
    key, value = first[0]
    assert key.id == 1
    after = value.after
    assert (value.op, value.HasField("before")) == ("c", False)
    assert after.id == 1 and after.total == "0.25"
    assert after.placed.ToDatetime(tzinfo=dt.UTC) == PLACED
    assert after.local_at == (PLACED.replace(tzinfo=None) - EPOCH) // dt.timedelta(microseconds=1)
    assert after.day == (dt.date(2026, 1, 2) - EPOCH.date()).days
    assert (after.note, json.loads(after.doc), after.raw) == ("n1", {"i": 1}, bytes([1, 0, 255]))
    assert [(i.HasField("value"), i.value) for i in after.tags.items] == [(True, "t1"),
                                                                          (False, "")]
    assert after.big == BIG and after.qty == 1
    assert value.source.table == "orders" and value.source.connector == "postgresql"
    empty = first[-1][1].after
    assert empty.id == 41 and not any(empty.HasField(c) for c in COLUMNS), "NULL: unset"
    numbers = {f.name: f.number for f in envelope_v1.DESCRIPTOR.fields_by_name["after"]
               .message_type.fields}
    assert numbers == {"id": 1, **{c: i for i, c in enumerate(COLUMNS, 2)}}
    assert registry.get_version(run.subject, 1).schema.schema_type == "PROTOBUF"

    run.evolve()
    later = run.decoded(run.wait_for(45, "the records after the new column")[41:], keys, values)
    assert registry.get_versions(run.subject) == [1, 2], "the new column: version 2"
    assert [(k.id, v and v.op) for k, v in later] == [(42, "c"), (1, "u"), (2, "d"), (2, None)]
    assert later[1][1].after.total == "9.99"
    assert later[1][1].after.big == "__debezium_unavailable_value"
    envelope_v2 = _message_class(run, run.subject, 2, "Envelope")
    new_after = envelope_v2.DESCRIPTOR.fields_by_name["after"].message_type
    assert new_after.fields_by_name["extra"].number == len(COLUMNS) + 2, "the next number"
    with_v2 = ProtobufDeserializer(envelope_v2, schema_registry_client=serde)
    [(_, read_new)] = run.decoded(run.received()[41:42], keys, with_v2)
    assert read_new.after.extra == 7
    assert later[0][1].after.id == 42 and not hasattr(later[0][1].after, "extra"), \
        "a consumer still on version 1 reads version 2's data"

    reason = run.refused_type_change(46)
    assert [k.id for k, _ in run.decoded(run.received()[45:], keys, values)] == [44]
    [(_, dropped)] = run.decoded(run.dropped_column(47)[46:], keys, values)
    assert dropped.after.qty == 5 and not dropped.after.HasField("note")
    print(f"\n47 records in Protobuf; the refused change in the DLQ: {reason[:200]}")
