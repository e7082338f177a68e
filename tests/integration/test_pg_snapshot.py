"""Snapshots from PostgreSQL on real servers: existing rows read in watermarked chunks while a
writer changes the same keys, merged into the change stream on the bus.

What the bus holds, read the way delivery reads it (each position once, forward only),
is replayed key by key:
- no gap: the replay ends with exactly the source's rows;
- no duplicate: at most one read per key;
- no stale read: a key's read carries exactly the row its earlier events (on top of the
  row seeded before the snapshot) left — a change before the read is never undone by it.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from tailrace.events import ChangeEvent, Op
from tailrace.proto import control_pb2 as pb
from tests.fix_capture import BusView, CaptureRig, assert_transactions_whole, deduplicated

pytestmark = pytest.mark.integration

TABLES = ("accounts", "orders", "notes")
ROWS = {"accounts": 80_000, "orders": 70_000, "notes": 50_000}  # 200,000 rows
CHUNK = 5_000


def seed(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, "
                     "note text)")
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, amount numeric(12,2) NOT "
                     "NULL, status text NOT NULL)")
        conn.execute("CREATE TABLE notes (region text, id int, body text, "
                     "PRIMARY KEY (region, id))")
        conn.execute("INSERT INTO accounts SELECT g, g * 10, 'n' || g "
                     "FROM generate_series(1, %s) g", (ROWS["accounts"],))
        conn.execute("INSERT INTO orders SELECT g, g / 100.0, 'new' "
                     "FROM generate_series(1, %s) g", (ROWS["orders"],))
        conn.execute("INSERT INTO notes SELECT 'r' || (g %% 7), g, 'b' || g "
                     "FROM generate_series(1, %s) g", (ROWS["notes"],))


def state_of(dsn: str) -> dict[tuple[str, tuple[str, ...]], tuple[str, ...]]:
    """Every row of the three tables as text: (table, key) -> row."""
    out: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}
    with psycopg.connect(dsn) as conn:
        for r in conn.execute("SELECT id::text, balance::text, note FROM accounts"):
            out[("accounts", (r[0],))] = (r[0], r[1], r[2])
        for r in conn.execute("SELECT id::text, amount::text, status FROM orders"):
            out[("orders", (r[0],))] = (r[0], r[1], r[2])
        for r in conn.execute("SELECT region, id::text, body FROM notes"):
            out[("notes", (r[0], r[1]))] = (r[0], r[1], r[2])
    return out


def _text(event_row: Any, name: str) -> str | None:
    for c in event_row.columns:
        if c.name == name:
            kind = c.value.WhichOneof("kind")
            return None if kind == "null" else str(getattr(c.value, kind))
    return None  # not in the image (a before-image holds the key columns only)


COLUMNS = {"accounts": ("id", "balance", "note"), "orders": ("id", "amount", "status"),
           "notes": ("region", "id", "body")}
KEYS = {"accounts": ("id",), "orders": ("id",), "notes": ("region", "id")}


def row_of(event: ChangeEvent, image: Any) -> tuple[tuple[str, tuple[str, ...]], tuple[Any, ...]]:
    table = event.table
    key = tuple(str(_text(image, k)) for k in KEYS[table])
    return (table, key), tuple(_text(image, c) for c in COLUMNS[table])


class Writer(threading.Thread):
    """Inserts, updates and deletes keys across every table's range until stopped."""

    def __init__(self, dsn: str, per_second: int = 0) -> None:
        """`per_second`: at most that many transactions a second (0: as fast as it can)."""
        super().__init__(daemon=True)
        self.dsn = dsn
        self.per_second = per_second
        self.stopped = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(14)
        try:
            started = time.monotonic()
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stopped.is_set():
                    with conn.transaction():
                        for _ in range(rng.randint(1, 5)):
                            self._change(conn, rng)
                    self.transactions += 1
                    if self.per_second:
                        ahead = self.transactions / self.per_second - (time.monotonic() - started)
                        if ahead > 0:
                            time.sleep(ahead)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    @staticmethod
    def _change(conn: psycopg.Connection[Any], rng: random.Random) -> None:
        table = rng.choice(TABLES)
        n = rng.randint(1, ROWS[table] + 2_000)
        what = rng.random()
        if table == "accounts":
            if what < 0.6:
                conn.execute("INSERT INTO accounts VALUES (%s, %s, 'w') ON CONFLICT (id) DO "
                             "UPDATE SET balance = accounts.balance + 1, note = 'u'", (n, n))
            else:
                conn.execute("DELETE FROM accounts WHERE id = %s", (n,))
        elif table == "orders":
            if what < 0.6:
                conn.execute("INSERT INTO orders VALUES (%s, 1.5, 'w') ON CONFLICT (id) DO "
                             "UPDATE SET status = 'paid', amount = orders.amount + 1", (n,))
            else:
                conn.execute("DELETE FROM orders WHERE id = %s", (n,))
        else:
            region = f"r{n % 7}"
            if what < 0.6:
                conn.execute("INSERT INTO notes VALUES (%s, %s, 'w') ON CONFLICT (region, id) "
                             "DO UPDATE SET body = notes.body || '+'", (region, n))
            else:
                conn.execute("DELETE FROM notes WHERE region = %s AND id = %s", (region, n))


def wait_snapshot_done(rig: CaptureRig, timeout: float = 300, tables: int = len(TABLES)
                       ) -> pb.SnapshotState:
    deadline = time.monotonic() + timeout
    while True:
        state = rig.control.client.snapshot_state(rig.name)
        done = [t for t in state.tables if t.state == pb.SNAPSHOT_DONE]
        if len(done) == tables:
            return state
        failed = [t for t in state.tables if t.state == pb.SNAPSHOT_FAILED]
        assert not failed, failed
        assert time.monotonic() < deadline, f"snapshot not done after {timeout:.0f} s: {state}"
        time.sleep(0.2)


def check_bus(view: BusView, seeded: dict[Any, tuple[str, ...]],
              final: dict[Any, tuple[str, ...]]) -> Counter[str]:
    """The replays of the module docstring; returns counts of what the bus held."""
    events = sorted(deduplicated(view), key=lambda e: (e.position.tx_seq,
                                                       e.position.event_index))
    replay: dict[Any, tuple[Any, ...]] = {}
    known = dict(seeded)  # what each key holds so far: seeded, then changed
    reads: Counter[Any] = Counter()
    counts: Counter[str] = Counter()
    for event in events:
        if event.op == Op.OP_SNAPSHOT_READ:
            key, row = row_of(event, event.after)
            reads[key] += 1
            if known.get(key) != row:
                history = [(o, p, e.op, e.position.tx_seq, e.tx_id, e.snapshot.chunk,
                            row_of(e, e.after)[1] if e.after.columns else None)
                           for p, o, e in view.events
                           if row_of(e, e.after if e.after.columns else e.before)[0] == key]
                raise AssertionError(
                    f"stale read of {key}: {row}, the log says {known.get(key)}; read at "
                    f"{event.position.tx_seq}, tx {event.tx_id}; every event of the key on "
                    f"the bus (offset, partition, op, tx_seq, tx, chunk, row):\n"
                    + "\n".join(map(str, history)))
            replay[key] = row
            counts["read"] += 1
        elif event.op in (Op.OP_INSERT, Op.OP_UPDATE):
            if event.op == Op.OP_UPDATE and event.before.columns:
                old, _ = row_of(event, event.before)
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
    if twice:
        history = [(o, p, e.op, e.position.tx_seq, e.tx_id, e.tx_size, e.snapshot.chunk)
                   for p, o, e in view.events
                   if row_of(e, e.after if e.after.columns else e.before)[0] == twice[0]]
        first_tx = history[0][3]
        offsets = sorted(o for p, o, e in view.events if e.position.tx_seq == first_tx)
        markers = [(o, m.epoch_id, m.position.tx_seq) for p, o, m in view.markers
                   if offsets[0] - 50 <= o <= offsets[-1] + 50]
        raise AssertionError(f"{len(twice)} keys read twice, e.g. {twice[:3]}; every event of "
                             f"{twice[0]} on the bus (offset, partition, op, tx_seq, tx, size, "
                             "chunk):\n" + "\n".join(map(str, history))
                             + f"\nits first read's transaction: {len(offsets)} events at "
                             f"offsets {offsets[0]}..{offsets[-1]}; epoch markers near: "
                             f"{markers}")
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
        pg_db: str, capture_rig: Any) -> None:
    seed(pg_db)
    seeded = state_of(pg_db)
    rig = capture_rig(pg_db, "[public.accounts, public.orders, public.notes]",
                      snapshot={"mode": "initial", "chunk_size": CHUNK})
    capture = rig.start()
    capture.wait_streaming()
    writer = Writer(pg_db)
    writer.start()
    started = time.monotonic()
    state = wait_snapshot_done(rig)
    took = time.monotonic() - started
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None, writer.error
    with psycopg.connect(pg_db, autocommit=True) as conn:  # the last change: seen = all seen
        conn.execute("INSERT INTO accounts VALUES (1, 0, 'end') ON CONFLICT (id) DO UPDATE "
                     "SET note = 'end'")
    final = state_of(pg_db)
    view = rig.read(lambda v: any(e.after.columns and _text(e.after, "note") == "end"
                                  for _, _, e in v.events if e.table == "accounts"),
                    timeout=120)
    counts = check_bus(view, seeded, final)
    assert_transactions_whole(view, 1)
    capture.stop()
    rows = sum(t.rows_done for t in state.tables)
    print(f"\nsnapshot of {sum(ROWS.values())} rows in {took:.1f} s with {writer.transactions} "
          f"writer transactions meanwhile: {counts['read']} read events, {counts['change']} "
          f"changes on the bus, {counts['keys']} rows at the end, equal to the source; "
          f"rows_done {rows}")
    assert counts["read"] == rows




@pytest.mark.chaos
def test_initial_snapshot_killed_three_times_completes_without_a_duplicate(
        pg_db: str, capture_rig: Any) -> None:
    """kill -9 of capture after 10, 25 and 40 of the ~100 chunks are stored (progress, not
    time); each restart finds what of its in-flight chunk reached the bus."""
    seed(pg_db)
    seeded = state_of(pg_db)
    rig = capture_rig(pg_db, "[public.accounts, public.orders, public.notes]",
                      snapshot={"mode": "initial", "chunk_size": 2_000})
    capture = rig.start()
    capture.wait_streaming()
    writer = Writer(pg_db, per_second=1_000)  # ~3,000 changes/s: the run's length is bounded
    writer.start()
    for target in (10, 25, 40):
        capture = rig.kill_when_chunks_done(capture, target, timeout=300)
    state = wait_snapshot_done(rig)
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None, writer.error
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO accounts VALUES (1, 0, 'end') ON CONFLICT (id) DO UPDATE "
                     "SET note = 'end'")
    final = state_of(pg_db)
    view = rig.read(lambda v: any(e.after.columns and _text(e.after, "note") == "end"
                                  for _, _, e in v.events if e.table == "accounts"),
                    timeout=120)
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


def out_of_order(view: BusView) -> int:
    """How often a chunk's read transaction reached the bus after a later chunk's of the
    same read (ranges read on several connections at once)."""
    chunks = {}
    for event in sorted(deduplicated(view), key=lambda e: e.position.tx_seq):
        if event.op == Op.OP_SNAPSHOT_READ:
            chunks.setdefault(event.position.tx_seq, event.snapshot.chunk)
    numbers = list(chunks.values())
    return sum(1 for before, after in itertools.pairwise(numbers) if after < before)


@pytest.mark.chaos
def test_one_table_read_in_ranges_on_four_connections_and_killed_once_has_no_gap_and_no_duplicate(
        pg_db: str, capture_rig: Any) -> None:
    """`snapshot.parallelism: 4` and one table: the idle readers join its read and read key
    ranges of it at once, each on its own connection, between its own watermarks, while a
    writer changes the same keys; capture is killed -9 once 15 chunks are stored (progress,
    not time), with ranges still in flight. The bus replays to the source, no key read
    twice, no stale read."""
    seed(pg_db)
    seeded = {k: v for k, v in state_of(pg_db).items() if k[0] == "accounts"}
    rig = capture_rig(pg_db, "[public.accounts]",
                      snapshot={"mode": "initial", "chunk_size": 1_000, "parallelism": 4})
    capture = rig.start()
    capture.wait_streaming()
    writer = Writer(pg_db, per_second=1_000)
    writer.start()
    capture = rig.kill_when_chunks_done(capture, 15, timeout=300)
    state = wait_snapshot_done(rig, tables=1)
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None, writer.error
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO accounts VALUES (1, 0, 'end') ON CONFLICT (id) DO UPDATE "
                     "SET note = 'end'")
    final = {k: v for k, v in state_of(pg_db).items() if k[0] == "accounts"}
    view = rig.read(lambda v: any(e.after.columns and _text(e.after, "note") == "end"
                                  for _, _, e in v.events if e.table == "accounts"),
                    timeout=120)
    counts = check_bus(view, seeded, final)
    capture.stop()
    log = (rig.dir / f"capture-{rig.name}.log").read_text(errors="replace")
    joined = log.count("snapshot reader joins a table's read")
    inversions = out_of_order(view)
    print(f"\n{ROWS['accounts']} rows of one table on 4 connections, one kill -9, "
          f"{writer.transactions} writer transactions: {counts['read']} reads (each key at most "
          f"once), {counts['change']} changes, {counts['keys']} rows equal to the source; "
          f"readers joined the table's read {joined} times; a chunk on the bus after a later "
          f"one {inversions} times")
    assert joined >= 2, "the table was read by one reader only"
    assert counts["read"] == state.tables[0].rows_done


def test_on_demand_snapshot_with_where_status_and_cancel_while_streaming(
        pg_db: str, capture_rig: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`tailrace snapshot` on a running pipeline (mode never): a filtered table read while the
    writer goes on, `status` showing it done, and a large one cancelled part-way."""
    from tailrace_services.cli.main import main

    seed(pg_db)
    seeded = state_of(pg_db)
    rig = capture_rig(pg_db, "[public.accounts, public.orders, public.notes]",
                      snapshot={"mode": "never", "chunk_size": 1_000})
    capture = rig.start()
    capture.wait_streaming()
    control = ["--control", rig.control.address]
    writer = Writer(pg_db)
    writer.start()
    deadline = time.monotonic() + 60
    while not rig.control.client.snapshot_state(rig.name).selected:  # capture reported
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert rig.control.client.snapshot_state(rig.name).tables == [], "mode never: no snapshot"

    assert main([*control, "snapshot", rig.name, "--table", "public.notes",
                 "--where", "region = 'r3' AND id <= 20000"]) == 0
    deadline = time.monotonic() + 120
    while (entry := rig.control.client.snapshot_state(rig.name).tables[0]).state != \
            pb.SNAPSHOT_DONE:
        assert entry.state in (pb.SNAPSHOT_PENDING, pb.SNAPSHOT_RUNNING), entry
        assert time.monotonic() < deadline, entry
        time.sleep(0.1)
    capsys.readouterr()
    assert main([*control, "snapshot", "status", rig.name]) == 0
    status = capsys.readouterr().out
    assert "public.notes" in status and "done" in status.lower(), status

    assert main([*control, "snapshot", rig.name, "--table", "public.accounts"]) == 0
    deadline = time.monotonic() + 120
    while _entry(rig, "public.accounts").chunks_done < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert main([*control, "snapshot", "cancel", rig.name, "--table", "public.accounts"]) == 0
    capture.wait_log('"state": "SNAPSHOT_CANCELLED"', 60)
    cancelled = _entry(rig, "public.accounts")
    assert cancelled.state == pb.SNAPSHOT_CANCELLED
    writer.stopped.set()
    writer.join(30)
    assert writer.error is None, writer.error

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO accounts VALUES (1, 0, 'end') ON CONFLICT (id) DO UPDATE "
                     "SET note = 'end'")
    view = rig.read(lambda v: any(e.after.columns and _text(e.after, "note") == "end"
                                  for _, _, e in v.events if e.table == "accounts"),
                    timeout=120)
    events = sorted(deduplicated(view), key=lambda e: (e.position.tx_seq,
                                                       e.position.event_index))
    known = dict(seeded)
    reads: Counter[Any] = Counter()
    for event in events:
        if event.op == Op.OP_SNAPSHOT_READ:
            key, row = row_of(event, event.after)
            reads[key] += 1
            assert known.get(key) == row, f"stale read of {key}"
        elif event.op == Op.OP_DELETE:
            known.pop(row_of(event, event.before)[0], None)
        else:
            key, row = row_of(event, event.after)
            known[key] = row
    assert max(reads.values()) == 1, "a key read twice"
    notes = [k for k in reads if k[0] == "notes"]
    assert notes and all(k[1][0] == "r3" and int(k[1][1]) <= 20_000 for k in notes)
    accounts = [k for k in reads if k[0] == "accounts"]
    assert len(accounts) == cancelled.rows_done < ROWS["accounts"] // 2
    assert not [k for k in reads if k[0] == "orders"], "orders was not asked for"
    capture.stop()
    print(f"\non demand: {len(notes)} rows of public.notes where region = 'r3' AND id <= 20000;"
          f" public.accounts cancelled after {cancelled.chunks_done} chunks "
          f"({len(accounts)} rows); {writer.transactions} writer transactions meanwhile")


def _entry(rig: CaptureRig, table: str) -> pb.SnapshotTable:
    state = rig.control.client.snapshot_state(rig.name)
    return next(t for t in state.tables if t.table == table)


def test_initial_only_reads_every_table_then_exits_0(pg_db: str, capture_rig: Any) -> None:
    seed(pg_db)
    seeded = state_of(pg_db)
    rig = capture_rig(pg_db, "[public.accounts, public.orders, public.notes]",
                      snapshot={"mode": "initial_only", "chunk_size": 20_000})
    capture = rig.start()
    assert capture.wait_exit(180) == 0, capture.tail()
    assert "initial snapshot complete; stopping" in capture.log()
    view = rig.read(lambda v: sum(e.op == Op.OP_SNAPSHOT_READ for _, _, e in v.events)
                    >= len(seeded), timeout=60)
    counts = check_bus(view, seeded, state_of(pg_db))
    assert counts["read"] == len(seeded) and counts["change"] == 0
    lasts = [e for _, _, e in view.events if e.snapshot.last]
    assert sorted(e.table for e in lasts) == sorted(TABLES), "one `last` read per table"
    # parallelism 2 (the default): two readers, so two tables were read at once
    spans = sorted((t.started_unix_ms, t.updated_unix_ms)
                   for t in rig.control.client.snapshot_state(rig.name).tables)
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)), spans


def test_initial_snapshots_a_table_that_starts_matching_later(pg_db: str,
                                                             capture_rig: Any) -> None:
    """`initial` with `public.*`: a table created while capture streams is added to the
    publication and read, its existing rows once each, its later changes after them."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE first (id int PRIMARY KEY)")
        conn.execute("INSERT INTO first SELECT generate_series(1, 10)")
    rig = capture_rig(pg_db, "[public.*]", snapshot={"mode": "initial", "chunk_size": 1_000})
    capture = rig.start()
    capture.wait_streaming()
    deadline = time.monotonic() + 60
    while not any(t.table == "public.first" and t.state == pb.SNAPSHOT_DONE
                  for t in rig.control.client.snapshot_state(rig.name).tables):
        assert time.monotonic() < deadline, capture.tail()
        time.sleep(0.1)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE late (id int PRIMARY KEY, v text NOT NULL)")
        conn.execute("INSERT INTO late SELECT g, 'v' || g FROM generate_series(1, 5000) g")
    capture.wait_log('"tables added to the publication"', 60)
    deadline = time.monotonic() + 120
    while not any(t.table == "public.late" and t.state == pb.SNAPSHOT_DONE
                  for t in rig.control.client.snapshot_state(rig.name).tables):
        assert time.monotonic() < deadline, capture.tail()
        time.sleep(0.1)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("UPDATE late SET v = 'after' WHERE id = 1")
    view = rig.read(lambda v: any(e.table == "late" and e.op == Op.OP_UPDATE
                                  for _, _, e in v.events), timeout=60)
    late = [e for e in sorted(deduplicated(view), key=lambda e: (e.position.tx_seq,
                                                                 e.position.event_index))
            if e.table == "late"]
    reads = Counter(_text(e.after, "id") for e in late if e.op == Op.OP_SNAPSHOT_READ)
    assert len(reads) == 5000 and max(reads.values()) == 1, len(reads)
    assert late[-1].op == Op.OP_UPDATE and _text(late[-1].after, "v") == "after"
    capture.stop()
    print(f"\na table created while streaming: {len(reads)} rows read once each, then its "
          "update")
