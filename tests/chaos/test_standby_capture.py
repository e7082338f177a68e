"""Standby capture (issue 17 item 3): several capture instances of one source, one active.

Capture A streams, B waits as a standby (`/ready` 503 naming A). A is killed -9: B, on the
same host, sees A's process gone and takes the lease at once. C starts as a standby of B.
B is then frozen (SIGSTOP): it still exists, so C waits out B's lease (3 s), takes it, ends
B's replication session that keeps the slot active, and streams. B is woken: its renewal
finds C holding the lease, its epochs would be refused (fenced), and it goes back to
standby. Through all of it a workload runs; the exactly-once Redis sink holds every change
once, in order per key. Kills and freezes are triggered by what the sink received.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import psycopg
import pytest

from tests.fix_matrix import count_values
from tests.fix_pipeline import RunningPipeline, reached, values_per_key, write_account_tx

pytestmark = pytest.mark.chaos

KEYS = 10
STEP = 15  # transactions written between two faults
TTL = "3"


def write(pg_db: str, first: int, count: int) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(first, first + count):
            write_account_tx(conn, t, KEYS)


def wait_reached(pipeline: RunningPipeline, t: int, what: str) -> None:
    pipeline.wait_for(lambda: reached(values_per_key(pipeline.redis_url, "tr.acct"), KEYS) >= t,
                      120, what)


def ready(pipeline: RunningPipeline, name: str) -> tuple[int, str]:
    status, body = pipeline.http_side(name, "/ready")
    return status, str(body.get("reason", ""))


@pytest.mark.matrix(
    scenario="three capture instances of one PostgreSQL source: the active one killed -9, "
             "the next frozen (SIGSTOP) past its lease, then woken",
    guarantee="one instance publishes at a time: a standby takes over (at once from a dead "
              "process, after the lease's TTL from a frozen one); the frozen one is fenced "
              "and waits as a standby; every change once, in order per key")
def test_a_standby_takes_over_from_a_killed_or_frozen_capture_and_the_old_one_is_fenced(
        counted: Any, pg_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    pipeline = pg_redis_pipeline(tables="[public.acct]", stream="tr.acct")
    pipeline.start("control")
    pipeline.start("capture", "--http-port", "0", "--lease-ttl-s", TTL)
    pipeline.wait_capture_streaming()
    pipeline.start("capture2", "--http-port", "0", "--lease-ttl-s", TTL)
    pipeline.start("delivery")
    pipeline.wait_for(lambda: "standby: capture instance" in ready(pipeline, "capture2")[1],
                      60, "capture2 to wait as a standby")
    assert ready(pipeline, "capture")[0] == 200

    write(pg_db, 0, STEP)
    wait_reached(pipeline, STEP // 2, "the first changes delivered")
    pipeline.kill("capture")
    pipeline.procs.pop("capture")
    write(pg_db, STEP, STEP)
    pipeline.wait_for(lambda: pipeline.log_count("capture2", "capture lease held") > 0, 30,
                      "capture2 to take the lease from the killed instance")
    assert pipeline.log_count("capture2", "is gone from this host; taking it over") == 1
    wait_reached(pipeline, 2 * STEP - 1, "capture2 to deliver")

    pipeline.start("capture3", "--http-port", "0", "--lease-ttl-s", TTL)
    pipeline.wait_for(lambda: "standby: capture instance" in ready(pipeline, "capture3")[1],
                      60, "capture3 to wait as a standby")
    frozen = pipeline.procs["capture2"].process
    assert frozen is not None
    os.killpg(frozen.pid, signal.SIGSTOP)
    try:
        write(pg_db, 2 * STEP, STEP)
        pipeline.wait_for(lambda: pipeline.log_count("capture3", "capture lease held") > 0,
                          60, "capture3 to take the lease once capture2's lapsed")
        wait_reached(pipeline, 3 * STEP - 1, "capture3 to deliver")
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
    pipeline.wait_for(lambda: pipeline.log_count("capture2", "back to standby") > 0, 60,
                      "the woken capture2 to find itself fenced and wait as a standby")
    pipeline.wait_for(lambda: "standby: capture instance" in ready(pipeline, "capture2")[1],
                      60, "capture2's /ready to say standby")
    write(pg_db, 3 * STEP, STEP)
    wait_reached(pipeline, 4 * STEP - 1, "the last changes delivered")

    values = values_per_key(pipeline.redis_url, "tr.acct")
    expected = {k: list(range(4 * STEP)) for k in range(KEYS)}
    counted(**count_values(values, expected),
            outcome="active capture killed -9, then the next frozen: standbys took over")
    assert values == expected, "every change once, in order per key"
    pipeline.assert_running()
    print(f"\n{KEYS * 4 * STEP} changes once each, in order, through a kill -9 of the active "
          "capture (the standby took over at once) and a freeze of the next (the other "
          f"standby took over after the {TTL} s lease; the woken one went back to standby)")
