"""`format: avro` through the whole pipeline: PostgreSQL -> capture -> Spark delivery ->
Kafka (exactly_once), the schemas registered in the control service's own registry, read
by Confluent's `AvroDeserializer` with Confluent's `SchemaRegistryClient`.

Every column type arrives as its Avro logical type (decimal, timestamp with and without
zone, date, bytes, arrays, JSON as text, NULL); a column added mid-stream registers version
2, which a consumer holding version 1 as its reader schema still reads (BACKWARD); a TOAST
value the server did not send is Debezium's placeholder, not NULL; and a change the
registry refuses (a decimal's scale) sends those events to the DLQ, loudly, while the
pipeline goes on.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer

from tests.fix_registry import RegistryRun

pytestmark = pytest.mark.integration

BIG = "".join(f"{i:08x}" for i in range(4000))  # 32 kB of little redundancy: stored TOASTed


def test_avro_records_read_by_confluents_deserializer_with_schema_evolution(
        pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any) -> None:
    run = RegistryRun(pg_db, pg_redis_pipeline, noida_kafka, "avro",
                      "CREATE TABLE orders (id bigint PRIMARY KEY, total numeric(12,2), "
                      "placed timestamptz, local_at timestamp, day date, note text, doc jsonb, "
                      "raw bytea, tags text[], big text)")
    registry, pipeline, received = run.registry, run.pipeline, run.received
    values, keys = AvroDeserializer(registry), AvroDeserializer(registry)

    def decoded(messages: list[Any], reader: AvroDeserializer | None = None
                ) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
        return run.decoded(messages, keys, reader or values)

    placed = dt.datetime(2026, 11, 28, 12, 30, 15, 123456, tzinfo=dt.UTC)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for i in range(1, 41):
            conn.execute("INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                         (i, Decimal(i) / 4, placed, placed.replace(tzinfo=None),
                          dt.date(2026, 1, i % 28 + 1), f"n{i}", json.dumps({"i": i}),
                          bytes([i, 0, 255]), [f"t{i}", None], BIG))
        conn.execute("INSERT INTO orders (id) VALUES (41)")  # every other column NULL
    pipeline.wait_for(lambda: len(received()) >= 41, 240, "the first 41 records")
    first = decoded(received())
    key, value = first[0]
    assert key == {"id": 1}
    after = value["after"]
    assert (value["op"], value["before"]) == ("c", None)
    assert after["total"] == Decimal("0.25") and after["placed"] == placed
    assert after["local_at"] == placed.replace(tzinfo=None)
    assert after["day"] == dt.date(2026, 1, 2) and after["raw"] == bytes([1, 0, 255])
    assert json.loads(after["doc"]) == {"i": 1} and after["tags"] == ["t1", None]
    assert after["big"] == BIG
    assert value["source"]["table"] == "orders" and value["source"]["connector"] == "postgresql"
    assert first[-1][1]["after"] == {"id": 41, **{c: None for c in (
        "total", "placed", "local_at", "day", "note", "doc", "raw", "tags", "big")}}
    subject = run.subject
    assert registry.get_versions(subject) == [1]
    v1 = registry.get_version(subject, 1).schema.schema_str

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders ADD COLUMN extra int")
        conn.execute("INSERT INTO orders (id, total, extra) VALUES (42, 1.5, 7)")
        conn.execute("UPDATE orders SET total = 9.99 WHERE id = 1")  # big: unchanged TOAST
        conn.execute("DELETE FROM orders WHERE id = 2")
    pipeline.wait_for(lambda: len(received()) >= 45, 180, "the records after the new column")
    later = decoded(received()[41:])
    assert registry.get_versions(subject) == [1, 2], "the new column: version 2"
    assert [(k["id"], v and v["op"]) for k, v in later] == [(42, "c"), (1, "u"), (2, "d"),
                                                           (2, None)], "delete, then tombstone"
    assert later[0][1]["after"]["extra"] == 7
    updated = later[1][1]["after"]
    assert updated["total"] == Decimal("9.99") and updated["big"] == "__debezium_unavailable_value"
    old_reader = AvroDeserializer(registry, schema_str=v1)  # a consumer not yet upgraded
    [(_, with_v1)] = decoded(received()[41:42], old_reader)
    assert with_v1["after"]["id"] == 42 and "extra" not in with_v1["after"]

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders ALTER COLUMN total TYPE numeric(12,4)")
        conn.execute("INSERT INTO orders (id, total) VALUES (43, 2.5)")
        conn.execute("ALTER TABLE orders ALTER COLUMN total TYPE numeric(12,2)")
        conn.execute("INSERT INTO orders (id, total) VALUES (44, 3.5)")
    reason = run.refused(46, [1, 2])
    assert [k["id"] for k, _ in decoded(received()[45:])] == [44], "43 was refused, alone"
    print(f"\n46 records in Avro; schema versions {registry.get_versions(subject)}; "
          f"the refused change in the DLQ: {reason[:160]}")
