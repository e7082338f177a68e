"""An initial snapshot through the whole pipeline: capture, bus, Spark delivery, and the
three exactly-once sinks (Redis streams, a PostgreSQL replica, Kafka `exactly_once` read
committed), while a writer changes the same keys. Each sink ends with the source's rows;
Redis and Kafka hold no read twice and, per key, never a read older than a change before it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from tailrace.proto import control_pb2 as pb
from tests.fix_sinks import read_kafka
from tests.integration.test_pg_snapshot import ROWS, TABLES, Writer, seed, state_of

pytestmark = pytest.mark.integration

KEYS = {"accounts": ("id",), "orders": ("id",), "notes": ("region", "id")}
COLUMNS = {"accounts": ("id", "balance", "note"), "orders": ("id", "amount", "status"),
           "notes": ("region", "id", "body")}


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def replay(entries: dict[str, list[dict[str, Any]]]) -> tuple[dict[Any, tuple[Any, ...]],
                                                              Counter[Any]]:
    """Each table's stream applied in order: what a consumer of the sink ends with."""
    state: dict[Any, tuple[Any, ...]] = {}
    reads: Counter[Any] = Counter()
    for table, events in entries.items():
        for event in events:
            image = event["after"] if event["op"] in ("read", "insert", "update") \
                else event["before"]
            key = (table, tuple(_text(image[k]) for k in KEYS[table]))
            if event["op"] == "update" and event["before"]:
                old = (table, tuple(_text(event["before"][k]) for k in KEYS[table]))
                state.pop(old, None)
            if event["op"] == "delete":
                state.pop(key, None)
                continue
            row = tuple(_text(image[c]) for c in COLUMNS[table])
            if event["op"] == "read":
                reads[key] += 1
            state[key] = row
    return state, reads


def test_initial_snapshot_reaches_redis_postgres_and_kafka_with_no_duplicate(
        pg_db: str, pg_server: Any, pg_redis_pipeline: Any, redis_server: Any,
        noida_kafka: Any) -> None:
    seed(pg_db)
    replica = pg_server.create_database(f"r_{uuid.uuid4().hex[:12]}")
    prefix = f"s{uuid.uuid4().hex[:8]}"
    pipeline = pg_redis_pipeline(
        tables="[public.accounts, public.orders, public.notes]",
        sink=f'{{id: redis1, type: redis, url: "{redis_server.url}", '
             f'stream: "{prefix}.{{table}}"}}\n'
             f'    - {{id: pg1, type: postgres, dsn: "{replica}"}}\n'
             f'    - {{id: kafka1, type: kafka, brokers: "{noida_kafka.bootstrap}", '
             f'topic: "{prefix}.{{table}}", exactly_once: true}}',
        source="snapshot: {mode: initial, chunk_size: 5000}")
    pipeline.start_all()
    control = pipeline.control_client()
    name = pipeline.spec_path.stem
    writer = Writer(pg_db)
    writer.start()
    started = time.monotonic()

    def snapshot_done() -> bool:
        state = control.snapshot_state(name)
        return sum(t.state == pb.SNAPSHOT_DONE for t in state.tables) == len(TABLES)

    pipeline.wait_for(snapshot_done, 300, "the snapshot of three tables")
    took = time.monotonic() - started
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None, writer.error
    source = state_of(pg_db)

    def replica_state() -> dict[Any, tuple[str, ...]] | None:
        try:
            return state_of(replica)
        except psycopg.errors.UndefinedTable:
            return None

    pipeline.wait_for(lambda: replica_state() == source, 300,
                      "the PostgreSQL replica equal to the source")
    entries = {t: pipeline.stream_entries(f"{prefix}.{t}") for t in TABLES}
    redis_state, reads = replay(entries)
    assert redis_state == source, "Redis streams replayed equal the source"
    assert max(reads.values()) == 1, "no key read twice"
    rows_done = sum(t.rows_done for t in control.snapshot_state(name).tables)
    assert sum(reads.values()) == rows_done

    def kafka_entries() -> dict[str, list[dict[str, Any]]]:
        topics = [f"{prefix}.{t}" for t in TABLES]
        out: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
        known = AdminClient({"bootstrap.servers": noida_kafka.bootstrap}).list_topics(timeout=10)
        if not set(topics) <= set(known.topics):
            return out  # the sink has not written to each table's topic yet
        for m in read_kafka(noida_kafka.bootstrap, topics):  # read committed
            if m.value() is not None:  # a tombstone after a delete
                out[m.topic().split(".", 1)[1]].append(json.loads(m.value()))
        return out

    pipeline.wait_for(lambda: replay(kafka_entries())[0] == source, 300,
                      "the Kafka topics replayed equal to the source")
    kafka_state, kafka_reads = replay(kafka_entries())
    assert max(kafka_reads.values()) == 1, "no key read twice in Kafka"
    assert sum(kafka_reads.values()) == rows_done
    control.close()
    print(f"\n{sum(ROWS.values())} rows snapshotted in {took:.1f} s with {writer.transactions} "
          f"writer transactions: {sum(reads.values())} reads and "
          f"{sum(len(e) for e in entries.values()) - sum(reads.values())} changes in Redis; "
          f"Redis and Kafka replayed and the PostgreSQL replica all equal the source "
          f"({len(source)} rows)")
