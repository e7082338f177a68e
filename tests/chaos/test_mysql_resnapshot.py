"""After a lost position, `tailrace resnapshot` (or `snapshot.mode: when_needed`) brings a
MariaDB pipeline back: the server as it is now, every table read again, as for PostgreSQL
(test_pg_resnapshot.py).

Each case loses the position for real, with rows changed while capture could not follow
(inserted, updated, deleted); checks that capture first stops loudly (`position lost`),
then, once the resnapshot is asked for, that what a delivery keeps of the bus (each
position once, forward only: `deduplicated`) replays to exactly the source's rows: the
re-read starts with a TRUNCATE of the table, and the new history's positions number after
everything published before (`capture_mysql/position.py`), whatever GTIDs the server has.

- binlogs purged past our checkpoint while capture was down (same server): 503, then an
  operator's `tailrace pause` + `tailrace resnapshot --confirm`, while the stopped capture
  waits; a restart afterwards, with the sinks' checkpoint still in the lost history,
  continues without stopping again;
- the server replaced by another MariaDB on the same address, whose GTIDs `0-1-N` reuse
  our numbers: `snapshot.mode: when_needed`, with no operator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tailrace.devservers import MariaDBServer
from tailrace.events import python_of
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import ChangeEvent, Op
from tests.fix_capture import (
    BusView,
    CaptureProcess,
    CaptureRig,
    assert_position_lost,
    deduplicated,
    http_health,
    operator_resnapshots,
    replayed,
)
from tests.fix_mysql import purge_binlogs_to

pytestmark = pytest.mark.chaos

END = 999_999  # the id of the last row written: once it is on the bus, so is the rest
TABLE = "shop.items"


def setup_items(server: MariaDBServer) -> None:
    server.execute("CREATE DATABASE IF NOT EXISTS shop")
    server.execute("CREATE TABLE IF NOT EXISTS shop.items (id bigint PRIMARY KEY, "
                   "v varchar(40))")


def items_of(server: MariaDBServer) -> dict[int, str]:
    return {int(i): str(v) for i, v in server.execute("SELECT id, v FROM shop.items")}


def change_rows_unseen(server: MariaDBServer) -> None:
    """What capture cannot follow: an update, a delete and an insert."""
    server.execute("UPDATE shop.items SET v = 'changed unseen' WHERE id = 3")
    server.execute("DELETE FROM shop.items WHERE id = 5")
    server.execute("INSERT INTO shop.items VALUES (500, 'inserted unseen')")


def change_rows_after(server: MariaDBServer) -> None:
    """What the new history streams once it runs, ending with row END."""
    server.execute("UPDATE shop.items SET v = 'changed after' WHERE id = 4")
    server.execute("DELETE FROM shop.items WHERE id = 6")
    server.execute("INSERT INTO shop.items VALUES (%s, 'the end')", (END,))


def has_id(row_id: int) -> Callable[[BusView], bool]:
    return lambda v: any(e.after.columns and python_of(e.after.columns[0].value) == row_id
                         for _, _, e in v.events)


def stream_and_checkpoint(rig: CaptureRig, server: MariaDBServer, rows: int = 20) -> int:
    """Run capture, write `rows` single-row transactions (ids 1..rows), wait for them on
    the bus and commit the sink checkpoint at the epoch covering them, as a delivery
    would; stop capture. Returns the highest tx_seq published."""
    capture = rig.start()
    capture.wait_streaming()
    for i in range(1, rows + 1):
        server.execute("INSERT INTO shop.items VALUES (%s, 'x')", (i,))
    view = rig.read(has_id(rows), timeout=60)
    last_tx = max(e.position.tx_seq for _, _, e in view.events)
    rig.checkpoint(rig.wait_epoch(lambda e: e.position.tx_seq >= last_tx, timeout=30))
    assert capture.stop() == 0
    return rig.control.client.latest_epoch(rig.source_id).position.tx_seq


def wait_table_done(rig: CaptureRig, timeout: float = 120) -> pb.SnapshotTable:
    deadline = time.monotonic() + timeout
    while True:
        tables = {t.table: t for t in rig.control.client.snapshot_state(rig.name).tables}
        entry = tables.get(TABLE)
        if entry is not None and entry.state == pb.SNAPSHOT_DONE and entry.reset:
            return entry
        assert time.monotonic() < deadline, entry
        time.sleep(0.2)


def assert_consistent(rig: CaptureRig, capture: CaptureProcess, server: MariaDBServer,
                      old_max_tx: int) -> list[ChangeEvent]:
    """Once the re-read is done and row END streamed: the bus, as a delivery keeps it,
    replays to the source's rows; the new history numbers after the old; healthy again."""
    entry = wait_table_done(rig)
    assert entry.reason.startswith("resnapshot: "), entry
    kept = deduplicated(rig.read(has_id(END)))
    source = items_of(server)
    assert replayed(kept, "items") == source
    new = [e for e in kept if e.position.tx_seq > old_max_tx]
    truncates = [e for e in new if e.op == Op.OP_TRUNCATE]
    reads = [e for e in new if e.op == Op.OP_SNAPSHOT_READ]
    assert len(truncates) == 1 and reads and new.index(truncates[0]) < new.index(reads[0])
    assert (truncates[0].database, truncates[0].table) == ("shop", "items")
    read_ids = [int(python_of(e.after.columns[0].value)) for e in reads]
    assert len(read_ids) == len(set(read_ids)), "a row read twice"
    # the TRUNCATE cleared them: every row not changed since comes back as a read
    assert set(source) - {4, END} <= set(read_ids)
    assert http_health(capture)[0] == 200
    print(f"\n{len(kept)} events kept: {len(kept) - len(new)} before the loss, "
          f"{len(reads)} read again after a TRUNCATE, "
          f"{len(new) - len(reads) - 1} streamed; {len(source)} rows, as the source")
    return kept


@pytest.mark.matrix(
    scenario="MariaDB binlogs purged past the checkpoint while capture was down, then tailrace resnapshot",
    guarantee="recovery from a lost position: 503 first, then the bus replays to exactly the source's rows")
def test_binlogs_purged_while_capture_was_down_come_back_with_tailrace_resnapshot(
        counted: Any, make_mariadb_server: Callable[..., MariaDBServer], mysql_rig: Callable[..., CaptureRig],
        capsys: pytest.CaptureFixture[str]) -> None:

    server = make_mariadb_server()
    setup_items(server)
    rig = mysql_rig(server, [TABLE], snapshot={"mode": "never", "chunk_size": 7})
    old_max_tx = stream_and_checkpoint(rig, server)
    change_rows_unseen(server)
    server.execute("FLUSH BINARY LOGS")
    purge_binlogs_to(server, server.execute("SHOW BINARY LOGS")[-1][0])

    capture = rig.start("--http-port", "0")
    assert_position_lost(rig, capture, "binlogs were purged past our checkpoint",
                         exit_code=None)
    operator_resnapshots(rig, capture, capsys)
    change_rows_after(server)

    assert_consistent(rig, capture, server, old_max_tx)
    records = rig.control.client.list_reconcile_records(rig.source_id)
    assert [r.decision for r in records] == ["accepted"]
    accepted: Any = records[0].new_identity.attributes
    assert int(accepted["accepted_tx_seq"]) >= old_max_tx
    assert capture.stop() == 0

    # the sinks' checkpoint is still in the lost history: a restart continues regardless
    assert rig.sink_checkpoint().position.tx_seq <= old_max_tx  # type: ignore[union-attr]
    again = rig.start("--http-port", "0")
    again.wait_streaming()
    server.execute("INSERT INTO shop.items VALUES (%s, 'after a restart')", (END + 1,))
    kept = deduplicated(rig.read(has_id(END + 1)))
    assert replayed(kept, "items") == items_of(server)
    assert http_health(again)[0] == 200
    assert "Re-snapshot required" not in again.log()
    assert [r.decision for r in rig.control.client.list_reconcile_records(rig.source_id)] \
        == ["accepted"]
    assert again.stop() == 0
    counted(outcome="position lost, then resnapshot: the bus replays to the source's rows, none read twice")


@pytest.mark.matrix(
    scenario="MariaDB replaced by a fresh server reusing and passing our GTIDs, snapshot.mode when_needed",
    guarantee="recovery by itself: the new history numbered after the old, the bus replays to the source's "
              "rows")
def test_a_replaced_server_reusing_our_gtids_comes_back_by_itself_when_needed(
        counted: Any, make_mariadb_server: Callable[..., MariaDBServer],
        mysql_rig: Callable[..., CaptureRig]) -> None:
    server_a = make_mariadb_server(server_id=1)
    setup_items(server_a)
    rig = mysql_rig(server_a, [TABLE], snapshot={"mode": "when_needed", "chunk_size": 7})
    old_max_tx = stream_and_checkpoint(rig, server_a)
    ours = server_a.execute("SELECT @@gtid_binlog_pos")[0][0]

    # server B: a fresh data directory on server A's address, server_id 1 and domain 0 too
    port = server_a.port
    created = server_a.execute("SELECT UNIX_TIMESTAMP(CREATE_TIME) FROM information_schema."
                               "TABLES WHERE TABLE_SCHEMA = 'mysql' AND "
                               "TABLE_NAME = 'global_priv'")[0][0]
    server_a.stop()
    while int(time.time()) <= created:  # data directories made in one second look alike
        time.sleep(0.05)
    server_b = make_mariadb_server(port=port, server_id=1)
    setup_items(server_b)
    for i in range(3, 40):  # other rows, and GTIDs past ours
        server_b.execute("INSERT INTO shop.items VALUES (%s, 'theirs')", (i,))
    change_rows_unseen(server_b)
    theirs = server_b.execute("SELECT @@gtid_binlog_pos")[0][0]
    assert int(theirs.split("-")[2]) > int(ours.split("-")[2]), (ours, theirs)

    capture = rig.start("--http-port", "0")
    capture.wait_log("this is a different server")
    capture.wait_log("Re-snapshot required.")
    capture.wait_log("reading every table again (snapshot.mode when_needed)")
    capture.wait_streaming()
    change_rows_after(server_b)

    assert_consistent(rig, capture, server_b, old_max_tx)
    records = rig.control.client.list_reconcile_records(rig.source_id)
    assert [r.decision for r in records] == ["resnapshot", "accepted"]
    assert "when_needed" in records[1].drift[1]
    print(f"ours {ours}, theirs {theirs}")
    assert capture.stop() == 0
    counted(outcome="position lost, then re-snapshotted by itself: the bus replays to the source's rows")


