"""The source log a pipeline keeps on its server, measured by capture and shown by the
control service (issue 17, item 1): PostgreSQL, WAL the slot holds from the position it
confirmed; MySQL/MariaDB, binlog bytes from the sinks' minimum checkpoint. It grows while
no sink checkpoint moves and falls back once one does (capture measures every 10 s)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tailrace.devservers import MariaDBServer
from tests.fix_capture import CaptureRig, setup_items

pytestmark = pytest.mark.integration

ROWS = 2_000


def kept(rig: CaptureRig, until: Callable[[int], bool], timeout: float = 60) -> tuple[int, str]:
    """The control service's figure for the pipeline once `until(bytes)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        info = rig.control.client.get_pipeline(rig.name)
        if info.HasField("retained_bytes") and until(info.retained_bytes):
            return info.retained_bytes, info.retained_what
        assert time.monotonic() < deadline, f"retained log never satisfied the test: {info}"
        time.sleep(0.5)


def test_postgres_the_slot_holds_what_no_sink_checkpointed(pg_db: str, capture_rig: Any
                                                            ) -> None:
    setup_items(pg_db)
    rig = capture_rig(pg_db, "[public.items]")
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, repeat('x', 500) FROM generate_series(1, %s) g",
                     (ROWS,))
    held, what = kept(rig, lambda n: n > ROWS * 500)
    assert what == f"slot {rig.slot}"
    epoch = rig.wait_epoch(lambda e: e.position.tx_seq > 0)
    rig.checkpoint(epoch)  # a delivery took everything: the slot may confirm it
    after, _ = kept(rig, lambda n: n < held // 10)
    capture.stop()
    print(f"\nslot {rig.slot}: {held:,} bytes kept before any checkpoint, {after:,} after it")


def test_mariadb_binlogs_from_the_sinks_checkpoint_are_what_it_keeps(
        mariadb_server: MariaDBServer, mysql_rig: Any) -> None:
    db = f"r_{uuid.uuid4().hex[:10]}"
    mariadb_server.create_database(db)
    mariadb_server.execute("CREATE TABLE items (id int PRIMARY KEY, v text)", db=db)
    rig = mysql_rig(mariadb_server, [f"{db}.items"])
    capture = rig.start()
    capture.wait_streaming()
    mariadb_server.execute("INSERT INTO items VALUES (1, 'a')", db=db)
    rig.checkpoint(rig.wait_epoch(lambda e: e.position.tx_seq > 0))
    small, what = kept(rig, lambda n: True)
    assert what.startswith("binlogs from mysql-bin."), what
    mariadb_server.execute(f"INSERT INTO items SELECT seq, REPEAT('x', 500) FROM "
                           f"seq_2_to_{ROWS}", db=db)
    grown, _ = kept(rig, lambda n: n > small + ROWS * 500)
    capture.stop()
    print(f"\n{what}: {small:,} bytes kept at the checkpoint, {grown:,} after {ROWS} more rows "
          "with no checkpoint moving")
