"""Standby delivery (issue 17 item 4): a second delivery instance of a pipeline waits instead
of fencing the first, and takes over when the first dies.

Delivery A delivers a workload to the exactly-once Redis sink; B starts on the same
pipeline and waits (`/ready` 503 naming A, no Spark started, no claim). After A has
delivered some of it, A is killed -9: B sees A's process gone from this host, takes the
lease and the pipeline at once, and delivers the rest; a new standby starts beside it;
three times. Every change once, in order per key.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from tests.fix_matrix import count_values
from tests.fix_pipeline import RunningPipeline, reached, values_per_key, write_account_txs

pytestmark = pytest.mark.chaos

STREAM = f"standby-delivery-{uuid.uuid4().hex[:8]}.acct"  # the Redis server is shared by the run
KEYS = 10
STEP = 10
KILLS = 3


def write(pg_db: str, first: int, count: int) -> None:
    write_account_txs(pg_db, first, count, KEYS)


def ready_reason(pipeline: RunningPipeline, name: str) -> str:
    return str(pipeline.http_side(name, "/ready")[1].get("reason", ""))


@pytest.mark.matrix(
    scenario="two delivery instances of one pipeline; the active one killed -9 three times "
             "mid-workload (Redis exactly-once sink)",
    guarantee="the second waits as a standby (no fencing ping-pong) and takes over at once "
              "from the dead one; every change once, in order per key")
def test_a_second_delivery_waits_as_a_standby_and_takes_over_when_the_first_dies(
        counted: Any, pg_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    pipeline = pg_redis_pipeline(tables="[public.acct]", stream=STREAM)
    pipeline.start("control")
    pipeline.start("capture")
    pipeline.wait_capture_streaming()
    pipeline.start("delivery", "--http-port", "0", "--lease-ttl-s", "5")
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "delivery owns the pipeline") > 0,
                      120, "the first delivery to own the pipeline")

    def delivered() -> int:
        return reached(values_per_key(pipeline.redis_url, STREAM), KEYS)

    written = 0
    active, standby, started = "delivery", "delivery2", 2
    for _ in range(KILLS):
        pipeline.start(standby, "--http-port", "0", "--lease-ttl-s", "5")
        pipeline.wait_for(lambda s=standby: "standby: delivery instance" in ready_reason(
            pipeline, s), 60, f"{standby} to wait as a standby")
        write(pg_db, written, STEP)
        written += STEP
        pipeline.wait_for(lambda w=written: delivered() >= w - STEP // 2, 120,
                          f"{active} delivering")
        assert pipeline.log_count(standby, "delivery owns the pipeline") == 0, \
            "the standby claims nothing while the active one lives"
        pipeline.kill(active)
        pipeline.procs.pop(active)
        write(pg_db, written, STEP)
        written += STEP
        pipeline.wait_for(lambda w=written: delivered() >= w - 1, 240, f"{standby} delivering")
        assert pipeline.log_count(standby, "is gone from this host; taking it over") == 1
        assert pipeline.log_count(standby, "took over the pipeline") == 1
        started += 1
        active, standby = standby, f"delivery{started}"

    values = values_per_key(pipeline.redis_url, STREAM)
    expected = {k: list(range(written)) for k in range(KEYS)}
    counted(**count_values(values, expected),
            outcome=f"active delivery killed -9 {KILLS} times; the standby took over each time")
    assert values == expected, "every change once, in order per key"
    pipeline.assert_running()
    print(f"\n{KEYS * written} changes once each, in order; a standby delivery took over "
          f"from the killed one at once, {KILLS} times")
