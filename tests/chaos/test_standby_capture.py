"""Standby capture (issue 17 item 3): several capture instances of one source, one active.

Capture A streams, B waits as a standby (`/ready` 503 naming A). A is killed -9: B, on the
same host, sees A's process gone and takes the lease at once; a new standby starts beside
it; five times. Then the active one is frozen (SIGSTOP): it still exists, so the standby
waits out its lease (3 s), takes it, ends the frozen one's replication session that keeps
the slot active, and streams. The frozen one is woken: its renewal finds the other holding
the lease, its epochs would be refused (fenced), and it goes back to standby. The epochs
recorded are in lease-generation order: one holder published at a time. Through all of it
a workload runs; the exactly-once Redis sink holds every change once, in order per key.
Kills and freezes are triggered by what the sink received.
"""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import psycopg
import pytest

from tests.fix_matrix import count_values
from tests.fix_pipeline import RunningPipeline, reached, values_per_key, write_account_txs

pytestmark = pytest.mark.chaos

STREAM = f"standby-capture-{uuid.uuid4().hex[:8]}.acct"  # the Redis server is shared by the run
KEYS = 10
STEP = 10  # transactions written between two faults
KILLS = 5
TTL = "3"


def write(pg_db: str, first: int, count: int) -> None:
    write_account_txs(pg_db, first, count, KEYS)


def wait_reached(pipeline: RunningPipeline, t: int, what: str) -> None:
    pipeline.wait_for(lambda: reached(values_per_key(pipeline.redis_url, STREAM), KEYS) >= t,
                      120, what)


def ready(pipeline: RunningPipeline, name: str) -> tuple[int, str]:
    status, body = pipeline.http_side(name, "/ready")
    return status, str(body.get("reason", ""))


def lease_held_count(pipeline: RunningPipeline, name: str) -> int:
    return pipeline.log_count(name, "capture lease held")


@pytest.mark.matrix(
    scenario="two capture instances of one PostgreSQL source, the active one killed -9 five "
             "times mid-workload; then the active one frozen (SIGSTOP) past its lease and woken",
    guarantee="one instance publishes at a time (epochs in lease-generation order): a standby "
              "takes over (at once from a dead process, after the lease's TTL from a frozen "
              "one); the frozen one is fenced and waits as a standby; every change once, in "
              "order per key")
def test_a_standby_takes_over_from_a_killed_or_frozen_capture_and_the_old_one_is_fenced(
        counted: Any, pg_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    pipeline = pg_redis_pipeline(tables="[public.acct]", stream=STREAM)
    pipeline.start("control")
    pipeline.start("capture", "--http-port", "0", "--lease-ttl-s", TTL)
    pipeline.wait_capture_streaming()
    pipeline.start("delivery")
    written = 0
    active, standby, started = "capture", "capture2", 2
    for _ in range(KILLS):
        pipeline.start(standby, "--http-port", "0", "--lease-ttl-s", TTL)
        pipeline.wait_for(lambda s=standby: "standby: capture instance" in ready(pipeline, s)[1],
                          60, f"{standby} to wait as a standby")
        assert ready(pipeline, active)[0] == 200
        write(pg_db, written, STEP)
        written += STEP
        wait_reached(pipeline, written - STEP // 2, f"{active} delivering")
        pipeline.kill(active)
        pipeline.procs.pop(active)
        write(pg_db, written, STEP)
        written += STEP
        pipeline.wait_for(lambda s=standby: lease_held_count(pipeline, s) > 0, 30,
                          f"{standby} to take the lease from the killed {active}")
        assert pipeline.log_count(standby, "is gone from this host; taking it over") == 1
        wait_reached(pipeline, written - 1, f"{standby} delivering")
        started += 1
        active, standby = standby, f"capture{started}"

    pipeline.start(standby, "--http-port", "0", "--lease-ttl-s", TTL)
    pipeline.wait_for(lambda: "standby: capture instance" in ready(pipeline, standby)[1],
                      60, f"{standby} to wait as a standby")
    frozen = pipeline.procs[active].process
    assert frozen is not None
    os.killpg(frozen.pid, signal.SIGSTOP)
    try:
        write(pg_db, written, STEP)
        written += STEP
        pipeline.wait_for(lambda: lease_held_count(pipeline, standby) > 0, 60,
                          f"{standby} to take the lease once {active}'s lapsed")
        wait_reached(pipeline, written - 1, f"{standby} delivering")
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
    pipeline.wait_for(lambda: pipeline.log_count(active, "back to standby") > 0, 60,
                      f"the woken {active} to find itself fenced and wait as a standby")
    pipeline.wait_for(lambda: "standby: capture instance" in ready(pipeline, active)[1],
                      60, f"{active}'s /ready to say standby")
    write(pg_db, written, STEP)
    written += STEP
    wait_reached(pipeline, written - 1, "the last changes delivered")

    with pipeline.control_client() as control:
        epochs = control.epoch_range(f"src-{pipeline.spec_path.stem}", limit=100_000)
    generations = [e.capture_generation for e in epochs]
    assert generations == sorted(generations) and generations[0] >= 1, \
        "the epochs of one holder at a time, in lease-generation order"
    values = values_per_key(pipeline.redis_url, STREAM)
    expected = {k: list(range(written)) for k in range(KEYS)}
    counted(**count_values(values, expected),
            outcome=f"active capture killed -9 {KILLS} times, then one frozen: standbys took "
                    f"over; {len(epochs)} epochs of {len(set(generations))} holders in order")
    assert values == expected, "every change once, in order per key"
    pipeline.assert_running()
    print(f"\n{KEYS * written} changes once each, in order, through {KILLS} kills -9 of the "
          "active capture (each time the standby took over at once) and a freeze (the other "
          f"standby took over after the {TTL} s lease; the woken one went back to standby); "
          f"{len(epochs)} epochs of lease generations {sorted(set(generations))}, in order")
