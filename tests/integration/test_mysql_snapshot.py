"""Snapshots from MariaDB on real servers: existing rows read in chunks between watermarks
written to the signal table, while a writer changes the same keys, merged into the binlog
stream on the bus.

What the bus holds, read the way delivery reads it (each position once, forward only), is
replayed key by key, as in test_pg_snapshot.py:
- no gap: the replay ends with exactly the source's rows;
- no duplicate: at most one read per key;
- no stale read: a key's read carries exactly the row its earlier events (on top of the
  row seeded before the snapshot) left — a change before the read is never undone by it.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pymysql
import pytest

from tailrace.devservers import MariaDBServer
from tailrace.events import ChangeEvent, Op, python_of
from tailrace.proto import control_pb2 as pb
from tailrace_services.capture_mysql.signal_table import SignalTable
from tests.fix_capture import BusView, CaptureRig, assert_transactions_whole, deduplicated

pytestmark = pytest.mark.integration

TABLES = ("accounts", "orders", "notes")
ROWS = {"accounts": 80_000, "orders": 70_000, "notes": 50_000}  # 200,000 rows
SIGNAL = "tailrace.snapshot_signal"


@pytest.fixture
def db(mariadb_server: MariaDBServer) -> str:
    name = f"s_{uuid.uuid4().hex[:10]}"
    mariadb_server.create_database(name)
    return name


@pytest.fixture
def fresh_server(make_mariadb_server: Callable[..., MariaDBServer]) -> MariaDBServer:
    """A server of the test's own: under `snapshot.mode: never` capture streams from the
    oldest binlog, which on the shared server holds every earlier test's rows."""
    return make_mariadb_server()


@pytest.fixture
def fresh_db(fresh_server: MariaDBServer) -> str:
    name = f"s_{uuid.uuid4().hex[:10]}"
    fresh_server.create_database(name)
    return name


def seed(server: MariaDBServer, db: str) -> None:
    conn = server.connect(db)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, "
                    "note varchar(40))")
        cur.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount decimal(12,2) NOT NULL, "
                    "status varchar(10) NOT NULL)")
        cur.execute("CREATE TABLE notes (region varchar(8), id int, body text, "
                    "PRIMARY KEY (region, id))")
        cur.execute(f"INSERT INTO accounts SELECT seq, seq * 10, CONCAT('n', seq) "
                    f"FROM seq_1_to_{ROWS['accounts']}")
        cur.execute(f"INSERT INTO orders SELECT seq, seq / 100, 'new' "
                    f"FROM seq_1_to_{ROWS['orders']}")
        cur.execute(f"INSERT INTO notes SELECT CONCAT('r', seq % 7), seq, CONCAT('b', seq) "
                    f"FROM seq_1_to_{ROWS['notes']}")
    conn.close()


Key = tuple[str, tuple[str, ...]]


def state_of(server: MariaDBServer, db: str) -> dict[Key, tuple[str | None, ...]]:
    """Every row of the three tables as text: (table, key) -> row."""
    out: dict[Key, tuple[str | None, ...]] = {}
    for r in server.execute("SELECT CAST(id AS CHAR), CAST(balance AS CHAR), note FROM accounts",
                            db=db):
        out[("accounts", (r[0],))] = (r[0], r[1], r[2])
    for r in server.execute("SELECT CAST(id AS CHAR), CAST(amount AS CHAR), status FROM orders",
                            db=db):
        out[("orders", (r[0],))] = (r[0], r[1], r[2])
    for r in server.execute("SELECT region, CAST(id AS CHAR), body FROM notes", db=db):
        out[("notes", (r[0], r[1]))] = (r[0], r[1], r[2])
    return out


COLUMNS = {"accounts": ("id", "balance", "note"), "orders": ("id", "amount", "status"),
           "notes": ("region", "id", "body")}
KEYS = {"accounts": ("id",), "orders": ("id",), "notes": ("region", "id")}


def _text(image: Any, name: str) -> str | None:
    for c in image.columns:
        if c.name == name:
            value = python_of(c.value)
            return None if value is None else str(value)
    return None


def row_of(event: ChangeEvent, image: Any) -> tuple[Key, tuple[str | None, ...]]:
    table = event.table
    key = tuple(str(_text(image, k)) for k in KEYS[table])
    return (table, key), tuple(_text(image, c) for c in COLUMNS[table])


class Writer(threading.Thread):
    """Inserts, updates and deletes keys across every table's range until stopped, a few
    hundred transactions a second: unpaced, MariaDB commits single-row transactions faster
    than capture decodes the binlog (~20k rows/s of pure Python, DESIGN), and each chunk
    waits for the stream to reach its high watermark."""

    PAUSE_S = 0.003

    def __init__(self, server: MariaDBServer, db: str) -> None:
        super().__init__(daemon=True)
        self.server, self.db = server, db
        self.stopped = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(14)
        try:
            conn = self.server.connect(self.db)
            with conn.cursor() as cur:
                while not self.stopped.is_set():
                    cur.execute("BEGIN")
                    for _ in range(rng.randint(1, 5)):
                        self._change(cur, rng)
                    cur.execute("COMMIT")
                    self.transactions += 1
                    self.stopped.wait(self.PAUSE_S)
            conn.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    @staticmethod
    def _change(cur: pymysql.cursors.Cursor, rng: random.Random) -> None:
        table = rng.choice(TABLES)
        n = rng.randint(1, ROWS[table] + 1_000)
        insert = rng.random() < 0.6
        if table == "accounts":
            if insert:
                cur.execute("INSERT INTO accounts VALUES (%s, %s, 'w') ON DUPLICATE KEY UPDATE "
                            "balance = balance + 1, note = 'u'", (n, n))
            else:
                cur.execute("DELETE FROM accounts WHERE id = %s", (n,))
        elif table == "orders":
            if insert:
                cur.execute("INSERT INTO orders VALUES (%s, 1.5, 'w') ON DUPLICATE KEY UPDATE "
                            "status = 'paid', amount = amount + 1", (n,))
            else:
                cur.execute("DELETE FROM orders WHERE id = %s", (n,))
        else:
            region = f"r{n % 7}"
            if insert:
                cur.execute("INSERT INTO notes VALUES (%s, %s, 'w') ON DUPLICATE KEY UPDATE "
                            "body = CONCAT(body, '+')", (region, n))
            else:
                cur.execute("DELETE FROM notes WHERE region = %s AND id = %s", (region, n))


def tables_of(db: str) -> list[str]:
    return [f"{db}.{t}" for t in TABLES]


def wait_snapshot_done(rig: CaptureRig, timeout: float = 240, tables: int = len(TABLES)
                       ) -> pb.SnapshotState:
    deadline = time.monotonic() + timeout
    while True:
        state = rig.control.client.snapshot_state(rig.name)
        if len([t for t in state.tables if t.state == pb.SNAPSHOT_DONE]) == tables:
            return state
        failed = [t for t in state.tables if t.state == pb.SNAPSHOT_FAILED]
        assert not failed, failed
        assert time.monotonic() < deadline, f"snapshot not done after {timeout:.0f} s: {state}"
        time.sleep(0.2)


def the_end(server: MariaDBServer, db: str) -> Callable[[BusView], bool]:
    """Write a last change; the returned condition holds once the bus has it (all seen)."""
    server.execute("INSERT INTO accounts VALUES (1, 0, 'end') ON DUPLICATE KEY UPDATE "
                   "note = 'end'", db=db)
    return lambda v: any(e.after.columns and _text(e.after, "note") == "end"
                         for _, _, e in v.events if e.table == "accounts")


def check_bus(view: BusView, seeded: dict[Key, tuple[str | None, ...]],
              final: dict[Key, tuple[str | None, ...]]) -> Counter[str]:
    """The replays of the module docstring; returns counts of what the bus held."""
    events = sorted(deduplicated(view), key=lambda e: (e.position.tx_seq,
                                                       e.position.event_index))
    assert not [e for e in events if e.table == SIGNAL.split(".")[1]], "signal rows published"
    replay: dict[Key, tuple[str | None, ...]] = {}
    known = dict(seeded)
    reads: Counter[Key] = Counter()
    counts: Counter[str] = Counter()
    for event in events:
        if event.op == Op.OP_SNAPSHOT_READ:
            key, row = row_of(event, event.after)
            reads[key] += 1
            if known.get(key) != row:
                history = [(o, e.op, e.position.tx_seq, e.tx_id, e.snapshot.chunk,
                            row_of(e, e.after)[1] if e.after.columns else None)
                           for _, o, e in view.events
                           if row_of(e, e.after if e.after.columns else e.before)[0] == key]
                raise AssertionError(
                    f"stale read of {key}: {row}, the log says {known.get(key)}; read at "
                    f"{event.position.tx_seq}, tx {event.tx_id}; every event of the key "
                    "(offset, op, tx_seq, tx, chunk, row):\n" + "\n".join(map(str, history)))
            replay[key] = row
            counts["read"] += 1
        elif event.op in (Op.OP_INSERT, Op.OP_UPDATE):
            if event.op == Op.OP_UPDATE:
                old, _ = row_of(event, event.before)
                new, _ = row_of(event, event.after)
                if old != new:
                    replay.pop(old, None)
                    known.pop(old, None)
            key, row = row_of(event, event.after)
            replay[key] = known[key] = row
            counts["change"] += 1
        elif event.op == Op.OP_DELETE:
            key, _ = row_of(event, event.before)
            replay.pop(key, None)
            known.pop(key, None)
            counts["change"] += 1
    twice = [k for k, n in reads.items() if n > 1]
    assert not twice, f"{len(twice)} keys read twice, e.g. {twice[:3]}"
    missing = set(final) - set(replay)
    extra = set(replay) - set(final)
    assert not missing and not extra, (f"{len(missing)} rows missing on the bus, e.g. "
                                       f"{sorted(missing)[:3]}; {len(extra)} extra, e.g. "
                                       f"{sorted(extra)[:3]}")
    wrong = [k for k in final if replay[k] != final[k]]
    assert not wrong, f"{len(wrong)} rows differ, e.g. {wrong[0]}: {replay[wrong[0]]} vs " \
                      f"{final[wrong[0]]}"
    counts["keys"] = len(final)
    return counts


def test_initial_snapshot_with_a_concurrent_writer_has_no_gap_and_no_duplicate(
        mariadb_server: MariaDBServer, db: str, mysql_rig: Any) -> None:
    seed(mariadb_server, db)
    seeded = state_of(mariadb_server, db)
    rig = mysql_rig(mariadb_server, tables_of(db),
                    snapshot={"mode": "initial", "chunk_size": 2_000})
    capture = rig.start()
    capture.wait_streaming()
    writer = Writer(mariadb_server, db)
    writer.start()
    started = time.monotonic()
    state = wait_snapshot_done(rig)
    took = time.monotonic() - started
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None, writer.error
    view = rig.read(the_end(mariadb_server, db), timeout=120)
    final = state_of(mariadb_server, db)
    counts = check_bus(view, seeded, final)
    assert_transactions_whole(view, 1)
    capture.stop()
    rows = sum(t.rows_done for t in state.tables)
    signal_rows = mariadb_server.execute(f"SELECT COUNT(*) FROM {SIGNAL}")[0][0]
    print(f"\nsnapshot of {sum(ROWS.values())} rows in {took:.1f} s with {writer.transactions} "
          f"writer transactions meanwhile: {counts['read']} read events, {counts['change']} "
          f"changes on the bus, {counts['keys']} rows at the end, equal to the source; "
          f"rows_done {rows}; rows left in the signal table: {signal_rows}")
    assert counts["read"] == rows
    assert signal_rows < 200, "old watermarks are deleted"



@pytest.mark.chaos
def test_initial_snapshot_killed_three_times_completes_without_a_duplicate(
        mariadb_server: MariaDBServer, db: str, mysql_rig: Any) -> None:
    """kill -9 of capture after 10, 25 and 40 of the ~60 chunks are stored (progress, not
    time); each restart finds what of its in-flight chunk reached the bus."""
    seed(mariadb_server, db)
    seeded = state_of(mariadb_server, db)
    rig = mysql_rig(mariadb_server, tables_of(db),
                    snapshot={"mode": "initial", "chunk_size": 2_000})
    capture = rig.start()
    capture.wait_streaming()
    writer = Writer(mariadb_server, db)
    writer.start()
    for target in (10, 25, 40):
        capture = rig.kill_when_chunks_done(capture, target, timeout=240)
    state = wait_snapshot_done(rig)
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None, writer.error
    view = rig.read(the_end(mariadb_server, db), timeout=120)
    final = state_of(mariadb_server, db)
    counts = check_bus(view, seeded, final)
    assert_transactions_whole(view, 1, copies=True, cut_short=3)
    capture.stop()
    found = (rig.dir / f"capture-{rig.name}.log").read_text(errors="replace").count(
        "snapshot chunk found after a restart")
    print(f"\n3 kills during the snapshot of {sum(ROWS.values())} rows, {writer.transactions} "
          f"writer transactions: {counts['read']} reads (each key at most once), "
          f"{counts['change']} changes, {counts['keys']} rows equal to the source; in-flight "
          f"chunks found after a restart: {found}; rows_done "
          f"{sum(t.rows_done for t in state.tables)}")
    assert counts["read"] == sum(t.rows_done for t in state.tables)


@pytest.mark.chaos
def test_one_table_read_in_ranges_on_four_connections_and_killed_once_has_no_gap_and_no_duplicate(
        mariadb_server: MariaDBServer, db: str, mysql_rig: Any) -> None:
    """`snapshot.parallelism: 4` and one table with a two-column key (`notes`: region, id):
    the idle readers join its read and read key ranges of it at once, each between its own
    signal-table watermarks, while a writer changes the same keys; capture is killed -9 once
    10 chunks are stored (progress, not time). The bus replays to the source, no key read
    twice, no stale read."""
    seed(mariadb_server, db)
    seeded = {k: v for k, v in state_of(mariadb_server, db).items() if k[0] == "notes"}
    rig = mysql_rig(mariadb_server, [f"{db}.notes"],
                    snapshot={"mode": "initial", "chunk_size": 1_000, "parallelism": 4})
    capture = rig.start()
    capture.wait_streaming()
    writer = Writer(mariadb_server, db)
    writer.start()
    capture = rig.kill_when_chunks_done(capture, 10, timeout=240)
    state = wait_snapshot_done(rig, tables=1)
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None, writer.error
    server, end_key = mariadb_server, ("notes", ("r1", "1"))
    server.execute("INSERT INTO notes VALUES ('r1', 1, 'end') ON DUPLICATE KEY UPDATE "
                   "body = 'end'", db=db)
    view = rig.read(lambda v: any(e.after.columns and row_of(e, e.after)[0] == end_key
                                  and _text(e.after, "body") == "end" for _, _, e in v.events),
                    timeout=120)
    final = {k: v for k, v in state_of(mariadb_server, db).items() if k[0] == "notes"}
    counts = check_bus(view, seeded, final)
    capture.stop()
    log = (rig.dir / f"capture-{rig.name}.log").read_text(errors="replace")
    joined = log.count("snapshot reader joins a table's read")
    print(f"\n{ROWS['notes']} rows of one table on 4 connections, one kill -9, "
          f"{writer.transactions} writer transactions: {counts['read']} reads (each key at most "
          f"once), {counts['change']} changes, {counts['keys']} rows equal to the source; "
          f"readers joined the table's read {joined} times")
    assert joined >= 2, "the table was read by one reader only"
    assert counts["read"] == state.tables[0].rows_done


def _entry(rig: CaptureRig, table: str) -> pb.SnapshotTable:
    state = rig.control.client.snapshot_state(rig.name)
    return next(t for t in state.tables if t.table == table)


def test_on_demand_snapshot_with_where_status_and_cancel_while_streaming(
        fresh_server: MariaDBServer, fresh_db: str, mysql_rig: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`tailrace snapshot` on a running pipeline (mode never): a filtered table read while the
    writer goes on, `status` showing it done, and a large one cancelled part-way."""
    mariadb_server, db = fresh_server, fresh_db  # a server of its own (fresh_server)
    from tailrace_services.cli.main import main

    seed(mariadb_server, db)
    rig = mysql_rig(mariadb_server, tables_of(db),
                    snapshot={"mode": "never", "chunk_size": 1_000})
    capture = rig.start()
    capture.wait_streaming()
    control = ["--control", rig.control.address]
    deadline = time.monotonic() + 60
    while not rig.control.client.snapshot_state(rig.name).selected:  # capture reported
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert rig.control.client.snapshot_state(rig.name).tables == [], "mode never: no snapshot"
    writer = Writer(mariadb_server, db)
    writer.start()

    notes, accounts = f"{db}.notes", f"{db}.accounts"
    assert main([*control, "snapshot", rig.name, "--table", notes,
                 "--where", "region = 'r3' AND id <= 20000 AND body LIKE 'b%'"]) == 0
    deadline = time.monotonic() + 120
    while (entry := _entry(rig, notes)).state != pb.SNAPSHOT_DONE:
        assert entry.state in (pb.SNAPSHOT_PENDING, pb.SNAPSHOT_RUNNING), entry
        assert time.monotonic() < deadline, entry
        time.sleep(0.1)
    capsys.readouterr()
    assert main([*control, "snapshot", "status", rig.name]) == 0
    status = capsys.readouterr().out
    assert notes in status and "done" in status.lower(), status

    assert main([*control, "snapshot", rig.name, "--table", accounts]) == 0
    deadline = time.monotonic() + 120
    while _entry(rig, accounts).chunks_done < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert main([*control, "snapshot", "cancel", rig.name, "--table", accounts]) == 0
    capture.wait_log('"state": "SNAPSHOT_CANCELLED"', 60)
    cancelled = _entry(rig, accounts)
    assert cancelled.state == pb.SNAPSHOT_CANCELLED
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None, writer.error

    view = rig.read(the_end(mariadb_server, db), timeout=120)
    events = sorted(deduplicated(view), key=lambda e: (e.position.tx_seq,
                                                       e.position.event_index))
    known: dict[Key, tuple[str | None, ...]] = {}
    reads: Counter[Key] = Counter()
    for event in events:  # mode never streams from the oldest binlog: the seed is on the bus
        if event.op == Op.OP_SNAPSHOT_READ:
            key, row = row_of(event, event.after)
            reads[key] += 1
            assert known.get(key) == row, f"stale read of {key}"
        elif event.op == Op.OP_DELETE:
            known.pop(row_of(event, event.before)[0], None)
        elif event.op in (Op.OP_INSERT, Op.OP_UPDATE):
            key, row = row_of(event, event.after)
            known[key] = row
    assert max(reads.values()) == 1, "a key read twice"
    note_reads = [k for k in reads if k[0] == "notes"]
    assert note_reads and all(k[1][0] == "r3" and int(k[1][1]) <= 20_000 for k in note_reads)
    account_reads = [k for k in reads if k[0] == "accounts"]
    assert len(account_reads) == cancelled.rows_done < ROWS["accounts"] // 2
    assert not [k for k in reads if k[0] == "orders"], "orders was not asked for"
    capture.stop()
    print(f"\non demand: {len(note_reads)} rows of notes where region = 'r3' AND id <= 20000; "
          f"accounts cancelled after {cancelled.chunks_done} chunks ({len(account_reads)} "
          f"rows); {writer.transactions} writer transactions meanwhile")


def test_initial_only_reads_every_table_then_exits_0(
        mariadb_server: MariaDBServer, db: str, mysql_rig: Any) -> None:
    seed(mariadb_server, db)
    mariadb_server.execute("CREATE TABLE keyless (v int)", db=db)
    seeded = state_of(mariadb_server, db)
    rig = mysql_rig(mariadb_server, [*tables_of(db), f"{db}.keyless"],
                    snapshot={"mode": "initial_only", "chunk_size": 10_000})
    capture = rig.start()
    assert capture.wait_exit(180) == 0, capture.tail()
    assert "initial snapshot complete; stopping" in capture.log()
    view = rig.read(lambda v: sum(e.op == Op.OP_SNAPSHOT_READ for _, _, e in v.events)
                    >= len(seeded), timeout=60)
    counts = check_bus(view, seeded, state_of(mariadb_server, db))
    assert counts["read"] == len(seeded) and counts["change"] == 0, counts
    lasts = [e for _, _, e in view.events if e.snapshot.last]
    assert sorted(e.table for e in lasts) == sorted(TABLES), "one `last` read per table"
    keyless = _entry(rig, f"{db}.keyless")
    assert keyless.state == pb.SNAPSHOT_FAILED and f"{db}.keyless has no primary key" in \
        keyless.reason, keyless


TYPES = """(id bigint unsigned, k2 varchar(10), u uuid, ip inet6, ip4 inet4, j json,
    e enum('a','b'), s set('x','y','z'), s0 set('x','y'), b bit(10), b1 bit(1), bn binary(4),
    vb varbinary(10), d decimal(30,10), d2 decimal(12,2), dtm datetime(6), dz datetime,
    dd date, ddz date, ts timestamp(6) NULL, tz timestamp NULL, y year, y0 year, f float,
    db double, t text, ch char(5), lat varchar(10) CHARACTER SET latin1, tm time(3), tmn time,
    ti tinyint, si smallint unsigned, mi mediumint, bl blob, nul int, PRIMARY KEY (id, k2))"""


def test_a_snapshot_read_equals_the_streamed_insert_of_the_same_row_column_by_column(
        fresh_server: MariaDBServer, fresh_db: str, mysql_rig: Any) -> None:
    """Every column type, extremes, zero dates and NULLs: the read event of a row (SELECT,
    `capture_mysql/snapshot.py`) and its insert event (binlog, `values.py`) carry the same
    serialized values, types, key columns and schema version — so the merger's key
    comparison works and sinks see one representation."""
    mariadb_server, db = fresh_server, fresh_db  # a server of its own (fresh_server)
    conn = mariadb_server.connect(db)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE v {TYPES}")
        cur.execute("SET time_zone = '+02:00', sql_mode = ''")  # zero dates allowed
        cur.execute("""INSERT INTO v VALUES (18446744073709551615, 'k', UUID(),
            '::ffff:1.2.3.4', '10.0.0.1', '{"a": [1, 2.5], "b": {"c": null}}', 'b', 'z,x', '',
            b'1010101011', b'1', x'00ff', x'0001', '12345678901234567890.0123456789', '-1.50',
            '2024-01-02 03:04:05.123456', '0000-00-00 00:00:00', '2024-02-29', '0000-00-00',
            '2024-01-02 03:04:05.654321', '0000-00-00 00:00:00', 2024, 0, pi(),
            0.1e0 + 0.2e0, 'héllo', 'ab  ', 'é', '-838:59:58.5', '12:00:00', -5, 65535,
            -8388608, x'00ff00', NULL)""")
        cur.execute("INSERT INTO v (id, k2, e, b, f) VALUES (1, 'z', '', b'0', 1.1)")
    conn.close()
    rig = mysql_rig(mariadb_server, [f"{db}.v"], snapshot={"mode": "never"})
    capture = rig.start()
    capture.wait_streaming()
    deadline = time.monotonic() + 60
    while not rig.control.client.snapshot_state(rig.name).selected:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    rig.control.client.request_snapshot(rig.name, [f"{db}.v"])
    view = rig.read(lambda v: sum(e.op == Op.OP_SNAPSHOT_READ for _, _, e in v.events) >= 2,
                    timeout=60)
    capture.stop()
    inserts = {e.after.columns[0].value.SerializeToString(): e for _, _, e in view.events
               if e.op == Op.OP_INSERT}
    reads = [e for _, _, e in view.events if e.op == Op.OP_SNAPSHOT_READ]
    assert len(inserts) == len(reads) == 2
    compared = 0
    for read in reads:
        streamed = inserts[read.after.columns[0].value.SerializeToString()]
        assert [c.name for c in read.after.columns] == [c.name for c in streamed.after.columns]
        for ours, theirs in zip(read.after.columns, streamed.after.columns, strict=True):
            assert (ours.type, ours.value.SerializeToString()) == \
                (theirs.type, theirs.value.SerializeToString()), \
                f"{ours.name}: read {python_of(ours.value)!r} ({ours.type}), streamed " \
                f"{python_of(theirs.value)!r} ({theirs.type})"
            compared += 1
        assert list(read.key_columns) == list(streamed.key_columns) == ["id", "k2"]
        assert (read.schema_version, read.schema_sequence) == \
            (streamed.schema_version, streamed.schema_sequence)
        assert (read.database, read.table) == (streamed.database, streamed.table)
    print(f"\n{compared} values compared, read == streamed")


def test_a_user_who_may_not_create_the_signal_table_is_told_what_to_run(
        fresh_server: MariaDBServer, fresh_db: str, mysql_rig: Any) -> None:
    """The capture user has only what streaming needs: the snapshot fails at once with the
    statements to run; an administrator runs them and the next request reads the table."""
    mariadb_server, db = fresh_server, fresh_db  # a server of its own (fresh_server)
    mariadb_server.execute("CREATE TABLE t (id int PRIMARY KEY)", db=db)
    mariadb_server.execute("INSERT INTO t SELECT seq FROM seq_1_to_100", db=db)
    user = f"cap_{uuid.uuid4().hex[:8]}"
    mariadb_server.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'pw'")
    mariadb_server.execute(f"GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO "
                           f"'{user}'@'127.0.0.1'")
    signal = f"sig_{db}.signal"
    dsn = f"mysql://{user}:pw@{mariadb_server.host}:{mariadb_server.port}"
    rig = mysql_rig(mariadb_server, [f"{db}.t"], dsn=dsn,
                    snapshot={"mode": "never", "signal_table": signal})
    capture = rig.start()
    capture.wait_streaming()
    deadline = time.monotonic() + 60
    while not rig.control.client.snapshot_state(rig.name).selected:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    rig.control.client.request_snapshot(rig.name, [f"{db}.t"])
    deadline = time.monotonic() + 60
    while (entry := _entry(rig, f"{db}.t")).state != pb.SNAPSHOT_FAILED:
        assert time.monotonic() < deadline, entry
        time.sleep(0.1)
    refused = entry.reason
    assert "spec.source.snapshot.signal_table" in refused, refused
    fix = refused.split("run as an administrator: ")[1].split("; or name another")[0]
    assert f"TO '{user}'@'127.0.0.1'" in fix and "CREATE TABLE IF NOT EXISTS" in fix, fix
    assert ":pw@" not in refused
    for statement in fix.split("; "):
        mariadb_server.execute(statement)
    rig.control.client.request_snapshot(rig.name, [f"{db}.t"])
    deadline = time.monotonic() + 60
    while (entry := _entry(rig, f"{db}.t")).state != pb.SNAPSHOT_DONE:
        assert entry.state in (pb.SNAPSHOT_PENDING, pb.SNAPSHOT_RUNNING), entry
        assert time.monotonic() < deadline, entry
        time.sleep(0.1)
    assert entry.rows_done == 100
    capture.stop()
    print(f"\nrefused with: {refused}")


def test_initial_snapshots_a_table_renamed_into_the_patterns_while_streaming(
        mariadb_server: MariaDBServer, db: str, mysql_rig: Any) -> None:
    """`initial` with `db.live_%`: a table renamed into the patterns while capture streams —
    its rows were never in the stream under that name — is read, once each, and its later
    change comes after the reads."""
    mariadb_server.execute("CREATE TABLE live_first (id int PRIMARY KEY)", db=db)
    mariadb_server.execute("INSERT INTO live_first SELECT seq FROM seq_1_to_10", db=db)
    rig = mysql_rig(mariadb_server, [f"{db}.live_%"],
                    snapshot={"mode": "initial", "chunk_size": 1_000})
    capture = rig.start()
    capture.wait_streaming()
    deadline = time.monotonic() + 60
    while not any(t.table == f"{db}.live_first" and t.state == pb.SNAPSHOT_DONE
                  for t in rig.control.client.snapshot_state(rig.name).tables):
        assert time.monotonic() < deadline, capture.tail()
        time.sleep(0.1)
    mariadb_server.execute("CREATE TABLE staging (id int PRIMARY KEY, v varchar(10) NOT NULL)",
                           db=db)
    mariadb_server.execute("INSERT INTO staging SELECT seq, CONCAT('v', seq) "
                           "FROM seq_1_to_5000", db=db)
    mariadb_server.execute("RENAME TABLE staging TO live_late", db=db)
    deadline = time.monotonic() + 120
    while not any(t.table == f"{db}.live_late" and t.state == pb.SNAPSHOT_DONE
                  for t in rig.control.client.snapshot_state(rig.name).tables):
        assert time.monotonic() < deadline, capture.tail()
        time.sleep(0.1)
    mariadb_server.execute("UPDATE live_late SET v = 'after' WHERE id = 1", db=db)
    view = rig.read(lambda v: any(e.table == "live_late" and e.op == Op.OP_UPDATE
                                  for _, _, e in v.events), timeout=60)
    capture.stop()
    late = [e for e in sorted(deduplicated(view), key=lambda e: (e.position.tx_seq,
                                                                 e.position.event_index))
            if e.table == "live_late" and e.op != Op.OP_DDL]
    reads = Counter(_text(e.after, "id") for e in late if e.op == Op.OP_SNAPSHOT_READ)
    assert len(reads) == 5000 and max(reads.values()) == 1, len(reads)
    assert late[-1].op == Op.OP_UPDATE and _text(late[-1].after, "v") == "after"
    assert not [e for e in late if e.op == Op.OP_INSERT], "staging was never captured"
    print(f"\na table renamed into the patterns while streaming: {len(reads)} rows read once "
          "each, then its update")


class _SignalGate:
    """The snapshot signal table held by `LOCK TABLES ... WRITE` on a connection of the
    test's: the snapshot reader waits at its next watermark (an INSERT into the table), so a
    test steps it chunk by chunk, by what it wrote, never by time. Leaving the block
    unlocks the table."""

    def __init__(self, server: MariaDBServer) -> None:
        self.server, self.table = server, SignalTable.parse(None)
        self.conn = server.connect()

    def __enter__(self) -> _SignalGate:
        with self.conn.cursor() as cur:
            for statement in self.table.ddl():  # (capture creates it at its first snapshot)
                cur.execute(statement)
            cur.execute(f"LOCK TABLES {self.table.quoted} WRITE")
        return self

    def __exit__(self, *_: object) -> None:
        with self.conn.cursor() as cur:
            cur.execute("UNLOCK TABLES")
        self.conn.close()

    def watermarks(self) -> int:
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {self.table.quoted}")  # noqa: S608
            return int(cur.fetchone()[0])

    def wait_for_the_reader(self, timeout_s: float = 60.0) -> None:
        """Until a statement of another connection waits for the table."""
        deadline = time.monotonic() + timeout_s
        while not self.server.execute(
                "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID <> %s AND "
                "STATE = 'Waiting for table metadata lock' AND INFO LIKE %s",
                [self.conn.thread_id(), f"%{self.table.table}%"]):
            assert time.monotonic() < deadline, "the snapshot reader never wrote a watermark"
            time.sleep(0.01)

    def let_one_through(self) -> None:
        """The waiting statement runs (a lock released is granted to the waiting request
        before the test's next LOCK TABLES asks again, which then waits for it to end)."""
        self.wait_for_the_reader()
        with self.conn.cursor() as cur:
            cur.execute("UNLOCK TABLES")
            cur.execute(f"LOCK TABLES {self.table.quoted} WRITE")


def test_a_column_added_during_a_snapshot_is_in_the_reads_after_it(
        fresh_server: MariaDBServer, fresh_db: str, mysql_rig: Any) -> None:
    """ALTER TABLE ADD COLUMN while a table is read: the chunks after it carry the new column
    and the same schema version as the streamed events after the DDL; every row is read
    once, every read's columns are its schema version's."""
    mariadb_server, db = fresh_server, fresh_db  # a server of its own (fresh_server)
    mariadb_server.execute("CREATE TABLE t (id int PRIMARY KEY, v varchar(10) NOT NULL)", db=db)
    mariadb_server.execute("INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_30000",
                           db=db)
    rig = mysql_rig(mariadb_server, [f"{db}.t"], snapshot={"mode": "never", "chunk_size": 1_000})
    capture = rig.start()
    capture.wait_streaming()
    deadline = time.monotonic() + 60
    while not rig.control.client.snapshot_state(rig.name).selected:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with _SignalGate(mariadb_server) as gate:  # the reader waits at each watermark
        rig.control.client.request_snapshot(rig.name, [f"{db}.t"])
        while gate.watermarks() < 6:  # chunks read, each between its two watermarks: with
            gate.let_one_through()  # the table's two readers, at least two chunks whole
        gate.wait_for_the_reader()  # at its next watermark: what is read after it, after the DDL
        mariadb_server.execute("ALTER TABLE t ADD COLUMN extra int NOT NULL DEFAULT 7", db=db)
    deadline = time.monotonic() + 120
    while (entry := _entry(rig, f"{db}.t")).state != pb.SNAPSHOT_DONE:
        assert entry.state in (pb.SNAPSHOT_PENDING, pb.SNAPSHOT_RUNNING), entry
        assert time.monotonic() < deadline, entry
        time.sleep(0.1)
    mariadb_server.execute("UPDATE t SET v = 'after' WHERE id = 1", db=db)
    view = rig.read(lambda v: any(e.op == Op.OP_UPDATE for _, _, e in v.events), timeout=60)
    capture.stop()
    events = sorted(deduplicated(view), key=lambda e: (e.position.tx_seq, e.position.event_index))
    reads = [e for e in events if e.op == Op.OP_SNAPSHOT_READ]
    assert len({_text(e.after, "id") for e in reads}) == len(reads) == 30_000
    columns_of: dict[str, set[tuple[str, ...]]] = {}
    for e in reads:
        columns_of.setdefault(e.schema_version, set()).add(tuple(c.name for c in e.after.columns))
    assert all(len(shapes) == 1 for shapes in columns_of.values()), columns_of
    assert len(columns_of) == 2, "one version before the DDL, one after"
    update = next(e for e in events if e.op == Op.OP_UPDATE)
    assert reads[-1].schema_version == update.schema_version
    assert reads[-1].schema_sequence == update.schema_sequence
    assert _text(reads[-1].after, "extra") == "7" and _text(reads[0].after, "extra") is None
    print(f"\n{sum(1 for e in reads if _text(e.after, 'extra') == '7')} of {len(reads)} reads "
          "after the ALTER carry the new column")
