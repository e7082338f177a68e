"""`source.heartbeat_ms` on MariaDB (issue 17, item 2): while the captured table is idle and
another database of the server writes, the checkpoints follow the binlog, so binlogs the
server purges meanwhile are not needed by a restart. Without it the checkpoint stays at the
last captured change, and the same purge is a lost position (a loud stop).

Capture runs as a process; the test commits the sink's checkpoint at an epoch, as a
delivery that delivered everything would (`CaptureRig.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tailrace.devservers import MariaDBServer
from tailrace.events import python_of
from tests.fix_capture import BusView, CaptureRig, assert_position_lost
from tests.fix_mysql import purge_binlogs_to

pytestmark = pytest.mark.integration

BUSY_TX = 30


def has_id(row_id: int) -> Callable[[BusView], bool]:
    return lambda v: any(e.after.columns and python_of(e.after.columns[0].value) == row_id
                         for _, _, e in v.events)


@pytest.mark.parametrize("heartbeat_ms", [0, 200])
def test_checkpoints_follow_the_binlog_of_other_tables_only_with_heartbeats(
        heartbeat_ms: int, make_mariadb_server: Callable[..., MariaDBServer],
        mysql_rig: Callable[..., CaptureRig]) -> None:
    server = make_mariadb_server()
    server.execute("CREATE DATABASE shop")
    server.execute("CREATE TABLE shop.items (id bigint PRIMARY KEY, v varchar(40))")
    server.execute("CREATE DATABASE busy")
    server.execute("CREATE TABLE busy.pad (id int AUTO_INCREMENT PRIMARY KEY, t text)")
    rig = mysql_rig(server, ["shop.items"])
    rig.spec_path.write_text(rig.spec_path.read_text().replace(
        "    on_schema_drift:", f"    heartbeat_ms: {heartbeat_ms}\n    on_schema_drift:"))

    capture = rig.start()
    capture.wait_streaming()
    server.execute("INSERT INTO shop.items VALUES (1, 'captured')")
    row_tx = next(e.position.tx_seq for _, _, e in rig.read(has_id(1)).events)
    epoch = rig.wait_epoch(lambda e: e.position.tx_seq >= row_tx, timeout=30)
    for _ in range(BUSY_TX):  # the captured table idle, another database busy
        server.execute("INSERT INTO busy.pad (t) VALUES (repeat('x', 500))")
    if heartbeat_ms:  # the epoch at the server's last transaction, the busy ones included
        last = server.execute("SELECT @@gtid_binlog_pos")[0][0]
        epoch = rig.wait_epoch(lambda e: e.position.mysql.gtid == last, timeout=30)
    rig.checkpoint(epoch)  # a delivery that delivered everything up to it
    assert capture.stop() == 0

    server.execute("FLUSH BINARY LOGS")  # the server purges what it wrote meanwhile
    purge_binlogs_to(server, server.execute("SHOW BINARY LOGS")[-1][0])
    again = rig.start("--http-port", "0")
    if not heartbeat_ms:
        assert_position_lost(rig, again, "binlogs were purged past our checkpoint",
                             exit_code=None)
        print(f"\nno heartbeat: checkpoint at tx_seq {epoch.position.tx_seq}, "
              f"{BUSY_TX} transactions of another database later; after the purge: "
              "position lost")
        return
    again.wait_streaming()
    server.execute("INSERT INTO shop.items VALUES (2, 'after the purge')")
    view = rig.read(has_id(2))
    assert [python_of(e.after.columns[0].value) for _, _, e in view.events
            if e.after.columns] == [1, 2], "every row change once"
    assert "Re-snapshot required" not in again.log()
    assert again.stop() == 0
    print(f"\nheartbeat_ms {heartbeat_ms}: the checkpoint followed {BUSY_TX} transactions of "
          f"another database (tx_seq {row_tx} -> {epoch.position.tx_seq}); after the purge "
          "capture went on, every change once")
