"""After a lost position, `tailrace resnapshot` (or `snapshot.mode: when_needed`) brings a
PostgreSQL pipeline back: the server as it is now, every table read again (issue 14.5).

Each case loses the position for real, with rows changed while capture could not follow
(inserted, updated, deleted); checks that capture first stops loudly (503, `position
lost`), then, once the resnapshot is asked for, that what a delivery keeps of the bus
(each position once, forward only: `deduplicated`) replays to exactly the source's rows:
the re-read starts with a TRUNCATE per table, and positions of the new era sort after
everything published before, whatever the new server's LSNs.

- the slot dropped (same server): an operator's `tailrace resnapshot`, while the
  stopped capture waits;
- the server replaced by another cluster on the same address, whose WAL is behind
  ours: `snapshot.mode: when_needed`, with no operator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tailrace.devservers import PostgresServer
from tailrace.events import python_of
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import Op
from tests.fix_capture import (
    BusView,
    CaptureProcess,
    CaptureRig,
    assert_position_lost,
    deduplicated,
    http_health,
    operator_resnapshots,
    replayed,
    setup_items,
    stream_and_checkpoint,
)

pytestmark = pytest.mark.chaos

END = 999_999  # the id of the last row written: once it is on the bus, so is the rest


def items_of(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {int(i): v for i, v in conn.execute("SELECT id, v FROM items")}


def change_rows_unseen(dsn: str) -> None:
    """What capture cannot follow: an update, a delete and an insert."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET v = 'changed unseen' WHERE id = 3")
        conn.execute("DELETE FROM items WHERE id = 5")
        conn.execute("INSERT INTO items VALUES (500, 'inserted unseen')")


def change_rows_after(dsn: str) -> None:
    """What the new era streams once it runs, ending with row END."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET v = 'changed after' WHERE id = 4")
        conn.execute("DELETE FROM items WHERE id = 6")
        conn.execute("INSERT INTO items VALUES (%s, 'the end')", (END,))


def wait_table_done(rig: CaptureRig, timeout: float = 120) -> pb.SnapshotTable:
    deadline = time.monotonic() + timeout
    while True:
        tables = {t.table: t for t in rig.control.client.snapshot_state(rig.name).tables}
        entry = tables.get("public.items")
        if entry is not None and entry.state == pb.SNAPSHOT_DONE:
            return entry
        assert time.monotonic() < deadline, entry
        time.sleep(0.2)


def assert_consistent(rig: CaptureRig, capture: CaptureProcess, dsn: str,
                      old_max_tx: int) -> BusView:
    """Once the re-read is done and row END streamed: the bus, as a delivery keeps it,
    replays to the source's rows; the new era sorts after the old; healthy again."""
    entry = wait_table_done(rig)
    assert entry.reset and entry.reason.startswith("resnapshot: "), entry
    view = rig.read(lambda v: any(python_of(e.after.columns[0].value) == END
                                  for _, _, e in v.events if e.after.columns))
    kept = deduplicated(view)
    source = items_of(dsn)
    assert replayed(kept, "items") == source
    new_era = [e for e in kept if e.position.tx_seq > old_max_tx]
    truncates = [e for e in new_era if e.op == Op.OP_TRUNCATE]
    reads = [e for e in new_era if e.op == Op.OP_SNAPSHOT_READ]
    assert len(truncates) == 1 and new_era.index(truncates[0]) < new_era.index(reads[0])
    read_ids = [int(python_of(e.after.columns[0].value)) for e in reads]
    assert len(read_ids) == len(set(read_ids)), "a row read twice"
    # the TRUNCATE cleared them: every row not changed since comes back as a read
    assert set(source) - {4, END} <= set(read_ids)
    status, _ = http_health(capture)
    assert status == 200
    print(f"\n{len(kept)} events kept: {len(kept) - len(new_era)} before the loss, "
          f"{len(reads)} read again after a TRUNCATE, "
          f"{len(new_era) - len(reads) - 1} streamed; {len(source)} rows, as the source")
    return view


@pytest.mark.matrix(
    scenario="PostgreSQL slot dropped and rows changed meanwhile, then tailrace resnapshot",
    guarantee="recovery from a lost position: 503 first, then the bus replays to exactly the source's rows "
              "(a TRUNCATE first), none read twice")
def test_a_dropped_slot_comes_back_with_tailrace_resnapshot(
        counted: Any, pg_db: str, capture_rig: Callable[..., CaptureRig],
        capsys: pytest.CaptureFixture[str]) -> None:

    setup_items(pg_db)
    rig = capture_rig(pg_db, "[public.items]", snapshot={"mode": "never", "chunk_size": 7})
    assert stream_and_checkpoint(rig, pg_db, 1).stop() == 0
    old_max_tx = rig.control.client.latest_epoch(rig.source_id).position.tx_seq
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (rig.slot,))
    change_rows_unseen(pg_db)

    capture = rig.start("--http-port", "0")
    assert_position_lost(rig, capture, f"replication slot '{rig.slot}' does not exist",
                         exit_code=None)
    operator_resnapshots(rig, capture, capsys)
    change_rows_after(pg_db)

    assert_consistent(rig, capture, pg_db, old_max_tx)
    records = rig.control.client.list_reconcile_records(rig.source_id)
    assert [r.decision for r in records] == ["accepted"]
    assert records[0].new_identity.attributes["era"] == "1"
    assert capture.stop() == 0
    counted(outcome="position lost, then resnapshot: the bus replays to the source's rows")


@pytest.mark.matrix(
    scenario="PostgreSQL replaced by a cluster whose WAL is behind ours, snapshot.mode when_needed",
    guarantee="recovery by itself: new-era positions sort after the old; the bus replays to the source's "
              "rows")
def test_a_replaced_server_behind_our_lsns_comes_back_by_itself_when_needed(
        counted: Any, make_pg_server: Callable[..., PostgresServer],
        capture_rig: Callable[..., CaptureRig]) -> None:
    server_a = make_pg_server()
    dsn = server_a.create_database("shop")
    setup_items(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:  # WAL well past server B's
        conn.execute("INSERT INTO items SELECT g, 'bulk' FROM generate_series(1000, 30000) g")
        conn.execute("DELETE FROM items WHERE id >= 1000")
    rig = capture_rig(dsn, "[public.items]",
                      snapshot={"mode": "when_needed", "chunk_size": 7})
    assert stream_and_checkpoint(rig, dsn, 1).stop() == 0
    old_max_tx = rig.control.client.latest_epoch(rig.source_id).position.tx_seq

    # server B: another cluster with other rows, on server A's address
    server_b = make_pg_server()
    dsn_b = server_b.create_database("shop")
    setup_items(dsn_b)
    with psycopg.connect(dsn_b, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 'theirs' FROM generate_series(3, 12) g")
    server_b.stop(keep_data=True)
    with open(server_b.datadir / "postgresql.conf", "a") as conf:
        conf.write(f"port = {server_a.port}\n")
    server_b.port = server_a.port
    server_a.stop()
    server_b.start()
    change_rows_unseen(dsn)
    b_wal = server_b.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0]
    assert int(b_wal) < old_max_tx & ((1 << 48) - 1), "server B's WAL is behind ours"

    capture = rig.start("--http-port", "0")
    capture.wait_log("this is a different cluster")
    capture.wait_log("reading every table again (snapshot.mode when_needed)")
    capture.wait_streaming()
    change_rows_after(dsn)

    assert_consistent(rig, capture, dsn, old_max_tx)
    records = rig.control.client.list_reconcile_records(rig.source_id)
    assert [r.decision for r in records] == ["resnapshot", "accepted"]
    assert "when_needed" in records[1].drift[1]
    assert capture.stop() == 0
    counted(outcome="position lost, then re-snapshotted by itself: the bus replays to the source's rows")


