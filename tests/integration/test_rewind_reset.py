"""`tailrace rewind --reset` does what its confirmation says, end to end, and a pause costs a
log line, not a traceback.

Real processes: `tailrace-control`, `tailrace-capture` (PostgreSQL), `tailrace-delivery` (the
Spark job) and a Redis sink (exactly-once: it stores its checkpoint beside the stream), driven
by the real `tailrace` CLI. After pause, reset and resume, Redis receives every change it
already had once more — counted per event — then new changes once; the delivery log stays
one JSON object per line (Spark's and librdkafka's lines included) and holds no traceback.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest

from tests.fix_pipeline import RunningPipeline, write_account_tx

pytestmark = pytest.mark.integration

KEYS = 3
ARRIVE_WITHIN_S = 240  # Spark start-up (15-40 s on this loaded machine) and the first batch
PAUSED_WITHIN_S = 60
REDELIVERED_WITHIN_S = 180



@pytest.fixture
def acct(pg_db: str) -> str:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    return pg_db


def write(dsn: str, first: int, last: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in range(first, last + 1):
            write_account_tx(conn, t, KEYS)


def non_json_lines(pipeline: RunningPipeline, name: str) -> list[str]:
    bad = []
    for line in (pipeline.dir / f"{name}.log").read_text(errors="replace").splitlines():
        try:
            if not isinstance(json.loads(line), dict):
                bad.append(line)
        except ValueError:
            bad.append(line)
    return bad


def test_reset_redelivers_what_the_sink_had_and_pause_is_quiet(
        acct: str, pg_redis_pipeline: Any) -> None:
    prefix = f"rw{uuid.uuid4().hex[:6]}"
    stream = f"{prefix}.acct"
    pipeline = pg_redis_pipeline(tables="[public.acct]", stream=prefix + ".{table}")
    name = pipeline.spec_path.stem
    pipeline.start_all()
    write(acct, 0, 3)
    pipeline.wait_for(lambda: len(pipeline.stream_entries(stream)) == 4 * KEYS,
                      ARRIVE_WITHIN_S, "the first four transactions")
    first = [e["id"] for e in pipeline.stream_entries(stream)]

    assert pipeline.cli("pause", name, "--reason", "reset redis1").strip() == \
        f"pipeline {name} paused"
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "pipeline paused; waiting for "
                                                 "resume") > 0,
                      PAUSED_WITHIN_S, "delivery to stop its query for the pause")
    out = pipeline.cli("rewind", name, "redis1", "--reset", "--confirm", "redis1")
    assert "to the earliest available position" in out
    (answer,) = json.loads(pipeline.cli("checkpoints", name, "--json"))
    (sink,) = answer["sinks"]
    assert sink["checkpoint"]["rewind"] == 1 and sink["checkpoint"]["version"] >= 2
    assert sink["lag_offsets"] > 0, "a reset sink is behind by everything on the bus"
    pipeline.cli("resume", name)

    pipeline.wait_for(lambda: len(pipeline.stream_entries(stream)) >= 8 * KEYS,
                      REDELIVERED_WITHIN_S, "the sink to receive again what it had")
    entries = pipeline.stream_entries(stream)
    ids = [e["id"] for e in entries]
    assert len(ids) == 8 * KEYS and Counter(ids) == Counter(first * 2), \
        "every event it had, exactly once more"
    again = [(e["after"]["id"], e["after"]["v"]) for e in entries[4 * KEYS:]]
    for key in range(KEYS):
        assert [v for k, v in again if k == key] == [0, 1, 2, 3], f"key {key} in source order"

    write(acct, 4, 4)  # after the re-delivery, new changes arrive once
    pipeline.wait_for(lambda: len(pipeline.stream_entries(stream)) >= 9 * KEYS,
                      REDELIVERED_WITHIN_S, "a new transaction after the reset")
    assert len(pipeline.stream_entries(stream)) == 9 * KEYS

    log = (pipeline.dir / "delivery.log").read_text(errors="replace")
    assert "Traceback" not in log and "py4j" not in log, "a pause is not an error"
    assert non_json_lines(pipeline, "delivery") == [], "one format: JSON, Spark's lines too"
    assert non_json_lines(pipeline, "capture") == []
