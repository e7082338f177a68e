"""REPLICA IDENTITY FULL on real servers: the key is the primary key, not the whole row.

Under FULL pgoutput flags every column as identity. The event key must still be the
table's primary key (or its replica-identity index), or one row's versions hash to
different partitions and the PostgreSQL sink keys its target table on every column.
The first tests capture a real PostgreSQL under each replica identity and hand what
the capture service put on the bus to the real sinks: Kafka on multi-partition topics,
the PostgreSQL sink, the Debezium key. The last one runs the whole pipeline (capture,
control, the Spark delivery job) into all four sinks.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition  # type: ignore[attr-defined]
from nats.js.errors import NotFoundError

from tailrace.devservers import free_port
from tailrace.events import ChangeEvent, Op
from tailrace_services.delivery.sinks.base import BatchCommit, PerEventError
from tailrace_services.delivery.sinks.kafka import KafkaSink, TransactionalKafkaSink
from tailrace_services.delivery.sinks.postgres import PostgresSink
from tests.fix_capture import column
from tests.fix_control import new_token, write_secret
from tests.fix_pipeline import RunningPipeline
from tests.fix_sinks import batches_of, sink_spec

pytestmark = pytest.mark.integration

LEDGER = """
CREATE TABLE ledger (id int PRIMARY KEY, version int NOT NULL, note text, big text);
ALTER TABLE ledger REPLICA IDENTITY FULL;
ALTER TABLE ledger ALTER COLUMN big SET STORAGE EXTERNAL;
"""
BIG = "".join(f"{i:05d}" for i in range(4000))  # 20 kB, stored out of line (TOAST)


class Ledger:
    """Random transactions on `ledger`: inserts (with NULL notes and TOASTed `big`), updates
    that mostly leave `big` alone, deletes, re-inserts. Every change of a row bumps its
    `version`; `expected[id]` lists (op, version) in commit order."""

    def __init__(self, keys: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.keys = keys
        self.live: dict[int, int] = {}  # id -> version
        self.last: dict[int, int] = {}  # id -> last version used, also across a delete
        self.expected: dict[int, list[tuple[str, int]]] = defaultdict(list)
        self.total = 0

    def run(self, conn: psycopg.Connection[Any], transactions: int) -> None:
        for _ in range(transactions):
            with conn.transaction(), conn.cursor() as cur:
                for _ in range(self.rng.randint(1, 6)):
                    self._change(cur)

    def _change(self, cur: psycopg.Cursor[Any]) -> None:
        rng, key = self.rng, self.rng.randrange(self.keys)
        note = None if rng.random() < 0.3 else f"n{rng.randrange(1000)}"
        self.total += 1
        if key in self.live and rng.random() < 0.15:
            cur.execute("DELETE FROM ledger WHERE id = %s", (key,))
            self.expected[key].append(("delete", self.live.pop(key)))
            return
        version = self.last[key] = self.last.get(key, 0) + 1
        if key not in self.live:
            cur.execute("INSERT INTO ledger VALUES (%s, %s, %s, %s)",
                        (key, version, note, BIG if rng.random() < 0.6 else None))
            op = "insert"
        elif rng.random() < 0.1:
            cur.execute("UPDATE ledger SET version = %s, note = %s, big = %s WHERE id = %s",
                        (version, note, f"short {version}", key))
            op = "update"
        else:
            cur.execute("UPDATE ledger SET version = %s, note = %s WHERE id = %s",
                        (version, note, key))
            op = "update"
        self.live[key] = version
        self.expected[key].append((op, version))


def source_rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()


def read_partitions(brokers: str, topic: str, partitions: int, timeout: float = 30) -> list[Any]:
    """Every message of every partition of `topic`, `read_committed`, up to its end."""
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": f"g{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Any] = []
    ended: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(ended) < partitions and time.monotonic() < deadline:
        for msg in consumer.consume(5000, 0.5):
            if msg.error():
                ended.add(msg.partition())
            else:
                out.append(msg)
    consumer.close()
    assert len(ended) == partitions, f"{topic}: not every partition read to its end"
    return out

IDENTITIES = LEDGER + """
CREATE TABLE pair (region text, id int, note text, PRIMARY KEY (id, region));
ALTER TABLE pair REPLICA IDENTITY FULL;
CREATE TABLE nokey (id int, note text);
ALTER TABLE nokey REPLICA IDENTITY FULL;
CREATE TABLE by_code (id int PRIMARY KEY, code text NOT NULL, note text);
CREATE UNIQUE INDEX by_code_code ON by_code (code);
ALTER TABLE by_code REPLICA IDENTITY USING INDEX by_code_code;
CREATE TABLE plain (id int PRIMARY KEY, note text);
CREATE TABLE append_only (id int PRIMARY KEY, note text);
ALTER TABLE append_only REPLICA IDENTITY NOTHING;
"""


def capture(pg_db: str, capture_rig: Any, tables: str, changes: Any, *, partitions: int = 1
            ) -> tuple[Any, list[tuple[int, int, ChangeEvent]]]:
    """Start capture, run `changes()` (returns how many changes it made), read them back:
    (capture process, [(bus partition, offset, event)] in offset order per partition)."""
    rig = capture_rig(pg_db, tables, partitions=partitions)
    process = rig.start()
    process.wait_streaming()
    total = changes()
    view = rig.read(lambda v: len(v.events) >= total, timeout=120)
    assert len(view.events) == total, f"{len(view.events)} events on the bus for {total} changes"
    return process, view.events


def row_of(event: ChangeEvent) -> Any:
    return event.before if event.op == Op.OP_DELETE else event.after


def test_keys_under_each_replica_identity_keep_a_row_in_one_bus_partition(
        pg_db: str, capture_rig: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(IDENTITIES)
    ledger = Ledger(keys=40, seed=11)

    def changes() -> int:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            ledger.run(conn, transactions=120)
            conn.execute("INSERT INTO pair VALUES ('eu', 1, NULL), ('us', 1, 'x')")
            conn.execute("UPDATE pair SET note = 'y' WHERE region = 'eu'")
            conn.execute("INSERT INTO nokey VALUES (1, 'a'), (1, 'a')")
            conn.execute("UPDATE nokey SET note = 'b' WHERE id = 1")
            conn.execute("INSERT INTO by_code VALUES (1, 'c1', NULL)")
            conn.execute("UPDATE by_code SET note = 'n' WHERE id = 1")
            conn.execute("DELETE FROM by_code WHERE id = 1")
            conn.execute("INSERT INTO plain VALUES (1, 'p')")
            conn.execute("UPDATE plain SET note = 'q' WHERE id = 1")
            conn.execute("INSERT INTO append_only VALUES (1, 'a')")
        return ledger.total + 13  # pair 3, nokey 4, by_code 3, plain 2, append_only 1

    process, events = capture(pg_db, capture_rig, "[public.*]", changes, partitions=3)
    keys = {e.table: list(e.key_columns) for _, _, e in events}
    assert keys == {"ledger": ["id"], "pair": ["region", "id"], "nokey": [], "by_code": ["code"],
                    "plain": ["id"], "append_only": ["id"]}
    log = process.log()
    assert '"table": "public.nokey"' in log and "selected table has no key" in log
    assert '"replica_identity": "FULL"' in log
    assert "add a primary key to public.nokey, or ALTER TABLE public.nokey REPLICA IDENTITY " \
           "USING INDEX" in log

    partitions: dict[int, set[int]] = defaultdict(set)
    versions: dict[int, list[tuple[int, int]]] = defaultdict(list)  # id -> (offset, version)
    filled = 0
    for partition, offset, event in events:
        if event.table != "ledger":
            continue
        key = column(row_of(event), "id")
        partitions[key].add(partition)
        versions[key].append((offset, column(row_of(event), "version")))
        if event.op in (Op.OP_UPDATE, Op.OP_DELETE):
            assert {c.name for c in event.before.columns} == {"id", "version", "note", "big"}
        if event.op == Op.OP_UPDATE:
            assert all(c.value.WhichOneof("kind") != "unchanged_toast" for c in event.after.columns)
            if column(event.after, "big") == BIG and column(event.before, "big") == BIG:
                filled += 1
    spread = {next(iter(p)) for p in partitions.values()}
    print(f"\nledger under FULL on 3 bus partitions: {ledger.total} changes of "
          f"{len(partitions)} rows, rows in partitions {sorted(spread)}, "
          f"{filled} updates with the unchanged TOAST value filled from the before-image")
    assert all(len(p) == 1 for p in partitions.values()), "every version of a row, one partition"
    assert len(spread) > 1, "the rows are spread over the partitions"
    for key, seen in versions.items():
        assert [v for _, v in sorted(seen)] == [v for _, v in ledger.expected[key]], key
    assert filled > 0

    by_code = [e for _, _, e in events if e.table == "by_code"]
    assert [c.name for c in by_code[1].before.columns] == ["code"]  # the index is the identity


def test_kafka_sink_keeps_each_row_in_one_partition_in_order_and_debezium_keys_by_the_pk(
        pg_db: str, capture_rig: Any, noida_kafka: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(LEDGER)
    ledger = Ledger(keys=80, seed=5)

    def changes() -> int:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            ledger.run(conn, transactions=200)
        return ledger.total

    _, bus = capture(pg_db, capture_rig, "[public.ledger]", changes)
    events = [e for _, _, e in bus]
    prefix = f"f{uuid.uuid4().hex[:8]}"
    noida_kafka.create_topic(f"{prefix}.native.ledger", 4)
    noida_kafka.create_topic(f"{prefix}.dbz.ledger", 4)
    native = KafkaSink(sink_spec(id="k1", type="kafka", brokers=noida_kafka.bootstrap,
                                 topic=prefix + ".native.{table}"), timeout_s=10)
    dbz = TransactionalKafkaSink(sink_spec(id="k2", type="kafka", brokers=noida_kafka.bootstrap,
                                           topic=prefix + ".dbz.{table}", exactly_once=True,
                                           envelope="debezium"), timeout_s=10)
    for batch in batches_of(events, 150):
        for sink in (native, dbz):
            sink.write(batch, BatchCommit(pipeline="p", source_id="src", sink_id=sink.id,
                                          position=batch[-1].position))
    native.close()
    dbz.close()

    for name, topic in (("native", f"{prefix}.native.ledger"), ("debezium", f"{prefix}.dbz.ledger")):
        messages = read_partitions(noida_kafka.bootstrap, topic, 4)
        per_key: dict[int, list[tuple[str, int]]] = defaultdict(list)
        partitions: dict[int, set[int]] = defaultdict(set)
        tombstones = 0
        for msg in messages:
            if msg.value() is None:  # debezium: the tombstone after a delete, same key
                row_id = json.loads(msg.key())["payload"]["id"]
                assert per_key[row_id][-1][0] == "delete" and partitions[row_id] == {
                    msg.partition()}
                tombstones += 1
                continue
            key, value = json.loads(msg.key()), json.loads(msg.value())
            if name == "native":
                assert set(key["pk"]) == {"id"} and key["table"].endswith(".public.ledger")
                row_id, doc = key["pk"]["id"], value
            else:
                assert key["schema"]["name"].endswith(".public.ledger.Key")
                assert [f["field"] for f in key["schema"]["fields"]] == ["id"]
                row_id, doc = key["payload"]["id"], value["payload"]
            op = {"c": "insert", "u": "update", "d": "delete"}.get(doc["op"], doc["op"])
            row = doc["before"] if op == "delete" else doc["after"]
            assert row["id"] == row_id
            per_key[row_id].append((op, row["version"]))
            partitions[row_id].add(msg.partition())
        used = {p for ps in partitions.values() for p in ps}
        print(f"\nkafka {name} under FULL, 4 partitions: {len(messages)} messages for "
              f"{len(events)} changes of {len(per_key)} rows, partitions used {sorted(used)}")
        deletes = sum(op == "delete" for seen in ledger.expected.values() for op, _ in seen)
        assert tombstones == (deletes if name == "debezium" else 0)
        assert len(messages) == len(events) + tombstones
        assert all(len(p) == 1 for p in partitions.values()), "a row's versions in one partition"
        assert len(used) > 1
        assert dict(per_key) == dict(ledger.expected), "per row, every version in source order"


@pytest.fixture
def replica_db(pg_server: Any) -> Iterator[str]:
    name = f"r_{uuid.uuid4().hex[:12]}"
    dsn = pg_server.create_database(name)
    yield dsn
    pg_server.drop_database(name)


def test_postgres_sink_upserts_and_deletes_by_the_primary_key_under_full(
        pg_db: str, replica_db: str, capture_rig: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(LEDGER + "CREATE TABLE nokey (id int, note text);"
                              "ALTER TABLE nokey REPLICA IDENTITY FULL;")
    ledger = Ledger(keys=50, seed=9)

    def changes() -> int:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            ledger.run(conn, transactions=150)
            conn.execute("UPDATE ledger SET id = 1000 + id, version = version + 1, note = NULL "
                         "WHERE id = (SELECT min(id) FROM ledger)")  # a key change moves the row
            conn.execute("INSERT INTO nokey VALUES (1, 'a')")
            conn.execute("UPDATE nokey SET note = 'b'")
        return ledger.total + 3

    _, bus = capture(pg_db, capture_rig, "[public.ledger, public.nokey]", changes)
    events = [e for _, _, e in bus]
    ledger_events = [e for e in events if e.table == "ledger"]
    sink = PostgresSink(sink_spec(id="pg1", type="postgres", dsn=replica_db), timeout_s=5)
    for batch in batches_of(ledger_events, 100):
        sink.write(batch, BatchCommit(pipeline="p", source_id="src", sink_id="pg1",
                                      position=batch[-1].position))
    source, replica = source_rows(pg_db, "ledger"), source_rows(replica_db, "ledger")
    with psycopg.connect(replica_db) as conn:
        pk = conn.execute("SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a "
                          "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                          "WHERE i.indrelid = 'ledger'::regclass AND i.indisprimary").fetchone()
    nulls = sum(1 for r in source if r[2] is None)
    updates = sum(1 for e in ledger_events if e.op == Op.OP_UPDATE)
    deletes = sum(1 for e in ledger_events if e.op == Op.OP_DELETE)
    print(f"\npostgres sink under FULL: {len(ledger_events)} changes ({updates} updates, "
          f"{deletes} deletes) -> {len(replica)} rows, equal to the source's {len(source)} "
          f"({nulls} with a NULL note)")
    assert pk == (["id"],), "the target's primary key is the source's, not every column"
    assert nulls > 0
    assert replica == source, "upserts by key, deletes applied, the moved row, NULLs and TOAST"

    keyless = [e for e in events if e.table == "nokey"]
    sink.write(keyless[:1], BatchCommit(pipeline="p", source_id="src", sink_id="pg1",
                                        position=keyless[0].position))  # an insert: applied
    with pytest.raises(PerEventError) as failed:
        sink.write(keyless[1:], BatchCommit(pipeline="p", source_id="src", sink_id="pg1",
                                            position=keyless[1].position))
    print(f"keyless update refused: {failed.value}")
    assert failed.value.failures[0][0] == 0
    assert "update of a row of" in str(failed.value) and ".public.nokey without key columns" \
        in str(failed.value)
    assert "add a primary key to public.nokey" in str(failed.value)
    assert source_rows(replica_db, "nokey") == [(1, "a")]
    sink.close()


# -- the whole pipeline: capture, control, the Spark job, four sinks -------------------------

PIPELINE = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: {name}, tenant: acme}}
spec:
  source: {{type: postgres, id: src-{name}, dsn: "{dsn}", tables: [public.ledger]}}
  sinks:
    - {{id: kafka1, type: kafka, brokers: "{kafka}", topic: "{prefix}.{{table}}",
       exactly_once: true, envelope: debezium}}
    - {{id: nats1, type: nats, url: "{nats}", stream: {stream}, subject: "{stream}.{{table}}"}}
    - {{id: redis1, type: redis, url: "{redis}", stream: "{prefix}.{{table}}"}}
    - {{id: pg1, type: postgres, dsn: "{replica}"}}
  bus: {{brokers: "{bus}"}}
  control: {{address: "{control}", token_file: "{token_file}"}}
  batch: {{max_ms: 200}}
"""


def nats_documents(url: str, stream: str) -> list[tuple[str, dict[str, Any]]]:
    """(Nats-Msg-Id, native document) of every message in the stream, in stream order."""
    async def fetch() -> list[tuple[str, dict[str, Any]]]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        info = await js.stream_info(stream)
        msgs = [await js.get_msg(stream, seq) for seq in range(1, info.state.messages + 1)]
        await nc.close()
        return [(m.headers["Nats-Msg-Id"], json.loads(m.data)) for m in msgs]

    return asyncio.run(fetch())


def nats_count(url: str, stream: str) -> int:
    async def fetch() -> int:
        nc = await nats.connect(url)
        try:
            return int((await nc.jetstream().stream_info(stream)).state.messages)
        except NotFoundError:
            return 0
        finally:
            await nc.close()

    return asyncio.run(fetch())


def versions_of(documents: list[dict[str, Any]]) -> dict[int, list[tuple[str, int]]]:
    """Per row, (op, version) in the order given (native documents)."""
    out: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for doc in documents:
        row = doc["before"] if doc["op"] == "delete" else doc["after"]
        out[row["id"]].append((doc["op"], row["version"]))
    return dict(out)


def test_full_identity_through_all_four_sinks_is_exact_with_per_key_order(
        tmp_path: Path, pg_db: str, replica_db: str, kafka_broker: Any, noida_kafka: Any,
        nats_server: Any, redis_server: Any) -> None:
    """The acceptance run: REPLICA IDENTITY FULL through Kafka (a 4-partition topic,
    exactly-once, Debezium envelope), NATS, Redis and PostgreSQL, each exact."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(LEDGER)
    name = f"full-{uuid.uuid4().hex[:8]}"
    prefix, stream = f"f{uuid.uuid4().hex[:8]}", f"S{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.ledger"
    noida_kafka.create_topic(topic, 4)
    control = f"127.0.0.1:{free_port()}"
    spec_path = tmp_path / f"{name}.yaml"
    service_token = write_secret(tmp_path / f"{name}.service.token", new_token())
    admin_token = write_secret(tmp_path / f"{name}.admin.token", new_token())
    spec_path.write_text(PIPELINE.format(
        name=name, dsn=pg_db, kafka=noida_kafka.bootstrap, prefix=prefix, nats=nats_server.url,
        stream=stream, redis=redis_server.url, replica=replica_db, bus=kafka_broker.bootstrap,
        control=control, token_file=service_token))
    pipeline = RunningPipeline(tmp_path, spec_path, control, redis_server.url, topic,
                               service_token, admin_token)
    try:
        pipeline.start_all()
        ledger = Ledger(keys=150, seed=23)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            ledger.run(conn, transactions=300)
        total = ledger.total
        source = source_rows(pg_db, "ledger")
        redis_client = redis.Redis.from_url(redis_server.url)

        def replica_rows() -> list[tuple[Any, ...]] | None:
            try:
                return source_rows(replica_db, "ledger")
            except psycopg.errors.UndefinedTable:  # the sink creates it with its first write
                return None

        def arrived() -> bool:  # the cheap checks first; kafka is read to its end each time
            return (redis_client.xlen(topic) >= total
                    and nats_count(nats_server.url, stream) >= total
                    and replica_rows() == source
                    and sum(m.value() is not None  # not counting tombstones
                            for m in read_partitions(noida_kafka.bootstrap, topic, 4)) >= total)

        pipeline.wait_for(arrived, 400, f"{total} changes in all four sinks")
        time.sleep(2)  # a late duplicate would show now
        kafka = read_partitions(noida_kafka.bootstrap, topic, 4)
        nats_docs = nats_documents(nats_server.url, stream)
        redis_docs = pipeline.stream_entries(topic)
        replica = source_rows(replica_db, "ledger")
    finally:
        pipeline.sup.stop(timeout=10)

    tombstones = [m for m in kafka if m.value() is None]  # one after each delete (debezium)
    kafka = [m for m in kafka if m.value() is not None]
    kafka_ids = [dict(m.headers())["tailrace-event-id"].decode() for m in kafka]
    partitions: dict[int, set[int]] = defaultdict(set)
    kafka_versions: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for msg in kafka:
        key, payload = json.loads(msg.key()), json.loads(msg.value())["payload"]
        assert [f["field"] for f in key["schema"]["fields"]] == ["id"]
        op = {"c": "insert", "u": "update", "d": "delete"}[payload["op"]]
        row = payload["before"] if op == "delete" else payload["after"]
        assert key["payload"] == {"id": row["id"]}
        partitions[row["id"]].add(msg.partition())
        kafka_versions[row["id"]].append((op, row["version"]))
    used = sorted({p for ps in partitions.values() for p in ps})
    nats_ids = [i for i, _ in nats_docs]
    redis_ids = [d["id"] for d in redis_docs]
    expected = dict(ledger.expected)
    print(f"\nREPLICA IDENTITY FULL, {total} changes of {len(expected)} rows "
          f"({len(source)} rows at the end):"
          f"\n  kafka (4 partitions, exactly-once, debezium): {len(kafka)} messages, "
          f"{len(kafka_ids) - len(set(kafka_ids))} duplicates, partitions used {used}, "
          f"{sum(len(p) > 1 for p in partitions.values())} rows in more than one partition"
          f"\n  nats: {len(nats_docs)} messages, {len(nats_ids) - len(set(nats_ids))} duplicates"
          f"\n  redis: {len(redis_docs)} entries, {len(redis_ids) - len(set(redis_ids))} duplicates"
          f"\n  postgres: {len(replica)} rows, equal to the source: {replica == source}")
    assert len(kafka) == len(set(kafka_ids)) == total
    assert len(tombstones) == sum(op == "delete" for seen in expected.values() for op, _ in seen)
    assert all(len(p) == 1 for p in partitions.values()) and len(used) > 1
    assert dict(kafka_versions) == expected, "kafka: every row's versions once, in order"
    assert len(nats_docs) == len(set(nats_ids)) == total
    assert versions_of([d for _, d in nats_docs]) == expected, "nats: per row, in order"
    assert len(redis_docs) == len(set(redis_ids)) == total
    assert versions_of(redis_docs) == expected, "redis: per row, in order"
    assert replica == source
