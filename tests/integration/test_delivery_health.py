"""A pipeline that cannot move does not report healthy, end to end.

Real processes: `tailrace-control`, `tailrace-capture` (PostgreSQL) and `tailrace-delivery`
(the Spark job, `--http-port 0`), a Redis sink, and the real `tailrace` CLI against the
control service. A required sink that fails non-retryably (a wrong password: WRONGPASS)
makes delivery's `/health` 503 and the pipeline `failed` with the sink and the error;
restarts without progress (the sink unreachable: retryable) make it `degraded`. Fixing
the sink makes the pipeline healthy again without restarting anything, and every change
arrives once, in order.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg
import pytest
import redis

from tailrace_services.delivery.health import DEGRADED_AFTER
from tests.fix_pipeline import RunningPipeline, write_account_tx

pytestmark = pytest.mark.integration

KEYS = 3
# From starting delivery: Spark start-up (15-40 s on this loaded 2-core machine), the first
# batch, and for `degraded` five restarts with their backoff (1+2+4+8 s).
FAILED_WITHIN_S = 180
DEGRADED_WITHIN_S = 300
RECOVERED_WITHIN_S = 180  # the retry delay is at most 30 s, then one batch



def pipeline_row(pipeline: RunningPipeline, name: str) -> tuple[str, dict[str, Any]]:
    """This pipeline's line of `tailrace pipelines`, and its `--json` entry."""
    table = pipeline.cli("pipelines")
    row = next(line for line in table.splitlines() if line.startswith(name + " "))
    (entry,) = [p for p in json.loads(pipeline.cli("pipelines", "--json"))
                if p["name"] == name]
    return row, entry


def start(pipeline: RunningPipeline) -> str:
    for name in ("control", "capture"):
        pipeline.start(name)
    pipeline.start("delivery", "--http-port", "0")
    pipeline.wait_capture_streaming()
    return pipeline.spec_path.stem


def write(pg_db: str, first: int, last: int) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(first, last + 1):
            write_account_tx(conn, t, KEYS)


def assert_every_change_once_in_order(pipeline: RunningPipeline, stream: str, txs: int) -> None:
    entries = pipeline.stream_entries(stream)
    seen = [(e["after"]["id"], e["after"]["v"]) for e in entries]
    assert len(seen) == txs * KEYS, f"{len(seen)} entries for {txs * KEYS} changes"
    for key in range(KEYS):
        assert [v for k, v in seen if k == key] == list(range(txs)), f"key {key} in order"


def wait_recovered(pipeline: RunningPipeline, name: str, stream: str, txs: int) -> float:
    started = time.monotonic()
    pipeline.wait_for(lambda: len(pipeline.stream_entries(stream)) >= txs * KEYS,
                      RECOVERED_WITHIN_S, "every change to arrive once the sink is fixed")
    pipeline.wait_for(lambda: pipeline.http_health("delivery")[0] == 200, 60,
                      "delivery /health 200 again")
    row, entry = pipeline_row(pipeline, name)
    assert " running " in row and (entry["state"], entry["reason"]) == ("running", "")
    return time.monotonic() - started


@pytest.fixture
def acct(pg_db: str) -> str:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    return pg_db


@pytest.fixture
def redis_user(redis_server: Any) -> Any:
    """A Redis ACL user whose password is `right-pw`; deleted afterwards."""
    admin = redis.Redis.from_url(redis_server.url)
    user = f"tr-{uuid.uuid4().hex[:8]}"
    admin.execute_command("ACL", "SETUSER", user, "on", ">right-pw", "~*", "&*", "+@all")
    yield user
    admin.execute_command("ACL", "DELUSER", user)
    admin.close()


def test_a_required_sink_failing_non_retryably_fails_the_pipeline_until_fixed(
        acct: str, pg_redis_pipeline: Any, redis_server: Any, redis_user: str) -> None:
    stream = f"h{uuid.uuid4().hex[:6]}.acct"
    port = redis_server.url.rsplit(":", 1)[1].split("/")[0]
    pipeline = pg_redis_pipeline(
        tables="[public.acct]",
        sink=f'{{id: redis1, type: redis, url: "redis://{redis_user}:wrong-pw@127.0.0.1:{port}/0"'
             f', stream: "{stream}"}}')
    started = time.monotonic()
    name = start(pipeline)
    write(acct, 0, 4)

    def failed() -> bool:
        status, body = pipeline.http_health("delivery")
        return status == 503 and "authentication failed" in body.get("reason", "")

    pipeline.wait_for(failed, FAILED_WITHIN_S, "delivery /health 503 naming the sink error")
    took = time.monotonic() - started
    status, body = pipeline.http_health("delivery")
    assert body["status"] == "unhealthy"
    assert body["reason"].startswith("sink redis1 failed with a non-retryable error, so no "
                                     "checkpoint can move: NonRetryableError: redis sink redis1: "
                                     "authentication failed")
    assert "wrong-pw" not in body["reason"]
    row, entry = pipeline_row(pipeline, name)
    print(f"\n/health 503 {took:.0f} s after starting the services (Spark included)\n{row}")
    assert " failed " in row and "sink redis1 failed" in row and "authentication failed" in row
    assert entry["state"] == "failed"
    assert entry["reason"].startswith(f"{name}: failed: sink redis1 failed with a "
                                      "non-retryable error")
    assert pipeline.stream_entries(stream) == []
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "restarting from checkpoints") >= 2,
                      60, "the process to keep retrying the batch, with backoff")
    assert pipeline.http_health("delivery")[0] == 503, "still failed while retrying"
    restarts = pipeline.log_count("delivery", "restarting from checkpoints")

    # the operator fixes the sink: the password in the spec becomes valid
    redis.Redis.from_url(redis_server.url).execute_command(
        "ACL", "SETUSER", redis_user, ">wrong-pw")
    took = wait_recovered(pipeline, name, stream, 5)
    assert_every_change_once_in_order(pipeline, stream, 5)
    print(f"healthy again {took:.0f} s after the fix; {restarts}+ restarts while failed; "
          f"{5 * KEYS} changes delivered once, in order")


def test_restarts_without_progress_turn_the_pipeline_degraded_until_it_moves(
        acct: str, pg_redis_pipeline: Any, redis_server: Any, tcp_proxy: Any) -> None:
    proxy = tcp_proxy(int(redis_server.url.rsplit(":", 1)[1].split("/")[0]))
    stream = f"d{uuid.uuid4().hex[:6]}.acct"
    pipeline = pg_redis_pipeline(
        tables="[public.acct]",
        sink=f'{{id: redis1, type: redis, url: "redis://127.0.0.1:{proxy.port}/0", '
             f'stream: "{stream}"}}')
    name = start(pipeline)
    write(acct, 0, 0)
    pipeline.wait_for(lambda: len(pipeline.stream_entries(stream)) == KEYS, FAILED_WITHIN_S,
                      "the first transaction")
    assert pipeline.http_health("delivery")[0] == 200
    assert " running " in pipeline_row(pipeline, name)[0]

    proxy.cut()  # connection refused: retryable, so the batch is retried again and again
    cut_at = time.monotonic()
    write(acct, 1, 3)
    expected = f"{DEGRADED_AFTER} restarts in a row without a checkpoint advancing: "

    def degraded() -> bool:
        status, body = pipeline.http_health("delivery")
        return status == 503 and body.get("status") == "degraded"

    pipeline.wait_for(degraded, DEGRADED_WITHIN_S, "delivery /health 503 degraded")
    took = time.monotonic() - cut_at
    body = pipeline.http_health("delivery")[1]
    assert body["reason"].startswith(expected), body
    assert "sink redis1: retryable: " in body["reason"] and "Connection refused" in body["reason"]
    row, entry = pipeline_row(pipeline, name)
    print(f"\n/health degraded {took:.0f} s after the sink went away\n{row}")
    assert " degraded " in row and expected in row
    assert entry["state"] == "degraded"
    assert entry["reason"].startswith(f"{name}: degraded: {expected}")
    assert len(pipeline.stream_entries(stream)) == KEYS, "nothing moved meanwhile"

    proxy.restore()
    took = wait_recovered(pipeline, name, stream, 4)
    assert_every_change_once_in_order(pipeline, stream, 4)
    print(f"healthy again {took:.0f} s after the sink came back; {4 * KEYS} changes once, "
          "in order")
