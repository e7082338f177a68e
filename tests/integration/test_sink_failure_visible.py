"""A sink that refuses every batch is visible to an operator: which sink, its last error, and a
lag that grows — in `tailrace pipelines`, `tailrace checkpoints` (table and `--json`), the
control service's `/metrics`, and as a structured event in the delivery log.

Real processes: control (with its HTTP side port), capture (PostgreSQL), delivery (Spark) and
a Redis sink behind a TCP proxy that is cut: Redis refuses the connection (Error 111), a
retryable error, so the pipeline keeps retrying. Stated bound: the failing sink shows within
VISIBLE_WITHIN_S of the first change it cannot take.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from typing import Any

import psycopg
import pytest

from tailrace.devservers import free_port
from tests.fix_pipeline import RunningPipeline, write_account_tx

pytestmark = pytest.mark.integration

KEYS = 3
FIRST_WITHIN_S = 240  # Spark start-up on this loaded machine, then the first batch
VISIBLE_WITHIN_S = 60  # a batch attempt (3 sink attempts with backoff) and one report
RECOVERED_WITHIN_S = 180  # the retry delay is at most 30 s, then one batch
LSN = re.compile(r"\b[0-9A-F]{1,8}/[0-9A-F]{1,8}\b")



def metrics(port: int) -> dict[str, float]:
    """`name{labels}` -> value of control's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def sink_json(pipeline: RunningPipeline, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the sink in `pipelines --json`, the sink in `checkpoints --json`)."""
    (info,) = [p for p in json.loads(pipeline.cli("pipelines", "--json"))
               if p["name"] == name]
    (answer,) = json.loads(pipeline.cli("checkpoints", name, "--json"))
    return info["sinks"][0], answer["sinks"][0]


def write(dsn: str, first: int, last: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in range(first, last + 1):
            write_account_tx(conn, t, KEYS)


@pytest.fixture
def acct(pg_db: str) -> str:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    return pg_db


def test_a_refusing_sink_shows_its_error_and_a_growing_lag(
        acct: str, pg_redis_pipeline: Any, redis_server: Any, tcp_proxy: Any) -> None:
    proxy = tcp_proxy(redis_server.port)
    stream = f"v{uuid.uuid4().hex[:6]}.acct"
    http_port = free_port()
    pipeline = pg_redis_pipeline(
        tables="[public.acct]", control_args=("--http-port", str(http_port)),
        sink=f'{{id: redis1, type: redis, url: "redis://127.0.0.1:{proxy.port}/0", '
             f'stream: "{stream}"}}')
    name = pipeline.spec_path.stem
    pipeline.start_all()
    write(acct, 0, 0)
    pipeline.wait_for(lambda: len(pipeline.stream_entries(stream)) == KEYS, FIRST_WITHIN_S,
                      "the first transaction")
    assert metrics(http_port)[f'tailrace_pipeline_state{{pipeline="{name}",state="running"}}'] == 1
    pipeline_sink, checkpoint_sink = sink_json(pipeline, name)
    assert pipeline_sink["last_error"] == "" and checkpoint_sink["lag_bytes"] == 0

    proxy.cut()  # Redis refuses every connection from now on
    write(acct, 1, 3)
    started = time.monotonic()
    pipeline.wait_for(lambda: sink_json(pipeline, name)[0]["last_error"] != "",
                      VISIBLE_WITHIN_S, "tailrace pipelines to show the failing sink")
    took = time.monotonic() - started

    pipeline_sink, checkpoint_sink = sink_json(pipeline, name)
    for sink in (pipeline_sink, checkpoint_sink):
        assert "Connection refused" in sink["last_error"], sink
        assert sink["failed_batches"] >= 1 and sink["failing_since_unix_ms"] > 0
    position = checkpoint_sink["checkpoint"]["position"]
    assert LSN.fullmatch(position["native"]) and isinstance(position["tx_seq"], int)
    lag = (checkpoint_sink["lag_offsets"], checkpoint_sink["lag_bytes"],
           checkpoint_sink["lag_seconds"])
    assert lag[0] >= 3 * KEYS and lag[1] > 0, f"three transactions behind: {lag}"

    table = pipeline.cli("pipelines")
    row = next(line for line in table.splitlines() if line.startswith(name + " "))
    assert "redis1 (failing)" in row
    if " running " in row:  # before it turns degraded, the reason names the sink and error
        assert "sink redis1 failing (" in row and "Connection refused" in row
    else:
        assert " degraded " in row
    table = pipeline.cli("checkpoints", name)
    header, row = table.splitlines()
    assert header.split()[:5] == ["PIPELINE", "SINK", "REQUIRED", "POSITION", "TX_SEQ"]
    assert row.split()[3] == position["native"] and "Connection refused" in row

    observed = metrics(http_port)
    labels = f'pipeline="{name}",sink="redis1"'
    assert observed[f"tailrace_sink_failing{{{labels}}}"] == 1
    assert observed[f"tailrace_sink_lag_bytes{{{labels}}}"] == lag[1]
    assert sum(observed[f'tailrace_pipeline_state{{pipeline="{name}",state="{s}"}}']
               for s in ("running", "paused", "failed", "degraded")) == 1

    write(acct, 4, 5)  # the lag grows while the sink refuses
    pipeline.wait_for(lambda: sink_json(pipeline, name)[1]["lag_bytes"] > lag[1], 60,
                      "the lag to grow with new changes")
    grown = sink_json(pipeline, name)[1]
    assert grown["lag_offsets"] > lag[0] and grown["lag_seconds"] > lag[2]

    events = [json.loads(line) for line in
              (pipeline.dir / "delivery.log").read_text(errors="replace").splitlines()]
    refused = [e for e in events if e.get("event") == "sink did not acknowledge the batch"]
    assert refused and refused[0]["sink"] == "redis1" and refused[0]["pipeline"] == name
    assert refused[0]["level"] == "error" and "Connection refused" in refused[0]["error"]
    print(f"\nthe failing sink showed {took:.0f} s after the change it could not take; "
          f"lag then {lag}, later {grown['lag_offsets']} records, {grown['lag_bytes']} bytes, "
          f"{grown['lag_seconds']:.1f} s")

    proxy.restore()
    pipeline.wait_for(lambda: len(pipeline.stream_entries(stream)) >= 6 * KEYS,
                      RECOVERED_WITHIN_S, "every change once the sink is back")
    pipeline.wait_for(lambda: sink_json(pipeline, name)[0]["last_error"] == "", 60,
                      "the sink's error to clear")
    assert metrics(http_port)[f"tailrace_sink_failing{{{labels}}}"] == 0
