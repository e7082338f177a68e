"""`snapshot.key_columns` on MariaDB: a table without a primary key, read and streamed keyed
by the columns the spec names; and what is refused, naming the fix.

- a keyless table read in chunks by (host, seq) while a writer updates, deletes, inserts and
  re-keys rows: every event, read and streamed, carries key_columns (host, seq) and is in
  the bus partition of that key; each row read once; the bus replayed equals the source;
- a bad setting refused at start (exit 2), naming the table and the fix: a table not
  selected, one with a primary key of its own, a missing column, a nullable column, a
  column not read in key order; a server without binlog_row_image=FULL;
- columns that are not unique (exactly, or as the server's collation compares them): the
  table's snapshot fails naming the key.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tailrace.bus import partition_for
from tailrace.devservers import MariaDBServer
from tailrace.events import Op, Row, bus_key, python_of
from tailrace.proto import control_pb2 as pb
from tests.fix_capture import deduplicated

pytestmark = pytest.mark.integration

ROWS = 3_000
PARTITIONS = 4
KEY = ["host", "seq"]
LOGS = "host varchar(10) NOT NULL, seq int NOT NULL, line varchar(40)"

RowKey = tuple[str, int]


def make_logs(server: MariaDBServer, columns: str = LOGS) -> str:
    """A database of its own with table `logs`: ROWS rows, host h0..h2, seq 1..ROWS."""
    db = f"k_{uuid.uuid4().hex[:10]}"
    server.create_database(db)
    server.execute(f"CREATE TABLE logs ({columns})", db=db)
    server.execute("INSERT INTO logs (host, seq, line) SELECT CONCAT('h', seq % 3), seq, "
                   f"CONCAT('line ', seq) FROM seq_1_to_{ROWS}", db=db)
    return db


def logs_of(server: MariaDBServer, db: str) -> dict[RowKey, str]:
    return {(h, s): line for h, s, line in server.execute("SELECT host, seq, line FROM logs",
                                                          db=db)}


def row_of(image: Row) -> tuple[RowKey, str]:
    values = {c.name: python_of(c.value) for c in image.columns}
    return (values["host"], values["seq"]), values["line"]


def write_until(server: MariaDBServer, db: str, stopped: threading.Event) -> int:
    """Single-row transactions until `stopped`, in turn: a line changed, a row deleted, a
    row inserted, a row given a new key; returns how many."""
    rng = random.Random(7)
    conn = server.connect(db)
    n = 0
    with conn.cursor() as cur:
        while not stopped.is_set():
            seq = rng.randint(1, ROWS)
            statement, params = [
                ("UPDATE logs SET line = %s WHERE seq = %s", (f"changed {n}", seq)),
                ("DELETE FROM logs WHERE seq = %s", (seq,)),
                ("INSERT INTO logs VALUES ('h9', %s, 'new')", (ROWS + n,)),
                ("UPDATE logs SET seq = seq + %s WHERE seq = %s", (10 * ROWS, seq)),
            ][n % 4]
            cur.execute(statement, params)
            n += 1
            stopped.wait(0.005)
    conn.close()
    return n


def test_a_keyless_table_is_read_and_streamed_by_its_key_columns(
        mariadb_server: MariaDBServer, mysql_rig: Any) -> None:
    db = make_logs(mariadb_server)
    table = f"{db}.logs"
    rig = mysql_rig(mariadb_server, [table], partitions=PARTITIONS,
                    snapshot={"mode": "initial", "chunk_size": 100, "key_columns": {table: KEY}})
    capture = rig.start()
    capture.wait_streaming()
    stopped = threading.Event()
    with ThreadPoolExecutor(1) as pool:  # while the snapshot runs
        writes = pool.submit(write_until, mariadb_server, db, stopped)
        try:
            entry = rig.snapshot_entry(table, lambda e: e.state in (pb.SNAPSHOT_DONE,
                                                                    pb.SNAPSHOT_FAILED))
        finally:
            stopped.set()
        transactions = writes.result(30)
    assert entry.state == pb.SNAPSHOT_DONE, entry.reason
    mariadb_server.execute("INSERT INTO logs VALUES ('end', 0, 'the end')", db=db)
    view = rig.read(lambda v: any(e.after.columns and row_of(e.after)[0] == ("end", 0)
                                  for _, _, e in v.events))
    capture.stop()

    assert {tuple(e.key_columns) for _, _, e in view.events} == {tuple(KEY)}, "one key everywhere"
    wrong = [(p, e.op) for p, _, e in view.events if p != partition_for(bus_key(e), PARTITIONS)]
    assert not wrong, f"{len(wrong)} events outside their key's partition, e.g. {wrong[:3]}"
    assert len({p for p, _, _ in view.events}) == PARTITIONS, "keys spread over the partitions"
    kept = sorted(deduplicated(view), key=lambda e: (e.position.tx_seq, e.position.event_index))
    rows: dict[RowKey, str] = {}
    reads: Counter[RowKey] = Counter()
    for event in kept:
        if event.op in (Op.OP_UPDATE, Op.OP_DELETE):
            rows.pop(row_of(event.before)[0], None)  # an update may give the row a new key
        if event.op != Op.OP_DELETE:
            key, line = row_of(event.after)
            rows[key] = line
            if event.op == Op.OP_SNAPSHOT_READ:
                reads[key] += 1
    assert rows == logs_of(mariadb_server, db)
    assert max(reads.values()) == 1, "a row read twice"
    read_at = [e.position.tx_seq for e in kept if e.op == Op.OP_SNAPSHOT_READ]
    during = sum(min(read_at) < e.position.tx_seq < max(read_at) for e in kept
                 if e.op != Op.OP_SNAPSHOT_READ)
    assert during, "no change streamed while the table was read"
    assert entry.chunks_done >= ROWS // 100 - 1
    print(f"\n{len(read_at)} rows read by (host, seq) in {entry.chunks_done} chunks; "
          f"{len(kept) - len(read_at)} changes streamed with the same key ({during} while the "
          f"table was read, of {transactions} writer transactions), over {PARTITIONS} "
          f"partitions; {len(rows)} rows at the end, equal to the source")


def test_a_keyless_table_without_key_columns_fails_naming_the_setting(
        mariadb_server: MariaDBServer, mysql_rig: Any) -> None:
    db = make_logs(mariadb_server)
    rig = mysql_rig(mariadb_server, [f"{db}.logs"], snapshot={"mode": "initial"})
    capture = rig.start()
    capture.wait_streaming()
    entry = rig.snapshot_entry(f"{db}.logs", lambda e: e.state == pb.SNAPSHOT_FAILED, 60)
    assert f"{db}.logs has no primary key" in entry.reason, entry.reason
    assert "spec.source.snapshot.key_columns" in entry.reason, entry.reason
    capture.stop()


@pytest.mark.parametrize("columns, table, key, said", [
    (LOGS, "gone", ["id"], "{db}.gone is not a selected table (it does not exist, or "
     "spec.source.tables does not select it)"),
    (LOGS.replace("seq int NOT NULL", "seq int NOT NULL PRIMARY KEY"), "logs", KEY,
     "{db}.logs has a primary key of its own (seq), which its events are keyed by: remove it "
     "from key_columns"),
    (LOGS, "logs", ["host", "sequence"],
     "{db}.logs has no column sequence (its columns: host, seq, line)"),
    (LOGS.replace("host varchar(10) NOT NULL", "host varchar(10)"), "logs", KEY,
     "{db}.logs: host may be NULL; key columns must be NOT NULL (ALTER TABLE {db}.logs MODIFY "
     "host varchar(10) NOT NULL"),
    (LOGS.replace("line varchar(40)", "line text NOT NULL"), "logs", ["host", "line"],
     "{db}.logs: line (text) cannot be read in key order"),
], ids=["not-selected", "own-primary-key", "missing-column", "nullable", "text-column"])
def test_a_bad_key_columns_setting_is_refused_at_start_naming_the_fix(
        mariadb_server: MariaDBServer, mysql_rig: Any, columns: str, table: str, key: list[str],
        said: str) -> None:
    db = make_logs(mariadb_server, columns)
    rig = mysql_rig(mariadb_server, [f"{db}.logs", f"{db}.gone"],
                    snapshot={"mode": "initial", "key_columns": {f"{db}.{table}": key}})
    capture = rig.start()
    assert capture.wait_exit(60) == 2, capture.tail()
    assert f"spec.source.snapshot.key_columns: {said.format(db=db)}" in capture.log(), \
        capture.tail()


def test_key_columns_need_full_row_images_which_every_source_is_checked_for(
        mariadb_server: MariaDBServer, mysql_rig: Any) -> None:
    """Updates and deletes carry the key columns only with binlog_row_image=FULL (the
    equivalent of PostgreSQL's REPLICA IDENTITY FULL): capture refuses a server without it."""
    db = make_logs(mariadb_server)
    rig = mysql_rig(mariadb_server, [f"{db}.logs"],
                    snapshot={"mode": "initial", "key_columns": {f"{db}.logs": KEY}})
    mariadb_server.execute("SET GLOBAL binlog_row_image = 'MINIMAL'")
    try:
        capture = rig.start()
        assert capture.wait_exit(60) == 2, capture.tail()
    finally:
        mariadb_server.execute("SET GLOBAL binlog_row_image = 'FULL'")
    assert "binlog_row_image is 'MINIMAL'; set binlog_row_image=FULL" in capture.log(), \
        capture.tail()


@pytest.mark.parametrize("twin", ["h1", "H1"], ids=["same-bytes", "same-to-the-collation"])
def test_key_columns_that_are_not_unique_fail_the_table_naming_the_key(
        mariadb_server: MariaDBServer, mysql_rig: Any, twin: str) -> None:
    """A second row keyed (h1, 1), or (H1, 1), which the default collation compares equal: the
    next chunk would start after the key and never read it."""
    db = make_logs(mariadb_server)
    mariadb_server.execute("INSERT INTO logs VALUES (%s, 1, 'again')", (twin,), db=db)
    rig = mysql_rig(mariadb_server, [f"{db}.logs"],
                    snapshot={"mode": "initial", "key_columns": {f"{db}.logs": KEY}})
    capture = rig.start()
    capture.wait_streaming()
    entry = rig.snapshot_entry(f"{db}.logs", lambda e: e.state == pb.SNAPSHOT_FAILED, 60)
    assert f"spec.source.snapshot.key_columns: {db}.logs has two rows with host, seq = " \
        in entry.reason, entry.reason
    assert ", 1 (equal as the server compares them); give columns that are unique" in \
        entry.reason, entry.reason
    capture.stop()
