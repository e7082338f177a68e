"""Outages while streaming: the walsender killed (reconnect with backoff), the bus cut off
(backpressure: capture stops reading, then resumes; nothing is dropped)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from tailrace.devservers import TcpProxy
from tailrace.events import Op
from tests.fix_capture import column, deduplicated, slot_row
from tests.fix_servers import ProxiedKafka

pytestmark = pytest.mark.chaos


class Writer(threading.Thread):
    """Small transactions of inserts and updates until stopped; `expected` per key."""

    def __init__(self, dsn: str, rows_per_tx: int = 20, pause: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rows_per_tx, self.pause = dsn, rows_per_tx, pause
        self.expected: dict[int, list[tuple[str, int]]] = {}
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                next_id = 1
                while not self.halt.is_set():
                    with conn.transaction():
                        last = next_id + self.rows_per_tx - 1
                        conn.execute("INSERT INTO items SELECT g, 0 FROM generate_series("
                                     "%s::bigint, %s::bigint) g", (next_id, last))
                        conn.execute("UPDATE items SET v = 1 WHERE id = %s", (next_id,))
                    for i in range(next_id, last + 1):
                        self.expected[i] = [("insert", 0)]
                    self.expected[next_id].append(("update", 1))
                    next_id = last + 1
                    time.sleep(self.pause)
        except BaseException as e:
            self.error = e

    def finish(self) -> int:
        self.halt.set()
        self.join(30)
        assert self.error is None, self.error
        return sum(len(v) for v in self.expected.values())


def assert_all_arrived(rig: Any, writer: Writer, total: int) -> int:
    """Every change on the bus, per key in order after dedup; returns the copies seen."""
    view = rig.read(lambda v: len(deduplicated(v)) >= total, timeout=180)
    kept = deduplicated(view)
    got: dict[int, list[tuple[str, int]]] = {}
    for e in kept:
        op = "insert" if e.op == Op.OP_INSERT else "update"
        got.setdefault(int(column(e.after, "id")), []).append((op, int(column(e.after, "v"))))
    assert got == writer.expected
    return len(view.events) - len(kept)


@pytest.mark.matrix(
    scenario="the PostgreSQL walsender killed three times under load",
    guarantee="capture reconnects by itself (backoff) and loses nothing; per key in order")
def test_walsender_killed_three_times_capture_reconnects_and_loses_nothing(
        counted: Any, pg_db: str, capture_rig: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL)")
    rig = capture_rig(pg_db, "[public.items]")
    capture = rig.start()
    capture.wait_streaming()
    writer = Writer(pg_db)
    writer.start()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for kill in range(3):
            time.sleep(1.5)
            if (epoch := rig.control.client.latest_epoch(rig.source_id)) is not None:
                rig.checkpoint(epoch)
            (pid,) = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE "
                                  "slot_name = %s", (rig.slot,)).fetchone() or (None,)
            assert pid is not None, "the capture is not streaming"
            assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
            deadline = time.monotonic() + 30
            while capture.log().count('"event": "streaming"') < kill + 2:
                assert capture.proc.poll() is None, capture.tail()
                assert time.monotonic() < deadline, capture.tail()
                time.sleep(0.1)
    time.sleep(1.0)
    total = writer.finish()
    copies = assert_all_arrived(rig, writer, total)
    counted(changes_in=total, changes_out=total,
            outcome=f"{copies} copies re-published on reconnect (same ids)")
    assert capture.proc.poll() is None
    assert capture.log().count("capture interrupted; reconnecting") == 3
    assert '"retry_in_s"' in capture.log()
    assert slot_row(pg_db, rig.slot) is not None


def reported_write_lsn(dsn: str, slot: str) -> tuple[int, int]:
    """(write LSN the capture reported, the server's current WAL LSN)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (r.write_lsn - '0/0'::pg_lsn)::bigint, "
            "(pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint FROM pg_stat_replication r "
            "JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = %s",
            (slot,)).fetchone()
    assert row is not None, "the capture is not streaming"
    return int(row[0] or 0), int(row[1])


@pytest.mark.matrix(
    scenario="the bus cut off from capture under load",
    guarantee="backpressure: capture stops reading the WAL and holds nothing it cannot publish; resumes "
              "without loss or duplicate; memory bounded")
def test_bus_cut_off_capture_stops_reading_then_resumes_without_dropping(
        counted: Any, pg_db: str, capture_rig: Any, proxied_broker: tuple[ProxiedKafka, TcpProxy]) -> None:
    broker, proxy = proxied_broker
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL)")
    rig = capture_rig(pg_db, "[public.items]", brokers=f"127.0.0.1:{proxy.port}")
    capture = rig.start()
    capture.wait_streaming()
    writer = Writer(pg_db)
    writer.start()
    time.sleep(2)

    proxy.cut()
    # the capture stops reading: the write position it reports stops while WAL grows
    stalled_since, last = time.monotonic(), reported_write_lsn(pg_db, rig.slot)[0]
    deadline = time.monotonic() + 20
    while time.monotonic() - stalled_since < 3:
        assert time.monotonic() < deadline, "the capture kept reading while the bus was cut"
        time.sleep(0.2)
        write, current = reported_write_lsn(pg_db, rig.slot)
        if write != last:
            stalled_since, last = time.monotonic(), write
    assert current > last, "no WAL was waiting while the capture stood still"
    rss_cut_kb = capture.status("VmRSS")
    proxy.restore()

    time.sleep(2)
    total = writer.finish()
    duplicates = assert_all_arrived(rig, writer, total)
    counted(changes_in=total, changes_out=total, duplicates=duplicates,
            outcome=f"capture RSS during the cut {rss_cut_kb // 1024} MB")
    assert duplicates == 0, "the bus outage made the capture publish again"
    assert "capture interrupted" not in capture.log()
    assert capture.proc.poll() is None
    assert rss_cut_kb < 300 * 1024

    # a stop request does not wait for the bus forever: what is in flight is abandoned
    # (published again from the checkpoint at the next start)
    proxy.cut()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        before = conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint"
                              ).fetchone()[0]
        conn.execute("INSERT INTO items SELECT g, 0 FROM generate_series(10000001, 10000100) g")
    # capture reports what it read: past `before` once it read these rows, now in flight to
    # the cut bus
    deadline = time.monotonic() + 60
    while reported_write_lsn(pg_db, rig.slot)[0] <= before:
        assert time.monotonic() < deadline, "capture never read the rows written to the cut bus"
        time.sleep(0.2)
    started = time.monotonic()
    assert capture.stop() == 0
    assert time.monotonic() - started < 15
    assert "stopped while waiting for the bus" in capture.log()
