"""A second delivery instance told to take the pipeline over (`--take-over`) fences the
first, end to end.

Real processes: control, capture-postgres, and two `tailrace-delivery` jobs writing to
Kafka with `exactly_once: true`. The second takes the pipeline while the first is
delivering a stream of changes; the first must stop with a fatal error naming the new
owner, and a read_committed consumer must see every change once, per key in order.
(Without `--take-over` the second waits as a standby: tests/chaos/test_standby_delivery.py.)
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from tailrace.proto import control_pb2 as pb
from tests.fix_pipeline import write_account_tx
from tests.fix_sinks import read_kafka

pytestmark = pytest.mark.chaos

TX, ROWS_PER_TX = 80, 50


@pytest.mark.matrix(
    scenario="a second delivery instance started with --take-over for the same pipeline (Kafka "
             "exactly-once sink)",
    guarantee="one delivery instance per pipeline: the explicit take-over fences the older, which stops; "
              "nothing duplicated, per-key order")
def test_a_second_delivery_instance_fences_the_first(
        counted: Any, pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    topic = f"fence{uuid.uuid4().hex[:6]}.acct"
    pipeline = pg_redis_pipeline(
        tables="[public.acct]",
        sink=f'{{id: k1, type: kafka, brokers: "{noida_kafka.bootstrap}", topic: "{topic}", '
             'exactly_once: true}')
    pipeline.start_all()
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "batch delivered") > 0, 240,
                      "the first delivery instance's first batch")

    def write() -> None:  # 80 transactions updating the same 50 keys: per-key order matters
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for t in range(TX):
                write_account_tx(conn, t, ROWS_PER_TX)
                time.sleep(0.25)

    writer = threading.Thread(target=write)
    writer.start()
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "batch delivered") > 3, 120,
                      "the first instance delivering the stream")
    pipeline.start("delivery2", "--take-over")
    first_exit = pipeline.exit_code("delivery", timeout=240)
    second_pid = pipeline.procs["delivery2"].process.pid  # type: ignore[union-attr]
    first_log = pipeline.log_tail("delivery", 30)
    print(f"\nfirst instance exited with {first_exit}:\n{first_log[-1500:]}")
    assert first_exit == 1, "the fenced instance stops with a fatal error"
    assert "delivery fenced; stopping" in first_log
    assert f":{second_pid}" in first_log and "(generation 2)" in first_log, \
        "the reason names the new owner"
    pipeline.wait_for(lambda: pipeline.log_count("delivery2", "batch delivered") > 0, 240,
                      "the second instance delivering")
    assert "took over the pipeline" in pipeline.log_tail("delivery2", 200)
    writer.join()

    total = TX * ROWS_PER_TX
    pipeline.wait_for(lambda: len(read_kafka(noida_kafka.bootstrap, [topic])) >= total, 300,
                      f"{total} committed events")
    time.sleep(3)  # anything late (a duplicate) would show now
    events = [json.loads(m.value()) for m in read_kafka(noida_kafka.bootstrap, [topic])]
    ids = [e["id"] for e in events]
    print(f"read_committed: {len(events)} events for {total} changes, "
          f"{len(ids) - len(set(ids))} duplicates")
    assert len(ids) == len(set(ids)) == total, "every change exactly once"
    per_key: dict[int, list[int]] = defaultdict(list)
    for e in events:
        per_key[e["after"]["id"]].append(e["after"]["v"])
    counted(changes_in=total, changes_out=len(ids), duplicates=len(ids) - len(set(ids)),
            order_violations=sum(vs != [0, *range(1, TX)] for vs in per_key.values()))
    assert all(vs == [0, *range(1, TX)] for vs in per_key.values()), "per-key source order"

    with pipeline.control_client() as control:
        info = control.get_pipeline(pipeline.spec_path.stem)
    assert info.state == pb.PIPELINE_RUNNING, f"a fenced instance is not a failure: {info.reason}"
    assert (info.delivery_owner.generation, info.delivery_owner.instance.split(":")[-1]) == (
        2, str(second_pid))
