"""capture-mysql under kill -9, a MariaDB restart, and failover to other servers."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tailrace.devservers import KafkaBroker, MariaDBServer
from tailrace.errors import PositionLostError
from tailrace.events import Op, python_of
from tests.fix_capture import Control
from tests.fix_mysql import (
    BusReader,
    CaptureProcess,
    CaptureThread,
    Record,
    alive,
    events,
    lost,
)

pytestmark = pytest.mark.chaos


def tx_ends(records: list[Record]) -> Counter[str]:
    return Counter(e.tx_id for e in events(records) if e.tx_end)


def inserted_ids(records: list[Record]) -> set[int]:
    return {python_of(e.after.columns[0].value) for e in events(records)
            if e.op == Op.OP_INSERT}


def write_txs(server: MariaDBServer, first: int, count: int, rows: int = 1,
              pause: float = 0.0) -> None:
    conn = server.connect("shop")
    with conn.cursor() as cur:
        for t in range(first, first + count):
            cur.execute("BEGIN")
            cur.executemany("INSERT INTO t VALUES (%s, %s)",
                            [(t * rows + i, t) for i in range(rows)])
            cur.execute("COMMIT")
            if pause:
                time.sleep(pause)
    conn.close()


def new_source(server: MariaDBServer) -> None:
    server.execute("CREATE DATABASE shop")
    server.execute("CREATE TABLE shop.t (id int PRIMARY KEY, tx int NOT NULL)")


@pytest.mark.matrix(
    scenario="MariaDB capture killed -9 five times by progress and the server restarted, 20,000 rows in 100 "
             "transactions",
    guarantee="no loss and no GTID published whole twice after kill -9 and a source restart; our own "
              "reconnect, not the library's")
def test_kill_9_five_times_and_a_mariadb_restart_lose_nothing_and_repeat_no_gtid(
        counted: Any, tmp_path: Path, mysql_spec: Callable[..., Path],
        make_mariadb_server: Callable[..., MariaDBServer], kafka_broker: KafkaBroker) -> None:
    server = make_mariadb_server()
    new_source(server)
    spec = mysql_spec(server, ["shop.t"], name="kill9")
    capture = CaptureProcess(spec, tmp_path / "capture.log").start()
    capture.wait_log('"event": "streaming"')
    import threading

    kills = 0

    def killer(rounds: int) -> None:
        """Each round: wait until the capture streams and has published, then kill -9."""
        nonlocal kills
        for _ in range(rounds):
            seen = capture.log().count('"event": "streaming"')
            deadline = time.monotonic() + 60
            while capture.log().count('"event": "streaming"') <= seen - (kills == 0):
                assert time.monotonic() < deadline, capture.log()[-2000:]
                time.sleep(0.05)
            time.sleep(0.7)
            capture.kill()
            kills += 1
            capture.start()

    # 100 transactions of 200 rows, written while capture is killed now and then ...
    k = threading.Thread(target=killer, args=(3,))
    k.start()
    write_txs(server, 0, 50, rows=200, pause=0.25)
    k.join()
    # ... the server restarts under the running capture ...
    server.restart()
    k = threading.Thread(target=killer, args=(2,))
    k.start()
    write_txs(server, 50, 50, rows=200, pause=0.25)
    k.join()
    assert kills == 5
    topic = "tailrace.kill9"
    reader = BusReader(kafka_broker.bootstrap, topic)
    reader.read_until(lambda rs: len(inserted_ids(rs)) >= 20_000, timeout=180)
    time.sleep(2)
    reader.poll(2)
    capture.stop()
    assert inserted_ids(reader.records) == set(range(20_000)), "nothing missing downstream"
    ends = tx_ends(reader.records)
    twice = {g: n for g, n in ends.items() if n > 1}
    assert not twice, f"GTIDs published whole more than once: {twice}"
    sizes: dict[str, set[int]] = defaultdict(set)
    for e in events(reader.records):
        sizes[e.tx_id].add(e.tx_index)
    assert all(len(ix) == 200 for g, ix in sizes.items() if g in ends and len(ix) > 1)
    reconnects = capture.log().count("binlog connection lost; reconnecting")
    print(f"\nkill -9 x{kills} + restart: {len(ends)} transactions once each, "
          f"{reconnects} binlog reconnects after the restart")
    reader.close()
    counted(changes_in=20_000, changes_out=len(inserted_ids(reader.records)),
            outcome=f"every row downstream, {len(ends)} transactions published whole once each")


def _primary_and_replica(make_mariadb_server: Callable[..., MariaDBServer]
                         ) -> tuple[MariaDBServer, MariaDBServer]:
    """A new source (server_id 1) and a replica of it by GTID (server_id 2)."""
    primary = make_mariadb_server(server_id=1)
    replica = make_mariadb_server(server_id=2)
    new_source(primary)
    replica.execute(f"CHANGE MASTER TO master_host='127.0.0.1', master_port={primary.port}, "
                    "master_user='root', master_password='', master_use_gtid=slave_pos")
    replica.execute("START SLAVE")
    return primary, replica


def _wait_caught_up(primary: MariaDBServer, replica: MariaDBServer, timeout: float = 30) -> None:
    target = primary.execute("SELECT @@gtid_binlog_pos")[0][0]
    deadline = time.monotonic() + timeout
    while replica.execute("SELECT @@gtid_slave_pos")[0][0] != target:
        assert time.monotonic() < deadline, "replica did not catch up"
        time.sleep(0.1)


def _capture_and_read(spec: Path, brokers: str, until_txs: int,
                      reader: BusReader | None = None) -> BusReader:
    with CaptureThread(spec) as cap:
        reader = reader or BusReader(brokers, cap.spec.bus_topic)
        reader.read_until(lambda rs: len(tx_ends(rs)) >= until_txs, timeout=60,
                          alive=alive(cap))
        time.sleep(0.5)
    return reader


def _lost_on(spec: Path) -> PositionLostError:
    cap = CaptureThread(spec).start()
    try:
        return lost(cap)
    finally:
        cap.stop()


@pytest.mark.matrix(
    scenario="MariaDB failover to a promoted replica that holds our history",
    guarantee="failover: identity changed, continuity proven by GTID, streaming goes on (reconcile record: "
              "adapt)")
def test_failover_to_a_promoted_replica_continues_by_gtid(
        counted: Any, mysql_spec: Callable[..., Path], make_mariadb_server: Callable[..., MariaDBServer],
        kafka_broker: KafkaBroker, control: Control) -> None:
    primary, replica = _primary_and_replica(make_mariadb_server)
    write_txs(primary, 0, 30)
    reader = _capture_and_read(mysql_spec(primary, ["shop.t"], name="promote"),
                               kafka_broker.bootstrap, 31)
    write_txs(primary, 30, 20)  # capture is down: these must come from the replica
    _wait_caught_up(primary, replica)
    primary.stop()
    replica.execute("STOP SLAVE")
    replica.execute("RESET SLAVE ALL")
    write_txs(replica, 50, 10)  # the promoted server's own writes: 0-2-...
    _capture_and_read(mysql_spec(replica, ["shop.t"], name="promote"),
                      kafka_broker.bootstrap, 61, reader)
    assert inserted_ids(reader.records) == set(range(60))
    assert max(tx_ends(reader.records).values()) == 1, "nothing published twice"
    records = control.client.list_reconcile_records("src-promote")
    assert [r.decision for r in records] == ["adapt"]
    assert "server_id 1 -> 2" in records[0].drift[0]
    reader.close()
    counted(outcome="60 of 60 rows, none published twice; reconcile: adapt")


@pytest.mark.matrix(
    scenario="MariaDB failover to a replica behind our checkpoint",
    guarantee="a lost position stops loudly: position lost, health says why, reconcile record: resnapshot")
def test_failover_to_a_lagging_replica_is_a_lost_position(
        counted: Any, mysql_spec: Callable[..., Path], make_mariadb_server: Callable[..., MariaDBServer],
        kafka_broker: KafkaBroker, control: Control) -> None:
    primary, replica = _primary_and_replica(make_mariadb_server)
    write_txs(primary, 0, 10)
    _wait_caught_up(primary, replica)
    replica.execute("STOP SLAVE")  # lags from here
    write_txs(primary, 10, 20)
    reader = _capture_and_read(mysql_spec(primary, ["shop.t"], name="lagging"),
                               kafka_broker.bootstrap, 31)
    err = _lost_on(mysql_spec(replica, ["shop.t"], name="lagging"))
    assert str(err) == f"position lost: {err.reason}. Re-snapshot required."
    assert "the server is behind our checkpoint" in err.reason
    assert "0-1-12" in err.reason and "0-1-32" in err.reason, err.reason
    records = control.client.list_reconcile_records("src-lagging")
    assert [r.decision for r in records] == ["resnapshot"]
    health = control.client.get_health("src-lagging")
    assert health is not None and health.reason == str(err)
    reader.close()
    counted(outcome="position lost: the server is behind our checkpoint; reconcile: resnapshot")


@pytest.mark.matrix(
    scenario="another MariaDB server on the same address whose GTID numbers pass ours",
    guarantee="a different server is told by its history, not by GTID numbers: position lost")
def test_an_independent_server_on_the_same_address_is_detected(
        counted: Any, mysql_spec: Callable[..., Path], make_mariadb_server: Callable[..., MariaDBServer],
        kafka_broker: KafkaBroker, control: Control) -> None:
    first = make_mariadb_server(server_id=1)
    new_source(first)
    write_txs(first, 0, 20)
    reader = _capture_and_read(mysql_spec(first, ["shop.t"], name="independent"),
                               kafka_broker.bootstrap, 21)
    port = first.port
    first.stop()
    other = make_mariadb_server(port=port, server_id=7)
    new_source(other)
    write_txs(other, 0, 100)  # its GTID numbers pass ours: only the history tells
    err = _lost_on(mysql_spec(other, ["shop.t"], name="independent"))
    assert "never contained GTID 0-1-22" in err.reason, err.reason
    records = control.client.list_reconcile_records("src-independent")
    assert [r.decision for r in records] == ["resnapshot"]
    assert any("server_id 1 -> 7" in d for d in records[0].drift)
    reader.close()
    counted(outcome="position lost: the server never contained our checkpoint GTID")


