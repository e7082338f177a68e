"""capture-postgres on real servers: volume, transactions and epochs, a large transaction."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from tailrace.events import ChangeEvent, Op
from tests.fix_capture import (
    BusView,
    assert_epochs_between_transactions,
    assert_transactions_whole,
    column,
)

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, note text);
CREATE TABLE orders (id bigint PRIMARY KEY, account_id int NOT NULL,
                     amount numeric(12,2) NOT NULL, status text NOT NULL);
CREATE TABLE audit (id bigint PRIMARY KEY, doc jsonb NOT NULL, at timestamptz NOT NULL);
"""

OPS = {Op.OP_INSERT: "insert", Op.OP_UPDATE: "update", Op.OP_DELETE: "delete"}


@dataclass
class Workload:
    """Mixed transactions over three tables, with the changes each key must show, in order."""

    rng: random.Random
    statements: list[list[tuple[str, tuple[Any, ...]]]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # changes per transaction, commit order
    expected: dict[tuple[str, int], list[tuple[str, Any]]] = field(
        default_factory=lambda: defaultdict(list))
    accounts: int = 1000
    next_order: int = 1
    next_audit: int = 1
    first_live_audit: int = 1

    def total(self) -> int:
        return sum(self.sizes)

    def build(self, changes: int) -> None:
        self._tx([("INSERT INTO accounts SELECT g, 0, NULL FROM generate_series(1, %s::int) g",
                   (self.accounts,))], [("accounts", i, "insert", 0)
                                        for i in range(1, self.accounts + 1)])
        balance = dict.fromkeys(range(1, self.accounts + 1), 0)
        audit_n: dict[int, int] = {}
        while self.total() < changes:
            left = changes - self.total()
            kind = self.rng.choice(["bulk", "mixed", "mixed", "small", "small"])
            if kind == "bulk":
                k = min(left, self.rng.randint(50, 2000))
                a = self.next_audit
                self.next_audit += k
                for i in range(a, a + k):
                    audit_n[i] = 0
                self._tx([("INSERT INTO audit SELECT g, jsonb_build_object('n', 0), now() "
                           "FROM generate_series(%s::bigint, %s::bigint) g", (a, a + k - 1))],
                         [("audit", i, "insert", 0) for i in range(a, a + k)])
            elif kind == "mixed":
                stmts: list[tuple[str, tuple[Any, ...]]] = []
                changes_of: list[tuple[str, int, str, Any]] = []
                k = self.rng.randint(1, 200)
                o = self.next_order
                self.next_order += k
                stmts.append(("INSERT INTO orders SELECT g, 1 + g %% 1000, g * 1.25, 'new' "
                              "FROM generate_series(%s::bigint, %s::bigint) g", (o, o + k - 1)))
                changes_of += [("orders", i, "insert", "new") for i in range(o, o + k)]
                x = self.rng.randint(1, self.accounts - 50)
                y = x + self.rng.randint(0, 49)
                stmts.append(("UPDATE accounts SET balance = balance + 1 WHERE id BETWEEN %s "
                              "AND %s", (x, y)))
                for i in range(x, y + 1):
                    balance[i] += 1
                    changes_of.append(("accounts", i, "update", balance[i]))
                live = sorted(audit_n)
                if len(live) > 100:
                    d = self.rng.randint(1, 30)
                    gone = live[:d]
                    stmts.append(("DELETE FROM audit WHERE id BETWEEN %s AND %s",
                                  (gone[0], gone[-1])))
                    for i in gone:
                        del audit_n[i]
                        changes_of.append(("audit", i, "delete", None))
                    bump = sorted(audit_n)[: self.rng.randint(1, 40)]
                    stmts.append(("UPDATE audit SET doc = jsonb_build_object('n', "
                                  "(doc->>'n')::int + 1) WHERE id BETWEEN %s AND %s",
                                  (bump[0], bump[-1])))
                    for i in bump:
                        audit_n[i] += 1
                        changes_of.append(("audit", i, "update", audit_n[i]))
                if len(changes_of) > left:
                    continue
                self._tx(stmts, changes_of)
            elif self.next_order > 1:
                i = self.rng.randint(1, self.next_order - 1)
                status = f"s{len(self.sizes)}"
                self._tx([("UPDATE orders SET status = %s WHERE id = %s", (status, i))],
                         [("orders", i, "update", status)])

    def _tx(self, statements: list[tuple[str, tuple[Any, ...]]],
            changes: list[tuple[str, int, str, Any]]) -> None:
        self.statements.append(statements)
        self.sizes.append(len(changes))
        for table, key, op, value in changes:
            self.expected[(table, key)].append((op, value))

    def run(self, dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statements in self.statements:
                with conn.transaction():
                    for sql, params in statements:
                        conn.execute(sql, params)


def value_of_change(event: ChangeEvent) -> Any:
    if event.op == Op.OP_DELETE:
        return None
    if event.table == "accounts":
        return column(event.after, "balance")
    if event.table == "orders":
        return column(event.after, "status")
    return json.loads(column(event.after, "doc"))["n"]


def test_100k_changes_in_mixed_transactions_arrive_whole_in_order_and_cut_by_epochs(
        pg_db: str, capture_rig: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    rig = capture_rig(pg_db, "[public.accounts, public.orders, public.audit]", partitions=3)
    capture = rig.start()
    capture.wait_streaming()

    work = Workload(random.Random(4))
    work.build(100_000)
    assert work.total() == 100_000
    work.run(pg_db)

    view: BusView = rig.read(lambda v: len(v.events) >= work.total(), timeout=240)
    assert len(view.events) == work.total() == view.distinct_positions()

    # complete and per key in order
    got: dict[tuple[str, int], list[tuple[str, Any]]] = defaultdict(list)
    for records in view.by_partition().values():
        for _, record in records:
            if isinstance(record, ChangeEvent):
                row = record.after if record.op != Op.OP_DELETE else record.before
                got[(record.table, int(column(row, "id")))].append(
                    (OPS[record.op], value_of_change(record)))
    assert got.keys() == work.expected.keys()
    wrong = [k for k, changes in work.expected.items() if got[k] != changes]
    assert not wrong, f"{len(wrong)} keys differ, e.g. {wrong[0]}: {got[wrong[0]][:5]} != " \
                      f"{work.expected[wrong[0]][:5]}"

    # transactions whole, contiguous, marked, in commit order with the sizes written
    sizes = assert_transactions_whole(view, rig.partitions)
    assert [sizes[tx] for tx in sorted(sizes)] == work.sizes

    # each table's events carry its registered schema
    schemas = {(r.table): r for r in rig.control.client.list_schemas("acme")}
    for _, _, event in view.events[:: 97]:
        registered = schemas[f"public.{event.table}"]
        assert (event.schema_version, event.schema_sequence) == (registered.fingerprint,
                                                                 registered.sequence)

    # epochs: markers on every partition, between transactions, recorded in control
    epochs = assert_epochs_between_transactions(view, rig.control.client, rig.source_id,
                                                rig.partitions)
    assert epochs >= 3
    # recorded once the bus acknowledged its markers
    rig.wait_epoch(lambda e: e.position.tx_seq == max(sizes), timeout=30)
    assert capture.proc.poll() is None


ROWS = 200_000


def test_200k_row_transaction_spills_and_stays_under_300_mb(pg_db: str, capture_rig: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int NOT NULL, pad text NOT NULL)")
    rig = capture_rig(pg_db, "[public.big]", max_tx_memory_events=5_000)
    capture = rig.start()
    capture.wait_streaming()
    baseline_kb = capture.status("VmRSS")

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO big SELECT g, g %% 1000, repeat(md5(g::text), 8) "
                     "FROM generate_series(1, %s::int) g", (ROWS,))

    rig.wait_epoch(lambda e: e.position.event_index == ROWS - 1, timeout=240)
    peak_kb = capture.status("VmHWM")
    view = rig.read(lambda v: len(v.events) >= ROWS, timeout=60)
    sizes = assert_transactions_whole(view, 1)
    assert list(sizes.values()) == [ROWS]
    assert [int(column(e.after, "id")) for _, _, e in view.events] == list(range(1, ROWS + 1))
    print(f"capture RSS: {baseline_kb / 1024:.0f} MB streaming, peak {peak_kb / 1024:.0f} MB "
          f"for a {ROWS}-row transaction")
    assert peak_kb < 300 * 1024, f"capture peak RSS {peak_kb / 1024:.0f} MB"
    assert "large transaction spilled to disk" in capture.log()


def _insert(conn: psycopg.Connection[Any], first: int, count: int) -> None:
    conn.execute("INSERT INTO big SELECT g, g %% 1000, repeat(md5(g::text), 4) "
                 "FROM generate_series(%s::bigint, %s::bigint) g", (first, first + count - 1))


def test_transactions_streamed_while_open_publish_only_what_committed_in_commit_order(
        pg_db: str, capture_rig: Any) -> None:
    """With stream_transactions_over 64KiB the server sends large transactions while they
    are open, interleaved: capture holds each (here past max_tx_memory_events, on disk),
    cuts rolled-back savepoints (nested ones with them), drops the aborted one, and
    publishes the committed ones whole at their commits, in commit order among small ones."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int NOT NULL, pad text)")
    rig = capture_rig(pg_db, "[public.big]", max_tx_memory_events=1_000,
                      stream_transactions_over="64KiB")
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db) as a, psycopg.connect(pg_db) as b, \
            psycopg.connect(pg_db) as d, psycopg.connect(pg_db, autocommit=True) as small:
        _insert(a, 1, 5_000)
        a.execute("SAVEPOINT s1")
        _insert(a, 100_001, 3_000)
        a.execute("ROLLBACK TO SAVEPOINT s1")  # in the file: cut there, copied
        _insert(d, 500_001, 5_000)
        _insert(a, 200_001, 2_000)  # under s1 still: kept
        a.execute("SAVEPOINT s2")
        a.execute("SAVEPOINT s3")
        _insert(a, 300_001, 1_500)
        a.execute("RELEASE SAVEPOINT s3")
        a.execute("ROLLBACK TO SAVEPOINT s2")  # s2 wrote nothing itself, s3 is rolled back
        _insert(b, 400_001, 4_000)
        _insert(small, 900_001, 1)
        b.commit()
        _insert(small, 900_002, 1)
        _insert(a, 5_001, 1_000)
        d.rollback()
        a.commit()
        _insert(small, 900_003, 1)

    a_ids = [*range(1, 5_001), *range(200_001, 202_001), *range(5_001, 6_001)]
    expected = [[900_001], list(range(400_001, 404_001)), [900_002], a_ids, [900_003]]
    total = sum(map(len, expected))
    view = rig.read(lambda v: len(v.events) >= total, timeout=120)
    sizes = assert_transactions_whole(view, 1)
    assert [sizes[tx] for tx in sorted(sizes)] == [len(ids) for ids in expected]
    transactions: list[list[int]] = []
    for _, _, event in view.events:
        if event.tx_index == 0:
            transactions.append([])
        transactions[-1].append(int(column(event.after, "id")))
    assert transactions == expected
    assert len(view.events) == total
    with psycopg.connect(pg_db, autocommit=True) as conn:  # (stats the walsender reported)
        streamed = conn.execute("SELECT stream_txns, stream_count FROM pg_stat_replication_slots"
                                " WHERE slot_name LIKE 'tailrace_%'").fetchone()
    print(f"streamed transactions, blocks: {streamed}")
    assert streamed is not None and streamed[0] >= 3, \
        f"the server streamed {streamed[0] if streamed else 0} transactions, not all three large"
    assert "large transaction spilled to disk" in capture.log()
    assert capture.proc.poll() is None


def test_a_ddl_in_a_transaction_streamed_while_open_counts_only_once_it_commits(
        pg_db: str, capture_rig: Any) -> None:
    """on_schema_drift halt: a large transaction that alters a table and rolls back is sent
    while open, DDL included, and changes nothing (no halt, no schema registered); one that
    commits registers its structure at its commit, and the changes made before that carry
    it, and their keys (REPLICA IDENTITY FULL: from the catalog, read at the commit)."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int NOT NULL, pad text)")
        conn.execute("CREATE TABLE other (id bigint PRIMARY KEY, n int NOT NULL)")
        conn.execute("CREATE TABLE full_ (id bigint PRIMARY KEY, n int NOT NULL)")
        conn.execute("ALTER TABLE full_ REPLICA IDENTITY FULL")
    tables = "[public.big, public.other, public.full_]"
    first = capture_rig(pg_db, tables, on_schema_drift="halt",
                      max_tx_memory_events=1_000, stream_transactions_over="64KiB")
    capture = first.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db) as conn:
        _insert(conn, 1, 3_000)  # registers big's structure, at the commit
        conn.commit()
        _insert(conn, 3_001, 3_000)
        conn.execute("ALTER TABLE big ADD COLUMN extra text")
        _insert(conn, 6_001, 3_000)
        _wait_decoded_past(pg_db, conn)  # the DDL and the changes after it sent, so far
        conn.rollback()
        conn.execute("INSERT INTO other VALUES (1, 1)")
        conn.commit()
    view = first.read(lambda v: len(v.events) >= 3_001, timeout=120)
    assert [e.table for _, _, e in view.events] == ["big"] * 3_000 + ["other"]
    assert capture.proc.poll() is None, "capture stopped on a DDL that rolled back"
    assert "schema drift" not in capture.log()
    versions = [r for r in first.control.client.list_schemas("acme") if r.table == "public.big"]
    assert len(versions) == 1
    capture.stop()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (first.slot,))

    # the same, committed, under adapt: big and full_ get a column each
    rig = capture_rig(pg_db, tables, max_tx_memory_events=1_000,
                      stream_transactions_over="64KiB")
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db) as conn:
        _insert(conn, 3_001, 3_000)
        conn.execute("ALTER TABLE big ADD COLUMN extra text DEFAULT 'x'")
        _insert(conn, 6_001, 3_000)
        conn.execute("ALTER TABLE full_ ADD COLUMN c int")
        conn.execute("INSERT INTO full_ SELECT g, g, g FROM generate_series(1, 2000) g")
        conn.commit()
    view = rig.read(lambda v: len(v.events) >= 8_000, timeout=120)
    events = [e for _, _, e in view.events]
    assert [int(column(e.after, "id")) for e in events[:6_000]] == \
        list(range(3_001, 9_001))
    assert list(assert_transactions_whole(view, 1).values()) == [8_000]
    versions = sorted((r for r in rig.control.client.list_schemas("acme")
                       if r.table == "public.big"), key=lambda r: r.version)
    assert len(versions) == 2
    old, new = versions
    assert {(e.schema_version, e.schema_sequence) for e in events[:3_000]} == \
        {(old.fingerprint, old.sequence)}
    assert {(e.schema_version, e.schema_sequence) for e in events[3_000:6_000]} == \
        {(new.fingerprint, new.sequence)}
    assert column(events[5_999].after, "extra") == "x"
    full = [r for r in rig.control.client.list_schemas("acme") if r.table == "public.full_"]
    assert len(full) == 1  # (no change of it before: first seen at the commit)
    assert {(e.schema_version, e.schema_sequence, tuple(e.key_columns))
            for e in events[6_000:]} == {(full[0].fingerprint, full[0].sequence, ("id",))}
    assert capture.proc.poll() is None


def test_a_ddl_in_a_rolled_back_savepoint_of_a_streamed_transaction_leaves_no_trace(
        pg_db: str, capture_rig: Any) -> None:
    """ROLLBACK TO a savepoint after an ALTER and a table's first change, both streamed: the
    rest of the transaction is read with the structures from before, and published whole;
    the rolled-back structure is never registered (on_schema_drift halt: no stop)."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int NOT NULL, pad text)")
        conn.execute("CREATE TABLE t2 (id bigint PRIMARY KEY)")
    rig = capture_rig(pg_db, "[public.big, public.t2]", on_schema_drift="halt",
                      max_tx_memory_events=1_000, stream_transactions_over="64KiB")
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db) as conn:
        _insert(conn, 1, 3_000)
        conn.execute("SAVEPOINT s1")
        conn.execute("INSERT INTO t2 SELECT g FROM generate_series(1, 3000) g")
        conn.execute("ALTER TABLE big ADD COLUMN extra text")
        _insert(conn, 3_001, 3_000)
        _wait_decoded_past(pg_db, conn)
        conn.execute("ROLLBACK TO SAVEPOINT s1")
        _insert(conn, 6_001, 3_000)
        conn.execute("INSERT INTO t2 SELECT g FROM generate_series(1, 3000) g")
        conn.commit()
    view = rig.read(lambda v: len(v.events) >= 9_000, timeout=120)
    got = [(e.table, int(column(e.after, "id"))) for _, _, e in view.events]
    assert got == [("big", i) for i in [*range(1, 3_001), *range(6_001, 9_001)]] + \
        [("t2", i) for i in range(1, 3_001)]
    assert all(len(e.after.columns) == 3 for _, _, e in view.events if e.table == "big")
    versions = [r for r in rig.control.client.list_schemas("acme") if r.table == "public.big"]
    assert len(versions) == 1 and "schema drift" not in capture.log()
    assert capture.proc.poll() is None


def test_new_structures_announced_again_and_cut_by_a_savepoint_keep_their_changes_right(
        pg_db: str, capture_rig: Any) -> None:
    """One streamed transaction gives a table two new structures: after an ALTER the server
    announces the first again (each block, and after a rolled-back savepoint, whose copy is
    cut); then a new primary key. Every change comes out with its own structure's schema,
    key columns and before-image, registered at the commit."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE kt (a int PRIMARY KEY, b int NOT NULL, pad text)")
        conn.execute("INSERT INTO kt VALUES (0, 0, 'first')")  # not captured: before the slot
    rig = capture_rig(pg_db, "[public.kt]", max_tx_memory_events=1_000,
                      stream_transactions_over="64KiB")
    capture = rig.start()
    capture.wait_streaming()

    def insert(conn: psycopg.Connection[Any], first: int, count: int) -> None:
        conn.execute("INSERT INTO kt SELECT g, -g, repeat(md5(g::text), 4), g "
                     "FROM generate_series(%s::int, %s::int) g", (first, first + count - 1))

    with psycopg.connect(pg_db) as conn:
        conn.execute("UPDATE kt SET pad = 'v1' WHERE a = 0")  # registers the structure
        conn.commit()
        conn.execute("ALTER TABLE kt ADD COLUMN c int")
        insert(conn, 1, 3_000)
        _wait_decoded_past(pg_db, conn)
        conn.execute("SAVEPOINT s")
        insert(conn, 3_001, 3_000)
        _wait_decoded_past(pg_db, conn)
        conn.execute("ROLLBACK TO SAVEPOINT s")
        insert(conn, 6_001, 3_000)
        conn.execute("ALTER TABLE kt DROP CONSTRAINT kt_pkey, ADD PRIMARY KEY (b)")
        conn.execute("UPDATE kt SET pad = 'u' WHERE a BETWEEN 1 AND 10")
        conn.commit()
    view = rig.read(lambda v: len(v.events) >= 6_011, timeout=120)
    events = [e for _, _, e in view.events][1:]
    assert len(events) == 6_010
    assert [int(column(e.after, "a")) for e in events[:6_000]] == \
        [*range(1, 3_001), *range(6_001, 9_001)]
    versions = sorted((r for r in rig.control.client.list_schemas("acme")
                       if r.table == "public.kt"), key=lambda r: r.version)
    assert len(versions) == 3
    _, with_c, keyed_b = versions
    assert {(e.schema_version, e.schema_sequence, tuple(e.key_columns))
            for e in events[:6_000]} == {(with_c.fingerprint, with_c.sequence, ("a",))}
    updates = events[6_000:]
    assert {(e.schema_version, e.schema_sequence, tuple(e.key_columns)) for e in updates} \
        == {(keyed_b.fingerprint, keyed_b.sequence, ("b",))}
    assert [[(c.name, column(e.before, c.name)) for c in e.before.columns] for e in updates] \
        == [[("b", -i)] for i in range(1, 11)]
    assert capture.proc.poll() is None


def _wait_decoded_past(dsn: str, writer: psycopg.Connection[Any]) -> None:
    """Until capture's walsender has decoded what `writer` wrote so far (and streamed, past
    the memory bound, what of it is open): by progress, not time. (The WAL of an open
    transaction may wait in a page not flushed yet, which the walsender cannot read: each
    poll commits a transaction with an xid, which flushes it.)"""
    (lsn,) = writer.execute("SELECT pg_current_wal_insert_lsn()").fetchone() or (None,)
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            conn.execute("SELECT txid_current()")
            row = conn.execute("SELECT bool_or(r.sent_lsn >= %s) FROM pg_stat_replication r "
                               "JOIN pg_replication_slots s ON s.active_pid = r.pid "
                               "WHERE s.slot_name LIKE 'tailrace_%%'", (lsn,)).fetchone()
            if row and row[0]:
                return
            assert time.monotonic() < deadline, f"capture's walsender did not reach {lsn}"
            time.sleep(0.05)


def _streamed_blocks(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(sum(stream_count), 0) FROM "
                           "pg_stat_replication_slots WHERE slot_name LIKE 'tailrace_%'"
                           ).fetchone()
    return int(row[0]) if row else 0


def test_a_kill_while_a_transaction_is_streamed_to_capture_loses_and_doubles_nothing(
        pg_db: str, capture_rig: Any) -> None:
    """Capture killed (-9) once the server streamed blocks of an open transaction to it:
    the next session is sent the whole transaction again, and publishes it once, whole."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int NOT NULL, pad text)")
    rig = capture_rig(pg_db, "[public.big]", stream_transactions_over="64KiB")
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db) as a:
        _insert(a, 1, 5_000)
        deadline = time.monotonic() + 60
        while _streamed_blocks(pg_db) == 0:  # by progress: the server sent blocks of it
            assert time.monotonic() < deadline, "the server streamed nothing of it in 60 s"
            time.sleep(0.05)
        capture.kill()
        _insert(a, 5_001, 3_000)
        capture = rig.start()
        capture.wait_streaming()
        _insert(a, 8_001, 2_000)
        a.commit()
    view = rig.read(lambda v: len(v.events) >= 10_000, timeout=120)
    assert [int(column(e.after, "id")) for _, _, e in view.events] == list(range(1, 10_001))
    assert list(assert_transactions_whole(view, 1).values()) == [10_000]
    assert capture.proc.poll() is None


def test_stream_transactions_over_null_keeps_every_transaction_whole_until_its_commit(
        pg_db: str, capture_rig: Any) -> None:
    """null: protocol 1, nothing streamed however large (the server holds it); the default
    (4 MiB) would stream this one."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int NOT NULL, pad text)")
    rig = capture_rig(pg_db, "[public.big]", stream_transactions_over=None)
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db) as conn:
        _insert(conn, 1, 30_000)  # ~10 MB of decoding memory: past 4 MiB, under 64MB
        conn.commit()
    view = rig.read(lambda v: len(v.events) >= 30_000, timeout=120)
    assert [int(column(e.after, "id")) for _, _, e in view.events] == list(range(1, 30_001))
    assert _streamed_blocks(pg_db) == 0
    assert capture.proc.poll() is None


BIG = "".join(f"{i:05d}" for i in range(4000))  # 20 kB, stored out of line (TOAST)


def test_read_only_mode_before_images_and_unchanged_toast(
        pg_server: Any, pg_db: str, capture_rig: Any) -> None:
    """A role with only LOGIN REPLICATION streams from the operator's slot and publication;
    before-images are whole with REPLICA IDENTITY FULL and key-only otherwise; a TOASTed
    value the server did not send is marked unchanged, never NULL, unless the whole old
    row (FULL) has it; the key is the primary key either way."""
    dbname = psycopg.conninfo.conninfo_to_dict(pg_db)["dbname"]
    role = f"ro_{dbname}"
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE full_t (id int PRIMARY KEY, a text, big text);
            ALTER TABLE full_t REPLICA IDENTITY FULL;
            CREATE TABLE keyed (id int PRIMARY KEY, a text, big text);
            ALTER TABLE full_t ALTER COLUMN big SET STORAGE EXTERNAL;
            ALTER TABLE keyed ALTER COLUMN big SET STORAGE EXTERNAL;
            CREATE PUBLICATION ro_pub FOR TABLE full_t, keyed""")
        conn.execute(f"CREATE ROLE {role} LOGIN REPLICATION")
        conn.execute("SELECT pg_create_logical_replication_slot('ro_slot', 'pgoutput')")
    rig = capture_rig(pg_server.dsn(dbname, user=role), "[public.full_t, public.keyed]",
                      slot="ro_slot", publication="ro_pub", create_slot=False)
    try:
        capture = rig.start()
        capture.wait_streaming()
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for table in ("full_t", "keyed"):
                conn.execute(f"INSERT INTO {table} VALUES (1, 'x', %s)", (BIG,))
                conn.execute(f"UPDATE {table} SET a = 'y' WHERE id = 1")
                conn.execute(f"DELETE FROM {table} WHERE id = 1")
        view = rig.read(lambda v: len(v.events) >= 6, timeout=60)
        assert "replication slot created" not in capture.log()
    finally:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                         "WHERE slot_name = 'ro_slot' AND active_pid IS NOT NULL")
            for process in rig.processes:
                process.stop()
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")

    def row(r: Any) -> dict[str, Any]:
        out = {}
        for c in r.columns:
            kind = c.value.WhichOneof("kind")
            out[c.name] = "UNCHANGED" if kind == "unchanged_toast" else getattr(c.value, kind)
        return out

    events = {(e.table, e.op): e for _, _, e in view.events}
    full_update = events[("full_t", Op.OP_UPDATE)]
    assert row(full_update.before) == {"id": 1, "a": "x", "big": BIG}
    assert row(full_update.after) == {"id": 1, "a": "y", "big": BIG}  # from the old row
    assert [list(e.key_columns) for _, _, e in view.events] == [["id"]] * 6
    assert row(events[("full_t", Op.OP_DELETE)].before) == {"id": 1, "a": "y", "big": BIG}
    keyed_update = events[("keyed", Op.OP_UPDATE)]
    assert row(keyed_update.before) == {"id": 1}
    assert row(keyed_update.after) == {"id": 1, "a": "y", "big": "UNCHANGED"}
    assert row(events[("keyed", Op.OP_DELETE)].before) == {"id": 1}
    assert not events[("keyed", Op.OP_DELETE)].after.columns
