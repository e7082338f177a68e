"""`snapshot.key_columns`: a PostgreSQL table without a key of its own, read and streamed
keyed by the columns the spec names; and what is refused, naming the fix.

- a keyless REPLICA IDENTITY FULL table: every row read once, in chunks by the given
  columns, changed meanwhile by a writer; streamed events keyed by the same columns; the
  bus replayed equals the source;
- without key_columns, the same table's snapshot fails naming the setting;
- REPLICA IDENTITY DEFAULT: capture refuses to start (exit 2), naming ALTER TABLE;
- columns that are not unique: the table's snapshot fails naming the duplicate.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from tailrace.events import ChangeEvent, Op, Row, python_of, value_of
from tailrace.proto import control_pb2 as pb
from tailrace_services.capture_postgres.snapshot import PostgresChunks
from tests.fix_capture import CaptureRig, deduplicated

pytestmark = pytest.mark.integration

ROWS = 3_000
KEY = {"public.logs": ["host", "seq"]}


def make_logs(dsn: str, *, full: bool = True) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE logs (host text NOT NULL, seq int NOT NULL, line text)")
        if full:
            conn.execute("ALTER TABLE logs REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO logs SELECT 'h' || (g %% 3), g, 'line ' || g "
                     "FROM generate_series(1, %s) g", (ROWS,))


def logs_of(dsn: str) -> dict[tuple[str, int], str]:
    with psycopg.connect(dsn) as conn:
        return {(h, s): line for h, s, line in conn.execute("SELECT host, seq, line FROM logs")}


def wait_entry(rig: CaptureRig, until: Any, timeout: float = 120) -> pb.SnapshotTable:
    return rig.snapshot_entry("public.logs", until, timeout)


def values(event: ChangeEvent) -> dict[str, Any]:
    image = event.after if event.after.columns else event.before
    return {c.name: python_of(c.value) for c in image.columns}


def test_a_keyless_table_is_read_and_streamed_by_its_key_columns(pg_db: str,
                                                                 capture_rig: Any) -> None:
    make_logs(pg_db)
    rig = capture_rig(pg_db, "[public.logs]",
                      snapshot={"mode": "initial", "chunk_size": 250, "key_columns": KEY})
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db, autocommit=True) as conn:  # while the snapshot runs
        for seq in range(1, 60):
            conn.execute("UPDATE logs SET line = 'changed' WHERE seq = %s", (seq * 40,))
        conn.execute("DELETE FROM logs WHERE seq <= 30")
    entry = wait_entry(rig, lambda e: e.state == pb.SNAPSHOT_DONE)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO logs VALUES ('end', 0, 'the end')")
    view = rig.read(lambda v: any(e.after.columns and values(e)["host"] == "end"
                                  for _, _, e in v.events))
    kept = deduplicated(view)
    assert {tuple(e.key_columns) for e in kept} == {("host", "seq")}, "one key everywhere"
    rows: dict[tuple[str, int], str] = {}
    for event in sorted(kept, key=lambda e: (e.position.tx_seq, e.position.event_index)):
        v = values(event)
        if event.op == Op.OP_DELETE:
            rows.pop((v["host"], v["seq"]), None)
        else:
            rows[(v["host"], v["seq"])] = v["line"]
    assert rows == logs_of(pg_db)
    reads = [(values(e)["host"], values(e)["seq"]) for e in kept
             if e.op == Op.OP_SNAPSHOT_READ]
    assert len(reads) == len(set(reads)), "a row read twice"
    assert entry.chunks_done >= ROWS // 250 - 1
    capture.stop()
    print(f"\n{len(reads)} rows read by (host, seq) in {entry.chunks_done} chunks; "
          f"{len(kept) - len(reads)} changes streamed with the same key")


def test_a_keyless_table_without_key_columns_fails_naming_the_setting(
        pg_db: str, capture_rig: Any) -> None:
    make_logs(pg_db)
    rig = capture_rig(pg_db, "[public.logs]", snapshot={"mode": "initial"})
    capture = rig.start()
    capture.wait_streaming()
    entry = wait_entry(rig, lambda e: e.state == pb.SNAPSHOT_FAILED, 60)
    assert "public.logs has no primary key" in entry.reason
    assert "spec.source.snapshot.key_columns" in entry.reason
    capture.stop()


def test_key_columns_on_a_table_without_full_identity_is_refused_at_start(
        pg_db: str, capture_rig: Any) -> None:
    make_logs(pg_db, full=False)
    rig = capture_rig(pg_db, "[public.logs]", snapshot={"mode": "initial", "key_columns": KEY})
    capture = rig.start()
    assert capture.wait_exit(60) == 2, capture.tail()
    assert "spec.source.snapshot.key_columns: public.logs is REPLICA IDENTITY DEFAULT" in \
        capture.log()
    assert "ALTER TABLE public.logs REPLICA IDENTITY FULL" in capture.log()


def test_key_columns_that_are_not_unique_fail_the_table_naming_the_rows(
        pg_db: str, capture_rig: Any) -> None:
    make_logs(pg_db)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO logs VALUES ('h1', 1, 'again')")
    rig = capture_rig(pg_db, "[public.logs]",
                      snapshot={"mode": "initial", "key_columns": {"public.logs": ["host"]}})
    capture = rig.start()
    capture.wait_streaming()
    entry = wait_entry(rig, lambda e: e.state == pb.SNAPSHOT_FAILED, 60)
    assert "public.logs has two rows with host = h0" in entry.reason, entry.reason
    capture.stop()


def test_a_server_printing_dates_otherwise_still_gives_the_streams_values(pg_db: str) -> None:
    """A database whose DateStyle is not ISO: the snapshot's session pins the settings the
    replication session pins, so a timestamp key reads as the timestamp pgoutput sends
    (not as unparsed text that would never equal a streamed key)."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        conn.execute(f"ALTER DATABASE {name} SET DateStyle = 'SQL, DMY'")
        conn.execute("CREATE TABLE events (at timestamptz PRIMARY KEY, n int)")
        conn.execute("INSERT INTO events VALUES ('2026-11-24 07:30:01.5+00', 1)")
    with psycopg.connect(pg_db, autocommit=True) as conn:  # as a plain session sees it
        assert conn.execute("SELECT at::text FROM events").fetchone()[0].startswith("24/11/2026")  # type: ignore[index]
    chunks = PostgresChunks(pg_db, "src", "acme", "db")
    try:
        plan = chunks.plan("public.events")
        chunks.begin_table(plan)
        rows = chunks.read_chunk(plan, None, 10, "", "tok")
    finally:
        chunks.close()
    [(key, (_, row))] = rows.rows.items()
    at = Row.FromString(row).columns[0].value
    assert at.WhichOneof("kind") == "timestamp_value", at
    assert key == (value_of(dt.datetime(2026, 11, 24, 7, 30, 1, 500000, tzinfo=dt.UTC))
                   .SerializeToString(),)
    assert rows.cursor == ["2026-11-24 07:30:01.5+00"]
