"""`bus.partitions: 3` end to end: PostgreSQL -> capture -> 3 bus partitions -> the Spark
job (one task per partition) -> Redis, with a kill -9 of the job mid-stream.

Keys hash to partitions, so per-key order is kept by each partition's task; every
partition has its own checkpoint (control's bus offsets, the sink's checkpoint key), so a
restart resumes each partition from its own place and nothing is written twice.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.chaos

TX, KEYS, PER_TX = 120, 300, 40


@pytest.mark.matrix(
    scenario="bus.partitions: 3 through the Spark job, delivery killed -9 mid-stream",
    guarantee="per-key order and per-partition atomicity across partitions; every partition checkpointed; "
              "exactly once in Redis")
def test_three_bus_partitions_through_delivery_with_a_kill(
        counted: Any, pg_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE item (id int PRIMARY KEY, v int NOT NULL)")
        conn.execute("INSERT INTO item SELECT g, 0 FROM generate_series(0, %s) g", (KEYS - 1,))
    pipeline = pg_redis_pipeline(tables="[public.item]", stream="p3.{table}", partitions=3,
                                 batch="{max_ms: 200, max_events: 1000}")
    pipeline.start_all()

    expected: dict[int, list[int]] = defaultdict(list)  # key -> values in commit order

    def write() -> None:
        rng = random.Random(3)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for t in range(1, TX + 1):
                keys = rng.sample(range(KEYS), PER_TX)
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany("UPDATE item SET v = %s WHERE id = %s", [(t, k) for k in keys])
                for k in keys:
                    expected[k].append(t)
                time.sleep(0.1)

    writer = threading.Thread(target=write)
    writer.start()
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "batch delivered") > 2, 240,
                      "the job delivering")
    pipeline.kill("delivery")
    pipeline.start("delivery")
    writer.join()

    total = TX * PER_TX
    pipeline.wait_for(lambda: len(pipeline.stream_entries("p3.item")) >= total, 300,
                      f"{total} entries in the stream")
    time.sleep(3)  # a late duplicate would show now
    entries = pipeline.stream_entries("p3.item")
    ids = [e["id"] for e in entries]
    print(f"\n3 partitions, 1 kill: {len(entries)} entries for {total} changes, "
          f"{len(ids) - len(set(ids))} duplicates")
    assert len(ids) == len(set(ids)) == total, "every change exactly once"
    got: dict[int, list[int]] = defaultdict(list)
    for e in entries:
        got[e["after"]["id"]].append(e["after"]["v"])
    counted(changes_in=total, changes_out=len(ids), duplicates=len(ids) - len(set(ids)),
            order_violations=sum(1 for k in expected if got.get(k) != expected[k]))
    assert got == expected, "every key's changes, in commit order"

    with pipeline.control_client() as control:
        cp = control.get_checkpoint(f"src-{pipeline.spec_path.stem}", "redis1")
    offsets = dict(cp.bus_offsets)
    print(f"checkpoint bus offsets per partition: {offsets}")
    assert sorted(offsets) == [0, 1, 2] and all(o > 0 for o in offsets.values()), \
        "all three partitions carried changes and are checkpointed"
