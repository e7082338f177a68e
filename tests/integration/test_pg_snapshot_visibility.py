"""A commit already in the WAL but not yet visible: what a snapshot chunk's read counts as
not seen (`ChunkRows.hidden`), and what a snapshot does when the stream passed such a
commit before it began, on a real server.

PostgreSQL writes a commit record, then marks the transaction completed. In between, a
new snapshot does not see the transaction; and when it is newer than every completed
one, the snapshot does not list it as running either: it is at or past the snapshot's
`xmax`. The stream may meanwhile have passed the commit, before the chunk's low
watermark; the merger must then leave the key to the log (unit test:
tests/unit/test_snapshot_merger.py). A loaded machine showed the race as a read older
than a change before it. Here the window is held open deterministically: with a
synchronous standby named that never connects, a commit waits after its WAL record is
written and before it is marked completed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from tailrace.devservers import PostgresServer
from tailrace.events import ChangeEvent, Column, Op, Row, value_of
from tailrace.proto import control_pb2 as pb
from tailrace_services.capture.snapshot import key_of
from tailrace_services.capture_postgres.snapshot import PostgresChunks
from tests.fix_capture import BusView, column, deduplicated

pytestmark = pytest.mark.integration


def _waiting_commit(dsn: str) -> tuple[threading.Thread, list[BaseException]]:
    """Update row 5 and commit with `synchronous_commit = on`: the commit record is written,
    then the backend waits for the (absent) synchronous standby."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True, application_name="lagging") as conn, \
                    conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = on")
                conn.execute("UPDATE t SET v = -1 WHERE id = 5")
        except psycopg.errors.QueryCanceled:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _wait_sync_rep(admin: psycopg.Connection[Any]) -> str:
    """The held transaction's xid, once its backend waits for the standby."""
    deadline = time.monotonic() + 30
    while True:
        found = admin.execute(
            "SELECT backend_xid::text FROM pg_stat_activity "
            "WHERE application_name = 'lagging' AND wait_event = 'SyncRep'").fetchone()
        if found is not None:
            return str(found[0])
        assert time.monotonic() < deadline, "the commit never waited for a standby"
        time.sleep(0.02)


def test_a_commit_written_but_not_yet_visible_counts_as_not_seen_by_the_read() -> None:
    with PostgresServer() as pg:
        pg.execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
        pg.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 20) g")
        dsn = pg.dsn()
        chunks = PostgresChunks(dsn, "src", "acme", "postgres")
        plan = chunks.plan("public.t")
        chunks.begin_table(plan)  # its own xid commits now, before any standby is waited for
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
            admin.execute("SELECT pg_reload_conf()")
            thread, errors = _waiting_commit(dsn)
            try:
                deadline = time.monotonic() + 30
                while True:
                    found = admin.execute(
                        "SELECT pid, backend_xid::text FROM pg_stat_activity "
                        "WHERE application_name = 'lagging' AND wait_event = 'SyncRep'"
                    ).fetchone()
                    if found is not None:
                        break
                    assert time.monotonic() < deadline, "the commit never waited for a standby"
                    time.sleep(0.02)
                pid, xid = found
                snapshot = admin.execute("SELECT pg_current_snapshot()::text").fetchone()
                assert snapshot is not None
                _, xmax, xip = snapshot[0].split(":")
                assert xid not in xip.split(",") and int(xid) >= int(xmax), \
                    f"the case under test: not listed as running ({snapshot[0]}, xid {xid})"

                rows = chunks.read_chunk(plan, None, 100, "", "tok")

                key = key_of(Row(columns=[Column(name="id", value=value_of(5))]),
                             plan.key_columns)
                read = {c.name: c.value.int_value for c in Row.FromString(rows.rows[key][1]).columns}
                assert read == {"id": 5, "v": 5}, "the read does not see the update to -1"
                assert rows.hidden(xid), f"transaction {xid} counts as not seen by the read"
                inserted = admin.execute("SELECT xmin::text FROM t WHERE id = 1").fetchone()
                assert inserted is not None and not rows.hidden(inserted[0]), \
                    "the transaction that inserted the rows was seen"
            finally:
                admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
                admin.execute("SELECT pg_reload_conf()")
                admin.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'lagging'")
                thread.join(30)
                chunks.close()
        assert not errors, errors



def _v_of(event: ChangeEvent) -> int | None:
    return column(event.after, "v") if event.after.columns else None


def test_a_commit_held_by_a_standby_and_streamed_before_the_snapshot_is_not_undone(
        pg_db: str, capture_rig: Any) -> None:
    """The stream publishes an update whose commit a synchronous standby still holds back
    (not visible to any snapshot yet); then the table is snapshotted on demand. The chunk
    cannot see the update, and the merger never recorded its keys: publishing the read
    would undo the update at the sinks. The chunk is read again until the standby lets the
    commit go, however long that takes (the reader used to give up after 5 s), so the read
    carries the update."""
    from tailrace_services.cli.main import main

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
        conn.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 20) g")
    rig = capture_rig(pg_db, "[public.t]", snapshot={"mode": "never", "chunk_size": 100})
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        admin.execute("SELECT pg_reload_conf()")
        thread, errors = _waiting_commit(pg_db)
        try:
            xid = _wait_sync_rep(admin)
            rig.read(lambda v: any(e.op == Op.OP_UPDATE and _v_of(e) == -1
                                   for _, _, e in v.events), timeout=60)
            visible = admin.execute("SELECT v FROM t WHERE id = 5").fetchone()
            assert visible == (5,), "the update is on the bus, not yet visible"

            assert main(["--control", rig.control.address, "snapshot", rig.name,
                         "--table", "public.t"]) == 0
            capture.wait_log("snapshot chunk read again", 60)
            deadline = time.monotonic() + 60
            while capture.log().count("snapshot chunk read again") < 3:  # and again, held
                assert time.monotonic() < deadline, capture.tail()
                time.sleep(0.05)
            assert rig.snapshot_entry("public.t", lambda e: True).state != pb.SNAPSHOT_DONE
        finally:
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            admin.execute("SELECT pg_reload_conf()")
        thread.join(30)
    assert not errors, errors
    rig.snapshot_entry("public.t", lambda e: e.state == pb.SNAPSHOT_DONE)
    view: BusView = rig.read(lambda v: any(e.op == Op.OP_SNAPSHOT_READ and e.snapshot.last
                                           for _, _, e in v.events), timeout=60)
    events = sorted(deduplicated(view), key=lambda e: (e.position.tx_seq,
                                                       e.position.event_index))
    of_5 = [(Op.Name(e.op), _v_of(e)) for e in events
            if e.after.columns and column(e.after, "id") == 5]
    assert of_5 == [("OP_UPDATE", -1), ("OP_SNAPSHOT_READ", -1)], \
        f"transaction {xid}: the read of key 5 follows its update and carries it"
    reads = [e for e in events if e.op == Op.OP_SNAPSHOT_READ]
    assert len(reads) == 20
    capture.stop()
    print(f"\nheld commit {xid}: the chunk was read again "
          f"{capture.log().count('snapshot chunk read again')} times until it was visible")
