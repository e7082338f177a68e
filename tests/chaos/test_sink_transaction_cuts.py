"""A sink's link broken in the middle of its transaction (issue 16, item 1): cut for CUT_S
between Kafka's produce requests and its `EndTxn`, or with Redis's `MULTI` sent and its
`EXEC` not reaching the server; and the reply to a commit lost (Redis `EXEC`, PostgreSQL
`COMMIT`: the server committed, delivery cannot know). Counted: each change once, per key
in order — the open transaction never shows, a committed one is found and not written again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from tailrace.devservers.proxy import before_bytes, kafka_request
from tests.fix_links import BEFORE, CUT_S, DURING, KEYS, TRANSACTIONS, Workload, wire
from tests.fix_pipeline import write_account_tx

pytestmark = pytest.mark.chaos


# where a sink's transaction is cut: Redis's EXEC (MULTI, the XADDs and the SET reach the
# server before it); Kafka's EndTxn request (its produce requests went before it)
IN_TRANSACTION = {"redis": before_bytes(b"*1\r\n$4\r\nEXEC\r\n"), "kafka": kafka_request(26)}


def transaction_calls(url: str) -> tuple[int, int]:
    """How many MULTI and EXEC the Redis server has run."""
    stats = redis.Redis.from_url(url).info("commandstats")
    return (stats.get("cmdstat_multi", {}).get("calls", 0),
            stats.get("cmdstat_exec", {}).get("calls", 0))


@pytest.mark.parametrize("kind", ["redis", "kafka"])
@pytest.mark.matrix(
    scenario="the sink's link cut for 30 s inside a transaction: after Kafka's produce requests, "
             "before its EndTxn; with Redis's MULTI sent, before EXEC reaches the server",
    guarantee="exactly once where the sink allows it: the open transaction never shows, the "
              "batch is written again once; per-key order")
def test_a_cut_inside_a_sink_transaction_is_neither_lost_nor_applied_twice(
        counted: Any, kind: str, pg_db: str, pg_redis_pipeline: Any, tcp_proxy: Any,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pipeline, proxy, values = wire(f"sink-{kind}", "in-tx", pg_db, pg_redis_pipeline, tcp_proxy,
                                   tmp_path, request)
    pipeline.start_all()

    work = Workload(pipeline, values)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        work.write_first(conn)
        redis_url = request.getfixturevalue("redis_server").url
        armed_at = transaction_calls(redis_url)
        proxy.cut_before(IN_TRANSACTION[kind])
        written = BEFORE
        while not proxy.cuts_made.is_set() and written < DURING:
            write_account_tx(conn, written, KEYS)
            written += 1
            pipeline.wait_for(lambda w=written: proxy.cuts_made.is_set()
                              or work.delivered_up_to() == w - 1, 120, "the next batch")
        assert proxy.cuts_made.is_set(), "the link was cut inside a sink transaction"
        if kind == "redis":  # MULTI reached the server, its EXEC did not
            multi, execs = transaction_calls(redis_url)
            assert multi > armed_at[0] and execs == armed_at[1] + (multi - armed_at[0] - 1), \
                f"MULTI/EXEC calls {armed_at} when armed, {(multi, execs)} at the cut"
        inside = work.delivered_up_to()
        cut_at = time.monotonic()
        while time.monotonic() - cut_at < CUT_S:
            if written < DURING:
                write_account_tx(conn, written, KEYS)
                written += 1
            pipeline.assert_running()
            time.sleep(0.5)
        proxy.restore()
        for t in range(written, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    work.wait_until(TRANSACTIONS - 1, "every change after the cut inside a transaction")
    work.count_all_once(counted, f"cut inside the transaction after transaction {inside} was "
                                 "visible")
    pipeline.assert_running()
    print(f"\n[{kind}] link cut {CUT_S:.0f} s inside a transaction (transactions up to "
          f"{inside} visible then): {KEYS * TRANSACTIONS} changes once each, in order")


@pytest.mark.matrix(
    scenario="the reply to a sink's commit lost (Redis EXEC, PostgreSQL COMMIT): applied, not acknowledged",
    guarantee="exactly once where the sink allows it: the retry finds the batch stored and skips it")
@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_commit_whose_reply_is_lost_is_neither_lost_nor_applied_twice(
        counted: Any, kind: str, pg_db: str, pg_redis_pipeline: Any, tcp_proxy: Any,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The sink's server receives the batch's commit (Redis `EXEC`, PostgreSQL `COMMIT`)
    and commits it, but the reply never reaches delivery: the connection is gone and the
    sink cannot tell whether its transaction went through. The retry reads the checkpoint
    stored with the data and skips what is there. Counted: Redis's stream entries, and
    every row version the PostgreSQL target applied (an audit trigger)."""
    pipeline, proxy, values = wire(f"sink-{kind}", "lost-reply", pg_db, pg_redis_pipeline,
                                   tcp_proxy, tmp_path, request)
    pattern = b"$4\r\nEXEC\r\n" if kind == "redis" else b"COMMIT\x00"
    pipeline.start_all()

    work = Workload(pipeline, values)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        work.write_first(conn)
        proxy.lose_reply_to(pattern)
        written = BEFORE
        while proxy.replies_lost == 0 and written < TRANSACTIONS:
            write_account_tx(conn, written, KEYS)
            written += 1
            pipeline.wait_for(lambda w=written: proxy.replies_lost > 0
                              or work.delivered_up_to() == w - 1, 120, "the next batch")
        assert proxy.replies_lost == 1, "a commit's reply was lost"
        for t in range(written, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    work.wait_until(TRANSACTIONS - 1, "every change after the lost reply")
    work.count_all_once(counted)
    pipeline.assert_running()
    skipped = pipeline.log_count("delivery", "replayed events skipped")
    print(f"\n[{kind}] the reply to a commit lost after transaction {written - 1}: "
          f"{KEYS * TRANSACTIONS} changes applied once each, in order; the retry found the "
          f"batch stored ({skipped} 'replayed events skipped' log line(s))")
