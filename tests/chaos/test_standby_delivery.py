"""Standby delivery (issue 17 item 4): a second delivery instance of a pipeline waits instead
of fencing the first, and takes over when the first dies.

Delivery A delivers a workload to the exactly-once Redis sink; B starts on the same
pipeline and waits (`/ready` 503 naming A, no Spark started, no claim). After A has
delivered some batches it is killed -9: B sees A's process gone from this host, takes the
lease and the pipeline at once, and delivers the rest. Every change once, in order per key.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.fix_matrix import count_values
from tests.fix_pipeline import RunningPipeline, reached, values_per_key, write_account_tx

pytestmark = pytest.mark.chaos

KEYS = 10
STEP = 20


def write(pg_db: str, first: int, count: int) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(first, first + count):
            write_account_tx(conn, t, KEYS)


def ready_reason(pipeline: RunningPipeline, name: str) -> str:
    return str(pipeline.http_side(name, "/ready")[1].get("reason", ""))


@pytest.mark.matrix(
    scenario="two delivery instances of one pipeline; the active one killed -9 mid-workload "
             "(Redis exactly-once sink)",
    guarantee="the second waits as a standby (no fencing ping-pong) and takes over at once "
              "from the dead one; every change once, in order per key")
def test_a_second_delivery_waits_as_a_standby_and_takes_over_when_the_first_dies(
        counted: Any, pg_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    pipeline = pg_redis_pipeline(tables="[public.acct]", stream="tr.acct")
    pipeline.start("control")
    pipeline.start("capture")
    pipeline.wait_capture_streaming()
    pipeline.start("delivery", "--http-port", "0", "--lease-ttl-s", "5")
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "delivery owns the pipeline") > 0,
                      120, "the first delivery to own the pipeline")
    pipeline.start("delivery2", "--http-port", "0", "--lease-ttl-s", "5")
    pipeline.wait_for(lambda: "standby: delivery instance" in ready_reason(pipeline,
                                                                           "delivery2"),
                      60, "the second delivery to wait as a standby")

    write(pg_db, 0, STEP)
    pipeline.wait_for(lambda: reached(values_per_key(pipeline.redis_url, "tr.acct"), KEYS)
                      >= STEP // 2, 120, "the first instance delivering")
    assert pipeline.log_count("delivery2", "delivery owns the pipeline") == 0, \
        "the standby claims nothing while the first lives"
    pipeline.kill("delivery")
    pipeline.procs.pop("delivery")
    write(pg_db, STEP, STEP)
    pipeline.wait_for(lambda: reached(values_per_key(pipeline.redis_url, "tr.acct"), KEYS)
                      >= 2 * STEP - 1, 240, "the second instance delivering the rest")
    assert pipeline.log_count("delivery2", "is gone from this host; taking it over") == 1
    assert pipeline.log_count("delivery2", "took over the pipeline") == 1

    values = values_per_key(pipeline.redis_url, "tr.acct")
    expected = {k: list(range(2 * STEP)) for k in range(KEYS)}
    counted(**count_values(values, expected),
            outcome="active delivery killed -9; the standby took over")
    assert values == expected, "every change once, in order per key"
    pipeline.assert_running()
    print(f"\n{KEYS * 2 * STEP} changes once each, in order; the standby delivery took over "
          "from the killed one at once")
