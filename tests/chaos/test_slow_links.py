"""Each link slow and thin (150 ms each way, 20 kB/s) during a workload (issue 16, item 1):
batches take longer, nothing else changes — once each, per key in order."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fix_links import BEFORE, DURING, KEYS, SLOW_LINKS, TRANSACTIONS, Workload, wire
from tests.fix_pipeline import write_account_tx

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("link", SLOW_LINKS)
@pytest.mark.matrix(
    scenario="a slow thin link (150 ms each way, 20 kB/s) on one link during a workload "
             "(capture or delivery to source, bus, control; a sink of each kind at once)",
    guarantee="backpressure: slower, never lossy; no duplicate, per-key order")
def test_a_slow_thin_link_delays_but_loses_and_repeats_nothing(
        counted: Any, link: str, pg_db: str, pg_redis_pipeline: Any, tcp_proxy: Any,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """One link at 150 ms each way and 20 kB/s while 30 transactions are written: batches
    take longer, nothing else changes."""
    # A Kafka write must be acknowledged within the sink's timeout (30 s; librdkafka's
    # message.timeout.ms): a batch of 600 changes (~600 kB) does not cross 20 kB/s in time,
    # and the same batch would be retried for ever (health degraded names it). Smaller
    # batches (batch.max_events) are the way through such a link (docs/guarantees.md).
    batch = "{max_ms: 200, max_events: 100}" if link == "sinks" else "{max_ms: 200}"
    pipeline, proxy, values = wire(link, "slow", pg_db, pg_redis_pipeline, tcp_proxy, tmp_path,
                                   request, batch=batch)
    pipeline.start_all()

    work = Workload(pipeline, values)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        work.write_first(conn)
        proxy.slow(delay_s=0.15, bytes_per_s=20_000)
        started = time.monotonic()
        for t in range(BEFORE, DURING):
            write_account_tx(conn, t, KEYS)
        work.wait_until(DURING - 1, "every change over the slow link")
        slow_s = time.monotonic() - started
        proxy.slow()
        for t in range(DURING, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    work.wait_until(TRANSACTIONS - 1, "every change", 180)
    work.count_all_once(counted, f"{DURING - BEFORE} transactions over the slow link in "
                                 f"{slow_s:.0f} s")
    pipeline.assert_running()
    print(f"\n[{link}] slow link (150 ms each way, 20 kB/s): {DURING - BEFORE} transactions "
          f"delivered in {slow_s:.1f} s; {KEYS * TRANSACTIONS} changes once each, in order")
