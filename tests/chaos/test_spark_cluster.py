"""Delivery on a standalone Spark cluster (issue 17 item 5): `tailrace-delivery --master
spark://…` against a master and a worker in their own JVMs (tests/fix_spark.py), with
`bus.partitions: 2` (two tasks a batch, on the worker's 2 executor cores). 50,000 changes go
to Kafka exactly-once and to Redis; an executor JVM is killed -9 while batches run (after
the sinks received part of the workload): Spark retries the batch on a new executor, and
both sinks hold every change once, in order per key.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from tests.fix_matrix import count_values
from tests.fix_pipeline import reached, values_per_key, write_account_tx
from tests.fix_sinks import read_kafka

pytestmark = pytest.mark.chaos

KEYS = 500
TRANSACTIONS = 100  # 50,000 changes


@pytest.mark.matrix(
    scenario="delivery on a standalone Spark cluster (master + worker JVMs, bus.partitions 2), "
             "an executor JVM killed -9 mid-workload; Kafka exactly-once and Redis sinks",
    guarantee="executors run the delivery; the batch is retried on a new executor: every "
              "change once in each sink, in order per key")
def test_delivery_on_a_spark_cluster_survives_an_executor_killed_mid_batch(
        counted: Any, pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any, redis_server: Any,
        spark_cluster: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    topic = f"cluster{uuid.uuid4().hex[:6]}.acct"
    stream = f"cluster-{uuid.uuid4().hex[:6]}.acct"
    pipeline = pg_redis_pipeline(
        tables="[public.acct]", partitions=2, stream=stream,
        sink=f'{{id: k1, type: kafka, brokers: "{noida_kafka.bootstrap}", topic: "{topic}", '
             f'exactly_once: true}}\n    - {{id: r1, type: redis, url: "{redis_server.url}", '
             f'stream: "{stream}"}}')
    pipeline.start("control")
    pipeline.start("capture")
    pipeline.wait_capture_streaming()
    # as on a cluster of several hosts: the driver bound on every address, named for the
    # executors by a host name; a Spark setting passed through
    pipeline.start("delivery", "--master", spark_cluster.master_url, "--driver-host", "localhost",
                   "--conf", "spark.executor.memory=768m")
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "delivery owns the pipeline") > 0,
                      120, "delivery to start on the cluster")

    def write() -> None:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for t in range(TRANSACTIONS):
                write_account_tx(conn, t, KEYS)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        pipeline.wait_for(lambda: reached(values_per_key(redis_server.url, stream), KEYS) >= 10,
                          300, "the first changes through the cluster")
        killed = spark_cluster.executors()
        assert killed, "the delivery runs on the cluster's executors"
        os.kill(killed[0], signal.SIGKILL)
    finally:
        writer.join()
    pipeline.wait_for(lambda: reached(values_per_key(redis_server.url, stream), KEYS)
                      == TRANSACTIONS - 1, 600, "every change in Redis")
    total = KEYS * TRANSACTIONS
    pipeline.wait_for(lambda: len(read_kafka(noida_kafka.bootstrap, [topic])) >= total, 300,
                      "every change in Kafka")
    assert set(spark_cluster.executors()).isdisjoint(killed[:1]), "a new executor took over"
    assert "-Xmx768M" in spark_cluster.log("worker"), "--conf spark.executor.memory reached it"

    redis_values = values_per_key(redis_server.url, stream)
    expected = {k: list(range(TRANSACTIONS)) for k in range(KEYS)}
    kafka_values: dict[int, list[int]] = defaultdict(list)
    for message in read_kafka(noida_kafka.bootstrap, [topic]):
        after = json.loads(message.value())["after"]
        kafka_values[after["id"]].append(after["v"])
    counts = count_values(kafka_values, expected)
    counted(**counts, outcome=f"Redis: {count_values(redis_values, expected)['duplicates']} "
                              "duplicates; an executor killed -9 once")
    assert redis_values == expected, "Redis: every change once, in order per key"
    assert dict(kafka_values) == expected, "Kafka (read_committed): every change once, in order"
    pipeline.assert_running()
    print(f"\n{total} changes through delivery on a standalone cluster (bus.partitions 2), an "
          f"executor killed -9 mid-workload: Kafka {counts}, Redis the same")
