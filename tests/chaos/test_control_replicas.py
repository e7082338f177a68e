"""Control replicas (issue 17 item 6): two control services on one PostgreSQL storage, the
pipeline's `control.address` naming both; each is killed -9 in turn mid-workload.

Capture, delivery (the driver and the Spark source) and the CLI talk to the first replica
until it dies, then go on with the second; the first is started again, and when the second
dies they go back to it. Every change reaches the exactly-once Redis sink once, in order per
key; neither capture nor delivery exits.
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

import psycopg
import pytest

from tailrace.devservers import free_port
from tests.fix_matrix import count_values
from tests.fix_pipeline import reached, values_per_key, write_account_txs

pytestmark = pytest.mark.chaos

STREAM = f"control-replicas-{uuid.uuid4().hex[:8]}.acct"  # the Redis server is shared by the run
KEYS = 10
STEP = 40  # transactions per stage: before the first kill, between the kills, after


@pytest.mark.matrix(
    scenario="two control services on one PostgreSQL storage; the one every client talks to "
             "killed -9 mid-workload, started again, then the other killed -9",
    guarantee="capture, delivery and the CLI go on through the other replica; every change "
              "once, in order per key; no process exits")
def test_the_pipeline_carries_on_through_the_other_control_replica(
        counted: Any, pg_db: str, pg_server: Any, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    pipeline = pg_redis_pipeline(tables="[public.acct]", stream=STREAM)
    first, second = pipeline.control_address, f"127.0.0.1:{free_port()}"
    spec = pipeline.spec_path.read_text()
    assert f'address: "{first}"' in spec
    pipeline.spec_path.write_text(spec.replace(f'address: "{first}"',
                                               f'address: "{first},{second}"'))
    pipeline.control_storage = pg_server.create_database(f"ctl_{uuid.uuid4().hex[:10]}")
    pipeline.control_listens = {"control": first, "control2": second}
    pipeline.control_address = f"{first},{second}"  # for the CLI and the test's clients
    pipeline.start("control")
    pipeline.start("control2")
    pipeline.start("capture")
    pipeline.start("delivery")
    pipeline.wait_capture_streaming()

    def delivered(at_least: int) -> bool:
        return reached(values_per_key(pipeline.redis_url, STREAM), KEYS) >= at_least

    written = 0
    for killed in ("control", "control2"):
        write_account_txs(pg_db, written, STEP, KEYS)
        written += STEP
        pipeline.wait_for(partial(delivered, written - STEP // 2), 180,
                          f"half of transactions {written - STEP}..{written - 1} delivered")
        pipeline.kill(killed)
        pipeline.procs.pop(killed)
        write_account_txs(pg_db, written, STEP, KEYS)
        written += STEP
        pipeline.wait_for(partial(delivered, written - 1), 180,
                          f"every transaction up to {written - 1} delivered with {killed} dead")
        assert "running" in pipeline.cli("pipelines"), "the CLI is answered by the other one"
        if killed == "control":
            pipeline.start("control")  # the clients stay with control2 until it dies
    write_account_txs(pg_db, written, STEP, KEYS)
    written += STEP
    pipeline.wait_for(partial(delivered, written - 1), 180, "the last transactions delivered")

    got = values_per_key(pipeline.redis_url, STREAM)
    expected = {k: list(range(written)) for k in range(KEYS)}
    counted(**count_values(got, expected))
    assert got == expected, "each key's values once each, in source order"
    pipeline.assert_running()
    for name in ("delivery", "capture"):  # before the control services they talk to
        pipeline.stop(name)
    assert pipeline.log_count("capture", "capture stopped") == 0
    print(f"\ntwo control replicas, each killed -9 once: {KEYS * written} changes once each, "
          "in order; capture and delivery never stopped")
