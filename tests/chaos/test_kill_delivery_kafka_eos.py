"""kill -9 of the real delivery job (Spark) ten times at random points while 50,000 changes
flow to two Kafka topics: one sink with `exactly_once: true`, one without.

Same run, same kills: a read_committed consumer of the exactly-once topic sees every
change once, per key in source order, every source transaction whole; the at-least-once
topic has every change too, and the duplicates that tier allows are counted and printed.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

import psycopg
import pytest

from tests.fix_pipeline import write_account_tx
from tests.fix_sinks import read_kafka

pytestmark = pytest.mark.chaos

TX, KEYS = 500, 100  # 500 transactions updating the same 100 keys: 50,000 changes
KILLS = 10


@pytest.mark.matrix(
    scenario="delivery killed -9 ten times by progress, Kafka sink exactly-once beside at-least-once",
    guarantee="exactly once on Kafka (batch = one transaction, its checkpoint inside it); at-least-once "
              "loses nothing and shows its duplicates")
def test_delivery_job_killed_ten_times_kafka_exactly_once_vs_at_least_once(
        counted: Any, pg_db: str, pg_redis_pipeline: Any, noida_kafka: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    prefix = f"k{uuid.uuid4().hex[:6]}"
    eos_topic, alo_topic = f"{prefix}-eos.acct", f"{prefix}-alo.acct"
    brokers = noida_kafka.bootstrap
    pipeline = pg_redis_pipeline(
        tables="[public.acct]", batch="{max_ms: 200, max_events: 2000}",
        sink=f'{{id: eos, type: kafka, brokers: "{brokers}", topic: "{eos_topic}", '
             'exactly_once: true}\n'
             f'    - {{id: alo, type: kafka, brokers: "{brokers}", topic: "{alo_topic}"}}')
    pipeline.start_all()
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "batch delivered") > 0, 240,
                      "the delivery job's first batch")

    source_id = f"src-{pipeline.spec_path.stem}"
    control = pipeline.control_client()
    rng = random.Random(2026)
    done_at_kill = []
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for kill in range(KILLS):
            # a burst of 5,000 changes, so the job is busy with 2,000-event batches when killed;
            # the last burst is written half before its kill and half after it, so the
            # restarted job always has changes to deliver that the killed one had not
            # (a burst may be all delivered before its kill)
            delivered = pipeline.log_count("delivery", "batch delivered") + 1
            burst = range(kill * TX // KILLS, (kill + 1) * TX // KILLS)
            later = burst[len(burst) // 2:] if kill == KILLS - 1 else range(0)
            for t in burst[:len(burst) - len(later)]:
                write_account_tx(conn, t, KEYS)
            # after a batch of this burst: a burst makes at least one batch, so the wait always
            # ends (a count of 2 or 3 may never come when the burst fits in fewer batches);
            # then somewhere inside the next batch or its commit, or after the burst
            pipeline.wait_for(
                lambda d=delivered: pipeline.log_count("delivery", "batch delivered") >= d,
                240, f"a batch of burst {kill + 1} delivered")
            time.sleep(rng.uniform(0.0, 1.5))
            cp = control.get_checkpoint(source_id, "alo")
            done_at_kill.append(sum(cp.bus_offsets.values()) if cp else 0)
            pipeline.kill("delivery")
            for t in later:
                write_account_tx(conn, t, KEYS)
            pipeline.start("delivery")

    total = TX * KEYS
    pipeline.wait_for(lambda: len(read_kafka(brokers, [eos_topic])) >= total, 600,
                      f"{total} committed events")
    time.sleep(3)  # a late duplicate would show now
    final = control.get_checkpoint(source_id, "alo")
    control.close()
    print(f"\nbus offsets committed at each of the {KILLS} kills: {done_at_kill}, "
          f"at the end: {sum(final.bus_offsets.values())}")

    eos = [json.loads(m.value()) for m in read_kafka(brokers, [eos_topic])]
    eos_uncommitted = len(read_kafka(brokers, [eos_topic], "read_uncommitted"))
    alo = [json.loads(m.value()) for m in read_kafka(brokers, [alo_topic])]
    alo_copies = Counter(e["id"] for e in alo)
    print(f"exactly_once: true  -> read_committed {len(eos)} events for {total} changes "
          f"({eos_uncommitted} records incl. aborted transactions, read_uncommitted)")
    print(f"exactly_once: false -> {len(alo)} events for {total} changes, "
          f"{len(alo) - len(alo_copies)} duplicates over {sum(c > 1 for c in alo_copies.values())}"
          " changes")

    ids = [e["id"] for e in eos]
    assert len(ids) == len(set(ids)) == total, "exactly-once: every change exactly once"
    assert set(alo_copies) == set(ids), "at-least-once: every change, none lost"
    per_key: dict[int, list[int]] = defaultdict(list)
    for e in eos:
        per_key[e["after"]["id"]].append(e["after"]["v"])
    assert len(per_key) == KEYS
    assert all(vs == [0, *range(1, TX)] for vs in per_key.values()), "per-key source order"
    by_tx: dict[str, list[int]] = defaultdict(list)
    for e in eos:
        by_tx[e["tx"]["id"]].append(e["tx"]["index"])
    assert len(by_tx) == TX
    assert all(sorted(ix) == list(range(KEYS)) for ix in by_tx.values()), "every transaction whole"
    counted(changes_in=total, changes_out=len(ids), duplicates=len(ids) - len(set(ids)),
            order_violations=sum(vs != [0, *range(1, TX)] for vs in per_key.values()))
    first_seen: dict[int, list[int]] = defaultdict(list)
    seen: set[str] = set()
    for e in alo:  # at-least-once replays a range; in first-seen order each key is in order
        if e["id"] not in seen:
            seen.add(e["id"])
            first_seen[e["after"]["id"]].append(e["after"]["v"])
    assert first_seen == per_key
