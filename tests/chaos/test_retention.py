"""The source's disk (issue 17 item 1, DESIGN guarantee 13): an optional sink that never
acknowledges holds the PostgreSQL slot back while the database writes; past
`source.max_retained` the control service detaches it, the slot is released, and the
required sink goes on receiving every change once, in order, without delivery restarting.

Without the limit this slot would keep every byte of WAL written since it was made: the
optional sink has no checkpoint, so no minimum checkpoint exists to confirm. Then the sink
comes back: its server reachable again, `tailrace attach` (pipeline paused) from where the
required sink is, and `tailrace snapshot` for what it missed: it ends with every row's
current value.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
import redis

from tailrace.proto import control_pb2 as pb
from tests.fix_matrix import count_values
from tests.fix_pipeline import reached, values_per_key, write_account_tx

pytestmark = pytest.mark.chaos

STREAM = f"retention-{uuid.uuid4().hex[:8]}.acct"  # the Redis server is shared by the run
SLOW_STREAM = f"retention-slow-{uuid.uuid4().hex[:8]}.acct"
KEYS = 20
TRANSACTIONS = 30
LIMIT = 1 << 20  # source.max_retained: 1MiB
BALLAST_ROWS = 6_000  # ~3 MB of WAL in a table no pipeline captures


def last_values(url: str, stream: str) -> dict[int, int]:
    """Each key's value in the last entry of a Redis stream of `acct` events."""
    out: dict[int, int] = {}
    for _, fields in redis.Redis.from_url(url).xrange(stream):
        after = json.loads(fields[b"event"])["after"]
        out[after["id"]] = after["v"]
    return out


def slot_kept(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) "
                           "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    assert row is not None, f"slot {slot} is gone"
    return int(row[0])


@pytest.mark.matrix(
    scenario="an optional sink that never acknowledges while the source writes past "
             "source.max_retained (PostgreSQL slot)",
    guarantee="the optional sink is detached and the slot released; the required sink gets "
              "every change once in order; delivery goes on without restarting; attached "
              "again and snapshotted, the sink holds every row's current value")
def test_an_optional_sink_holding_the_slot_past_max_retained_is_detached_and_the_rest_flows(
        counted: Any, pg_db: str, pg_redis_pipeline: Any, redis_server: Any,
        tcp_proxy: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
        conn.execute("CREATE TABLE ballast (id int PRIMARY KEY, pad text)")
    pipeline = pg_redis_pipeline(
        tables="[public.acct]", source=f"max_retained: {LIMIT}",
        stream=STREAM,
        sink=None)
    link = tcp_proxy(redis_server.port)  # the optional sink's Redis, cut until it is attached
    link.cut()
    slow_url = redis_server.url.replace(f":{redis_server.port}/", f":{link.port}/")
    spec = pipeline.spec_path.read_text()
    pipeline.spec_path.write_text(spec.replace(
        "  bus:", f'    - {{id: slow, type: redis, required: false, url: "{slow_url}", '
                  f'stream: "{SLOW_STREAM}"}}\n  bus:', 1))
    name = pipeline.spec_path.stem
    slot = f"tailrace_{name}".replace("-", "_")
    pipeline.start_all()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO ballast SELECT g, repeat(md5(g::text), 16) "
                     "FROM generate_series(1, %s) g", (BALLAST_ROWS,))
        for t in range(TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: reached(values_per_key(pipeline.redis_url, STREAM), KEYS)
                      == TRANSACTIONS - 1, 120, "every change in the required sink")

    control = pipeline.control_client()

    def slow() -> pb.SinkInfo:
        return next(s for s in control.get_pipeline(name).sinks if s.id == "slow")

    pipeline.wait_for(lambda: slow().HasField("detached"), 90, "the optional sink detached")
    detached = slow().detached
    assert "past source.max_retained 1.0 MiB" in detached.reason, detached.reason
    pipeline.wait_for(lambda: slot_kept(pg_db, slot) < LIMIT, 60, "the slot released")
    pipeline.wait_for(lambda: control.get_pipeline(name).retained_bytes < LIMIT, 60,
                      "capture's next measurement under the limit")
    info = control.get_pipeline(name)
    assert info.state == pb.PIPELINE_DEGRADED and "sink slow detached" in info.reason, info
    assert "detached an optional sink" in (pipeline.dir / "capture.log").read_text()

    restarts = pipeline.log_count("delivery", "restarting from checkpoints")
    pipeline.wait_for(lambda: pipeline.log_count("delivery", "sink detached by the control "
                                                 "service") > 0, 60, "delivery to notice")
    with psycopg.connect(pg_db, autocommit=True) as conn:  # after the detach: on it goes
        for t in range(TRANSACTIONS, 2 * TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: reached(values_per_key(pipeline.redis_url, STREAM), KEYS)
                      == 2 * TRANSACTIONS - 1, 120, "the later changes in the required sink")
    assert pipeline.log_count("delivery", "restarting from checkpoints") <= restarts + 1, \
        "delivery no longer restarts for the detached sink"

    values = values_per_key(pipeline.redis_url, STREAM)
    expected = {k: list(range(2 * TRANSACTIONS)) for k in range(KEYS)}
    counted(**count_values(values, expected),
            outcome=f"optional sink detached past {LIMIT >> 20} MiB; slot released")
    assert values == expected, "every change once, in order per key"
    out = pipeline.cli("checkpoints", name)
    assert "past source.max_retained" in next(line for line in out.splitlines()
                                              if line.split()[1] == "slow")
    pipeline.assert_running()

    # back: its Redis reachable again, attached from where the required sink is, then a
    # snapshot brings what it missed: its stream ends with every row's current value
    link.restore()
    pipeline.cli("pause", name)
    out = pipeline.cli("attach", name, "slow", "--confirm", "slow")
    assert "attached again at tx" in out, out
    pipeline.cli("resume", name)
    pipeline.cli("snapshot", name, "--table", "public.acct")
    final = {k: 2 * TRANSACTIONS - 1 for k in range(KEYS)}
    pipeline.wait_for(lambda: last_values(redis_server.url, SLOW_STREAM) == final, 180,
                      "the attached sink whole again after the snapshot")
    assert control.get_pipeline(name).state == pb.PIPELINE_RUNNING
    print(f"\noptional sink slow detached ({detached.reason}); slot {slot} now keeps "
          f"{slot_kept(pg_db, slot):,} bytes; {KEYS * 2 * TRANSACTIONS} changes in the required "
          "sink once each, in order; attached again and snapshotted, it holds every row's "
          "current value")
