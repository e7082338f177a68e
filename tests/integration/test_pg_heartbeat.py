"""`source.heartbeat_ms` (issue 17, item 2): an idle captured database beside a busy one on
the same PostgreSQL server. Without heartbeats the slot holds the busy database's WAL; with
them it follows the server's WAL, and a capture resumed from a heartbeat's checkpoint goes
on with every change once, in order.

Real processes (control, capture, Spark delivery) and a Redis sink; progress, not sleeps:
the heartbeat-less capture is shown to hold the slot once its own metrics say it knew the
server's WAL had moved past the busy writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tailrace.devservers import PostgresServer
from tests.fix_pipeline import RunningPipeline, reached, values_per_key, write_account_tx

pytestmark = pytest.mark.integration

KEYS = 5
BUSY_ROWS = 8_000  # of 1 kB: ~10 MB of WAL in the other database
HEARTBEAT_MS = 200


@pytest.fixture
def busy_db(pg_server: PostgresServer) -> Iterator[str]:
    name = f"busy_{uuid.uuid4().hex[:8]}"
    pg_server.create_database(name)
    pg_server.execute("CREATE TABLE pad (id serial PRIMARY KEY, t text)", dbname=name)
    yield name
    pg_server.drop_database(name)


def busy_writes(server: PostgresServer, dbname: str) -> int:
    """WAL in another database; returns the server's WAL position after it."""
    server.execute(f"INSERT INTO pad (t) SELECT repeat('x', 1000) "  # noqa: S608
                   f"FROM generate_series(1, {BUSY_ROWS})", dbname=dbname)
    return int(server.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])


def wal_insert_lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def confirmed(server: PostgresServer, slot: str) -> int:
    rows = server.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                          "WHERE slot_name = %s", [slot])
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


def test_heartbeats_move_the_slot_of_an_idle_database_and_resume_from_them(
        pg_db: str, pg_server: PostgresServer, busy_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    stream = f"hb{uuid.uuid4().hex[:6]}"
    pipeline: RunningPipeline = pg_redis_pipeline(tables="[public.acct]",
                                                  stream=stream + ".{table}")
    slot = "tailrace_" + pipeline.spec_path.stem.replace("-", "_").replace(".", "_")
    with_heartbeat = pipeline.dir / "heartbeat.yaml"
    with_heartbeat.write_text(pipeline.spec_path.read_text().replace(
        "    tables: [public.acct]", f"    tables: [public.acct]\n    heartbeat_ms: {HEARTBEAT_MS}"))
    pipeline.start("control")
    pipeline.start("capture", "--http-port", "0")
    pipeline.start("delivery")
    pipeline.wait_capture_streaming()

    def delivered_up_to() -> int:
        return reached(values_per_key(pipeline.redis_url, f"{stream}.acct"), KEYS)

    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(3):
            before_last = wal_insert_lsn(conn)  # the last transaction's changes come after it
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: delivered_up_to() == 2, 240, "the first changes")
    # confirmed up to the last transaction's last change (`confirm_point`), no further: not
    # just past the first's, which left the slot to move once more below
    pipeline.wait_for(lambda: confirmed(pg_server, slot) >= before_last, 60,
                      "the slot confirmed up to the last transaction")
    held = confirmed(pg_server, slot)

    # without heartbeats: capture sees the server's WAL end pass the busy writes (its own
    # retained-WAL metric), and the slot stays where the last captured change put it
    busy_end = busy_writes(pg_server, busy_db)
    pipeline.wait_for(
        lambda: pipeline.metric("capture", "tailrace_capture_retained_bytes")
        >= busy_end - held, 60, "capture to see the server's WAL past the busy writes")
    without = confirmed(pg_server, slot)
    assert without == held, "no heartbeat: the slot holds the other database's WAL"
    held_back = busy_end - held

    # with heartbeats: the same capture restarted with `heartbeat_ms`
    pipeline.kill("capture")
    pipeline.specs["capture"] = with_heartbeat
    pipeline.start("capture", "--http-port", "0")
    pipeline.wait_for(lambda: confirmed(pg_server, slot) >= busy_end, 120,
                      "heartbeats to move the slot past the busy writes")
    busy_end = busy_writes(pg_server, busy_db)
    pipeline.wait_for(lambda: confirmed(pg_server, slot) >= busy_end, 120,
                      "heartbeats to move the slot past the next busy writes")
    retained = int(pg_server.execute("SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM "
                                     "pg_replication_slots WHERE slot_name = %s", [slot])[0][0])

    # resumed from a heartbeat's checkpoint: kill -9, then more changes
    pipeline.kill("capture")
    pipeline.start("capture", "--http-port", "0")
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(3, 6):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: delivered_up_to() == 5, 180, "the changes after the resume")
    assert values_per_key(pipeline.redis_url, f"{stream}.acct") == {
        k: list(range(6)) for k in range(KEYS)}, "each key's values once each, in order"
    assert pipeline.log_count("capture", '"event": "position lost') == 0
    pipeline.assert_running()
    print(f"\nslot {slot}: without heartbeats held at {held:X} while the server's WAL "
          f"passed {held_back:,} bytes further; with heartbeat_ms {HEARTBEAT_MS} it "
          f"followed the busy writes ({retained:,} bytes retained after the second), and a "
          "capture resumed from a heartbeat's checkpoint delivered every later change once")
