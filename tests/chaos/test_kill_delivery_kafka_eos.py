"""kill -9 of the real delivery job (Spark) three times while it writes to Kafka with
`exactly_once: true`: a read_committed consumer sees every change once, in order."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

pytestmark = pytest.mark.chaos

TX, ROWS_PER_TX = 100, 50
KILLS = 3


def committed_events(brokers: str, topic: str) -> list[dict]:
    import json

    consumer = Consumer({"bootstrap.servers": brokers, "group.id": f"g{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out, done, deadline = [], False, time.monotonic() + 60
    while not done and time.monotonic() < deadline:
        for msg in consumer.consume(5000, 0.5):
            if msg.error():
                done = True
            else:
                out.append(json.loads(msg.value()))
    consumer.close()
    return out


def test_delivery_job_kill9_with_kafka_exactly_once(pg_db, pg_redis_pipeline, noida_kafka):
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    topic = f"eos{uuid.uuid4().hex[:6]}.acct"
    pipeline = pg_redis_pipeline(
        tables="[public.acct]",
        sink=f'{{id: k1, type: kafka, brokers: "{noida_kafka.bootstrap}", topic: "{topic}", '
             'exactly_once: true}', extra="")
    pipeline.start_all()
    pipeline.wait_for(lambda: "batch delivered" in pipeline.log_tail("delivery"), 180,
                      "the delivery job's first batch")

    def write() -> None:  # 100 transactions updating 50 keys each: per-key order matters
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for t in range(TX):
                with conn.transaction(), conn.cursor() as cur:
                    if t == 0:
                        cur.executemany("INSERT INTO acct VALUES (%s, 0)",
                                        [(k,) for k in range(ROWS_PER_TX)])
                    else:
                        cur.executemany("UPDATE acct SET v = %s WHERE id = %s",
                                        [(t, k) for k in range(ROWS_PER_TX)])
                time.sleep(0.15)

    writer = threading.Thread(target=write)
    writer.start()
    rng = random.Random(11)
    for _ in range(KILLS):
        time.sleep(rng.uniform(4, 9))
        pipeline.kill("delivery")
        time.sleep(1)
        pipeline.start("delivery")
    writer.join()

    total = TX * ROWS_PER_TX
    pipeline.wait_for(lambda: len(committed_events(noida_kafka.bootstrap, topic)) >= total, 300,
                      f"{total} committed events")
    time.sleep(3)
    events = committed_events(noida_kafka.bootstrap, topic)
    ids = [e["id"] for e in events]
    print(f"\n{KILLS} kills of the delivery job: {len(events)} read_committed events "
          f"for {total} changes, {len(ids) - len(set(ids))} duplicates")
    assert len(ids) == len(set(ids)) == total, "every change exactly once"
    per_key: dict[int, list[int]] = defaultdict(list)
    for e in events:
        per_key[e["after"]["id"]].append(e["after"]["v"])
    assert all(vs == [0, *range(1, TX)] for vs in per_key.values()), "per-key source order"
    by_tx: dict[str, list[int]] = defaultdict(list)
    for e in events:
        by_tx[e["tx"]["id"]].append(e["tx"]["index"])
    assert all(sorted(ix) == list(range(ROWS_PER_TX)) for ix in by_tx.values()), \
        "every transaction whole"
