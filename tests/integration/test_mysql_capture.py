"""capture-mysql against real MariaDB servers, publishing to a real Kafka-protocol bus."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tailrace.devservers import KafkaBroker, MariaDBServer
from tailrace.events import Op, python_of
from tailrace.proto.event_pb2 import ChangeEvent
from tests.fix_capture import Control
from tests.fix_mysql import (
    BusReader,
    CaptureThread,
    alive,
    count_events,
    events,
    lost,
    purge_binlogs_to,
    wait_no_binlog_readers,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def db(mariadb_server: MariaDBServer) -> str:
    name = f"t_{uuid.uuid4().hex[:10]}"
    mariadb_server.create_database(name)
    return name


def row(ev: ChangeEvent, which: str = "after") -> dict[str, Any]:
    return {c.name: python_of(c.value) for c in getattr(ev, which).columns}


def test_backlog_of_200k_rows_streams_completely_in_gtid_mode(
        mysql_spec: Callable[..., Path], mariadb_server: MariaDBServer,
        kafka_broker: KafkaBroker, db: str) -> None:
    """200 transactions of 1000 rows written before capture starts: every row arrives once."""
    mariadb_server.execute(f"CREATE TABLE {db}.big (id int PRIMARY KEY, v varchar(40))")
    conn = mariadb_server.connect(db)
    with conn.cursor() as cur:
        for start in range(0, 200_000, 1000):
            cur.execute("BEGIN")
            cur.executemany("INSERT INTO big VALUES (%s, %s)",
                            [(i, f"row-{i:08d}-padding-padding") for i in range(start,
                                                                             start + 1000)])
            cur.execute("COMMIT")
    conn.close()
    t0 = time.monotonic()
    with CaptureThread(mysql_spec(mariadb_server, [f"{db}.big"])) as cap:
        reader = BusReader(kafka_broker.bootstrap, cap.spec.bus_topic)
        reader.read_until(count_events(200_001), timeout=240, alive=alive(cap))
        elapsed = time.monotonic() - t0
    evs = [e for e in events(reader.records) if e.op == Op.OP_INSERT]
    ids = [row(e)["id"] for e in evs]
    assert len(ids) == 200_000 and set(ids) == set(range(200_000)), "complete, no duplicates"
    sizes = {e.tx_size for e in evs}
    assert sizes == {1000}
    print(f"\n200k-row backlog: {len(ids)} rows on the bus in {elapsed:.1f} s "
          f"({len(ids) / elapsed:,.0f} rows/s)")
    reader.close()


def test_100k_mixed_changes_over_3_tables_ordered_contiguous_epochs_whole(
        mysql_spec: Callable[..., Path], mariadb_server: MariaDBServer,
        kafka_broker: KafkaBroker, db: str) -> None:
    for t in ("a", "b", "c"):
        mariadb_server.execute(f"CREATE TABLE {db}.{t} (id int PRIMARY KEY, v int NOT NULL)")
    cap = CaptureThread(mysql_spec(mariadb_server, [f"{db}.%"], epoch_ms=50,
                                   max_tx=300)).start()  # transactions of 600 spill
    cap.wait_streaming()
    expected = 0

    def write() -> None:
        nonlocal expected
        conn = mariadb_server.connect(db)
        with conn.cursor() as cur:
            for t in ("a", "b", "c"):
                for start in range(0, 10_000, 500):
                    cur.execute("BEGIN")
                    cur.executemany(f"INSERT INTO {t} VALUES (%s, 0)",
                                    [(i,) for i in range(start, start + 500)])
                    cur.execute("COMMIT")
                    expected += 500
            for k in range(100):  # 500 changes across the three tables per transaction
                lo = (k * 97) % 9_800
                cur.execute("BEGIN")
                cur.execute("UPDATE a SET v = v + 1 WHERE id BETWEEN %s AND %s", (lo, lo + 199))
                cur.execute("UPDATE b SET v = v + 1 WHERE id BETWEEN %s AND %s", (lo, lo + 199))
                cur.execute("DELETE FROM c WHERE id BETWEEN %s AND %s", (k * 100, k * 100 + 99))
                cur.execute("COMMIT")
                expected += 500
            for k in range(40):
                cur.execute("BEGIN")
                for t in ("a", "b"):
                    cur.execute(f"UPDATE {t} SET v = v + 1 WHERE id %% 50 = %s", (k,))
                cur.execute("COMMIT")
                expected += 400
        conn.close()

    writer = threading.Thread(target=write)
    writer.start()
    writer.join()
    assert expected == 96_000
    reader = BusReader(kafka_broker.bootstrap, cap.spec.bus_topic)
    try:
        reader.read_until(count_events(expected + 3), timeout=240, alive=alive(cap))
        time.sleep(1.0)  # the last epoch marker
        reader.poll(2.0)
    finally:
        cap.stop()
    recs = reader.records
    evs = [e for e in events(recs) if e.op != Op.OP_DDL]  # the three CREATE TABLEs
    assert len(evs) == expected, "complete, nothing twice"
    # per key in source order: v only grows, and the last change matches the table
    history: dict[tuple[str, int], list[tuple[int, int | None]]] = defaultdict(list)
    for e in evs:
        r = row(e, "before" if e.op == Op.OP_DELETE else "after")
        history[(e.table, r["id"])].append((e.op, None if e.op == Op.OP_DELETE else r["v"]))
    for (table, key), changes in history.items():
        vs = [v for op, v in changes if v is not None]
        assert vs == sorted(vs), f"{table}.{key} out of order: {changes}"
    final = {(t, i): v for t in ("a", "b") for i, v in mariadb_server.execute(
        f"SELECT id, v FROM {db}.{t}")}
    for (table, key), v in final.items():
        assert history[(table, key)][-1] == (Op.OP_UPDATE if v else Op.OP_INSERT, v)
    assert all(history[("c", k)][-1][0] == Op.OP_DELETE for k in range(10_000))
    # transactions contiguous, epochs only between transactions
    open_tx: tuple[str, int] | None = None
    markers = 0
    for r in recs:
        if r.record.WhichOneof("record") == "epoch":
            assert open_tx is None, f"epoch {r.record.epoch.epoch_id} splits transaction {open_tx}"
            markers += 1
            continue
        e = r.record.event
        if open_tx is None:
            assert e.tx_index == 0
        else:
            assert (e.tx_id, e.tx_index) == (open_tx[0], open_tx[1] + 1), "interleaved"
        open_tx = None if e.tx_end else (e.tx_id, e.tx_index)
    assert open_tx is None and markers >= 2
    print(f"\n100k mixed: {len(evs)} events, {len({e.tx_id for e in evs})} transactions, "
          f"{markers} epochs")
    reader.close()


def test_alter_add_drop_rename_column_rows_keep_their_own_names_and_versions(
        mysql_spec: Callable[..., Path], mariadb_server: MariaDBServer,
        kafka_broker: KafkaBroker, control: Control, db: str) -> None:
    """All written before capture starts: the catalog already shows the last structure."""
    run = mariadb_server.execute
    run(f"CREATE TABLE {db}.t (id int PRIMARY KEY, a int, b varchar(10))")
    run(f"INSERT INTO {db}.t VALUES (1, 10, 'x')")
    run(f"ALTER TABLE {db}.t ADD COLUMN c int")
    run(f"INSERT INTO {db}.t VALUES (2, 20, 'y', 200)")
    run(f"ALTER TABLE {db}.t DROP COLUMN a")
    run(f"INSERT INTO {db}.t VALUES (3, 'z', 300)")
    run(f"ALTER TABLE {db}.t RENAME COLUMN b TO bee")
    run(f"INSERT INTO {db}.t VALUES (4, 'w', 400)")
    run(f"TRUNCATE TABLE {db}.t")
    with CaptureThread(mysql_spec(mariadb_server, [f"{db}.t"])) as cap:
        reader = BusReader(kafka_broker.bootstrap, cap.spec.bus_topic)
        reader.read_until(count_events(9), timeout=60, alive=alive(cap))
    evs = events(reader.records)
    inserts = [e for e in evs if e.op == Op.OP_INSERT]
    assert [list(row(e)) for e in inserts] == [
        ["id", "a", "b"], ["id", "a", "b", "c"], ["id", "b", "c"], ["id", "bee", "c"]]
    assert [row(e)["id"] for e in inserts] == [1, 2, 3, 4]
    versions = [e.schema_version for e in inserts]
    assert len(set(versions)) == 4, "one schema version per structure"
    sequences = [e.schema_sequence for e in inserts]
    assert sequences == sorted(sequences) and len(set(sequences)) == 4
    registered = {s.fingerprint for s in control.client.list_schemas("acme", db, "t")}
    assert set(versions) <= registered
    ddl = [e for e in evs if e.op == Op.OP_DDL]
    assert [e.ddl.split()[0:2] for e in ddl] == [["CREATE", "TABLE"]] + [["ALTER", "TABLE"]] * 3
    assert [e.op for e in evs][-1] == Op.OP_TRUNCATE
    reader.close()


def test_value_types_decode_exactly(mysql_spec: Callable[..., Path],
                                    mariadb_server: MariaDBServer, kafka_broker: KafkaBroker,
                                    db: str) -> None:
    import datetime as dt
    from decimal import Decimal

    mariadb_server.execute(f"""CREATE TABLE {db}.v (id bigint unsigned PRIMARY KEY, u uuid,
        ip inet6, j json, e enum('a','b'), s set('x','y','z'), b bit(10), bn binary(4),
        d decimal(30,10), dtm datetime(6), ts timestamp(6) NULL, y year, f float, t text)""")
    conn = mariadb_server.connect(db)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+02:00'")
        cur.execute("INSERT INTO v VALUES (18446744073709551615, UUID(), '::ffff:1.2.3.4', "
                    "'{\"a\": [1, 2.5]}', 'b', 'z,x', b'1010101011', x'00ff', "
                    "'12345678901234567890.0123456789', '2024-01-02 03:04:05.123456', "
                    "'2024-01-02 03:04:05.654321', 2024, 1.1, 'héllo')")
        cur.execute("SELECT u FROM v")
        (u,) = cur.fetchone()
    conn.close()
    with CaptureThread(mysql_spec(mariadb_server, [f"{db}.v"])) as cap:
        reader = BusReader(kafka_broker.bootstrap, cap.spec.bus_topic)
        reader.read_until(count_events(2), timeout=60, alive=alive(cap))
    ins = [e for e in events(reader.records) if e.op == Op.OP_INSERT][0]
    r = row(ins)
    assert r["id"] == 2**64 - 1 and str(r["u"]) == u and r["ip"] == "::ffff:1.2.3.4"
    assert r["j"] == '{"a": [1, 2.5]}' and r["e"] == "b" and r["s"] == "x,z"
    assert r["b"] == 0b1010101011 and r["bn"] == b"\x00\xff\x00\x00"
    assert r["d"] == Decimal("12345678901234567890.0123456789")
    assert r["dtm"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
    assert r["ts"] == dt.datetime(2024, 1, 2, 1, 4, 5, 654321, tzinfo=dt.UTC)
    assert r["y"] == 2024 and r["f"] == 1.1 and r["t"] == "héllo"
    types = {c.name: c.type for c in ins.after.columns}
    assert types["u"] == "uuid" and types["j"] == "json" and types["d"] == "decimal(30,10)"
    assert list(ins.key_columns) == ["id"]
    reader.close()


def _captured_then_stopped(spec: Path, server: MariaDBServer, brokers: str,
                           rows: int) -> BusReader:
    """A capture of `spec` runs while `rows` rows go into shop.t; stopped once they are read."""
    with CaptureThread(spec) as cap:
        for i in range(rows):
            server.execute("INSERT INTO shop.t VALUES (%s)", (i,))
        reader = BusReader(brokers, cap.spec.bus_topic)
        reader.read_until(count_events(rows + 1), timeout=60, alive=alive(cap))
        time.sleep(0.5)
    return reader


def _shop(server: MariaDBServer) -> None:
    server.execute("CREATE DATABASE shop")
    server.execute("CREATE TABLE shop.t (id int PRIMARY KEY)")


def test_purge_past_the_checkpoint_is_a_lost_position(
        mysql_spec: Callable[..., Path], make_mariadb_server: Callable[..., MariaDBServer],
        kafka_broker: KafkaBroker, control: Control) -> None:
    server = make_mariadb_server()
    _shop(server)
    spec = mysql_spec(server, ["shop.t"], name="purge")
    reader = _captured_then_stopped(spec, server, kafka_broker.bootstrap, 5)
    for i in range(5, 10):  # written while capture is down, then purged
        server.execute("INSERT INTO shop.t VALUES (%s)", (i,))
        server.execute("FLUSH BINARY LOGS")
    newest = server.execute("SHOW BINARY LOGS")[-1][0]
    purge_binlogs_to(server, newest)
    cap = CaptureThread(spec).start()
    err = lost(cap)
    text = str(err)
    assert text.startswith("position lost: binlogs were purged past our checkpoint")
    assert text.endswith(". Re-snapshot required.")
    assert text == f"position lost: {err.reason}. Re-snapshot required."
    health = control.client.get_health(cap.spec.spec.source.id)
    assert health is not None and health.reason == text
    cap.stop()
    reader.close()


def test_reset_master_then_new_writes_is_a_lost_position(
        mysql_spec: Callable[..., Path], make_mariadb_server: Callable[..., MariaDBServer],
        kafka_broker: KafkaBroker) -> None:
    server = make_mariadb_server()
    _shop(server)
    spec = mysql_spec(server, ["shop.t"], name="reset")
    reader = _captured_then_stopped(spec, server, kafka_broker.bootstrap, 10)
    wait_no_binlog_readers(server)
    server.execute("RESET MASTER")
    for i in range(10, 40):  # more transactions than before: the numbers pass our checkpoint
        server.execute("INSERT INTO shop.t VALUES (%s)", (i,))
    cap = CaptureThread(spec).start()
    err = lost(cap)
    assert "RESET MASTER" in err.reason, err.reason
    assert str(err) == f"position lost: {err.reason}. Re-snapshot required."
    cap.stop()
    reader.close()


def test_settings_are_checked_before_streaming(
        mysql_spec: Callable[..., Path],
        make_mariadb_server: Callable[..., MariaDBServer]) -> None:
    from tailrace.errors import SourceConfigurationError

    server = make_mariadb_server(extra_args=["--binlog-row-metadata=MINIMAL",
                                             "--binlog-format=MIXED"])
    cap = CaptureThread(mysql_spec(server, ["shop.*"])).start()
    cap.join(30)
    assert isinstance(cap.error, SourceConfigurationError)
    text = str(cap.error)
    assert "binlog_row_metadata is 'MINIMAL'; set binlog_row_metadata=FULL" in text
    assert "binlog_format is 'MIXED'; set binlog_format=ROW" in text
    cap.stop()
