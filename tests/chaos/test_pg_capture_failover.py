"""Failover and lost positions (DESIGN guarantee 9), each on real PostgreSQL servers.

Every case streams some changes, has a (fake) delivery checkpoint them, then breaks the
position. The capture process must stop with exit code 1 and the exact text
`position lost: <reason>. Re-snapshot required.`, and report it as health: to the
control service (state position_lost) and, with `--http-port`, on its own `/health` (503).

- promoted standby (pg_basebackup -R, promote): PostgreSQL 15 does not copy logical
  slots to standbys, so the promoted server has no slot and cannot decode from our
  checkpoint — the identity changed (same system, new timeline), the reconcile records
  `resnapshot`, and the position is lost. Creating a new slot there would silently skip
  everything between the checkpoint and the slot's start.
- an independent server on the same address: another system_identifier; its LSNs say
  nothing about ours.
- the slot dropped; the slot recreated (its confirmed_flush_lsn is past our checkpoint:
  the changes in between are a gap); `wal_status = lost` (max_slot_wal_keep_size).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

import psycopg
import pytest

from tailrace.devservers import PostgresServer, TcpProxy
from tailrace_services.capture_postgres.connection import ReplicationConnection, str_to_lsn
from tests.fix_capture import (
    StandbyServer,
    assert_position_lost,
    http_health,
    setup_items,
    side_url,
    slot_row,
    stream_and_checkpoint,
)

pytestmark = pytest.mark.chaos


@pytest.mark.matrix(
    scenario="PostgreSQL standby promoted without our slot (timeline 1 -> 2)",
    guarantee="a lost position stops capture loudly (position lost ... Re-snapshot required, health 503), "
              "never a new slot papering over the gap; reconcile record: resnapshot")
def test_promoted_standby_without_the_slot_is_a_lost_position(
        counted: Any, make_pg_server: Any, capture_rig: Any, tcp_proxy: Any) -> None:
    primary: PostgresServer = make_pg_server()
    dsn_direct = primary.create_database("shop")
    setup_items(dsn_direct)
    proxy: TcpProxy = tcp_proxy(primary.port)
    dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/shop"
    rig = capture_rig(dsn, "[public.items]")
    with StandbyServer(primary) as standby:
        stream_and_checkpoint(rig, dsn, 1)
        capture = rig.processes[-1]
        # the standby has everything the primary wrote, then the primary goes away
        target = primary.execute("SELECT pg_current_wal_lsn()::text")[0][0]
        deadline = time.monotonic() + 30
        while standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]
                              ) != [(True,)]:
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.1)
        primary.stop()
        standby.promote()
        assert standby.execute("SELECT count(*) FROM pg_replication_slots", dbname="shop") \
            == [(0,)], "PostgreSQL 15 does not copy logical slots to a standby"
        with ReplicationConnection(standby.dsn("shop")) as repl:
            (system, history) = (repl.identify_system(), repl.timeline_history(2))
        assert system.timeline == 2 and [t for t, _ in history] == [1]
        assert history[0][1] >= str_to_lsn(target)  # the old timeline ends after our data
        proxy.retarget(standby.port)

        message = assert_position_lost(rig, capture, "does not exist, but our checkpoint ")
    assert f"replication slot '{rig.slot}'" in message
    (record,) = rig.control.client.list_reconcile_records(rig.source_id)
    assert record.decision == "resnapshot"
    assert record.drift[0].startswith("promoted standby or restored backup (same cluster, "
                                      "another timeline): system_identifier ")
    assert record.drift[0].endswith("timeline 1 -> 2")
    assert record.new_identity.attributes["timeline"] == "2"
    counted(outcome="position lost: the slot does not exist on the promoted standby")


@pytest.mark.matrix(
    scenario="another PostgreSQL cluster on the same address",
    guarantee="a lost position stops capture loudly (position lost ... Re-snapshot required, health 503), "
              "never a new slot papering over the gap")
def test_independent_server_on_the_same_address_is_a_lost_position(
        counted: Any, make_pg_server: Any, capture_rig: Any) -> None:
    server_a: PostgresServer = make_pg_server()
    dsn = server_a.create_database("shop")
    setup_items(dsn)
    rig = capture_rig(dsn, "[public.items]")
    rig.start("--http-port", "0")
    capture = stream_and_checkpoint(rig, dsn, 1)
    assert http_health(capture)[0] == 200
    with urllib.request.urlopen(side_url(capture) + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    labels = f'{{source="{rig.source_id}",source_type="postgres"}}'
    assert f"tailrace_capture_events_total{labels} 20.0" in metrics
    assert f"tailrace_capture_transactions_total{labels} 20.0" in metrics
    for name in ("log_bytes_total", "lag_bytes", "lag_seconds", "retained_bytes", "spill_bytes"):
        assert f"tailrace_capture_{name}{labels}" in metrics
    old_system = server_a.execute("SELECT system_identifier::text FROM pg_control_system()")

    # server B, an independent cluster with the same database and table, moves to A's port
    server_b: PostgresServer = make_pg_server()
    setup_items(server_b.create_database("shop"))
    assert server_b.execute("SELECT system_identifier::text FROM pg_control_system()") \
        != old_system
    server_b.stop(keep_data=True)
    with open(server_b.datadir / "postgresql.conf", "a") as conf:
        conf.write(f"port = {server_a.port}\n")
    server_b.port = server_a.port
    server_a.stop()
    server_b.start()

    message = assert_position_lost(rig, capture, "the server changed (system_identifier",
                                   exit_code=None)
    status, body = http_health(capture)  # the process stays up to tell why, until stopped
    assert status == 503 and body == {"status": "unhealthy", "reason": message}
    assert capture.stop() == 1
    (record,) = rig.control.client.list_reconcile_records(rig.source_id)
    assert record.decision == "resnapshot" and "a different server" in record.drift[0]
    # a restart does not get past it: the new identity was never stored
    capture = rig.start()
    assert_position_lost(rig, capture, "the server changed (system_identifier")
    counted(outcome="position lost: the server changed (system_identifier); /health 503")


@pytest.mark.matrix(
    scenario="our replication slot dropped while capture was down",
    guarantee="a lost position stops capture loudly (position lost ... Re-snapshot required, health 503), "
              "never a new slot papering over the gap")
def test_dropped_slot_is_a_lost_position(counted: Any, pg_db: str, capture_rig: Any) -> None:
    setup_items(pg_db)
    rig = capture_rig(pg_db, "[public.items]")
    capture = stream_and_checkpoint(rig, pg_db, 1)
    assert capture.stop() == 0
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (rig.slot,))
        conn.execute("INSERT INTO items VALUES (1000, 'never captured')")
    capture = rig.start()
    assert_position_lost(rig, capture, f"replication slot '{rig.slot}' does not exist, but our "
                                       "checkpoint ")
    assert slot_row(pg_db, rig.slot) is None, "no new slot may paper over the gap"
    counted(outcome="position lost: the slot does not exist; no new slot made")


@pytest.mark.matrix(
    scenario="our slot dropped and made again past our checkpoint",
    guarantee="a lost position stops capture loudly (position lost ... Re-snapshot required, health 503), "
              "never a new slot papering over the gap")
def test_recreated_slot_past_the_checkpoint_is_a_lost_position(
        counted: Any, pg_db: str, capture_rig: Any) -> None:
    setup_items(pg_db)
    rig = capture_rig(pg_db, "[public.items]")
    capture = stream_and_checkpoint(rig, pg_db, 1)
    assert capture.stop() == 0
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (rig.slot,))
        conn.execute("INSERT INTO items VALUES (1000, 'in the gap')")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (rig.slot,))
    capture = rig.start()
    assert_position_lost(rig, capture, "confirmed_flush_lsn")
    assert "is past our checkpoint" in capture.log()
    counted(outcome="position lost: the slot's confirmed_flush_lsn is past our checkpoint")


@pytest.mark.matrix(
    scenario="our slot invalidated (wal_status lost, max_slot_wal_keep_size)",
    guarantee="a lost position stops capture loudly (position lost ... Re-snapshot required, health 503), "
              "never a new slot papering over the gap")
def test_wal_status_lost_is_a_lost_position(counted: Any, make_pg_server: Any, capture_rig: Any) -> None:
    server: PostgresServer = make_pg_server(settings={
        "max_slot_wal_keep_size": "1MB", "wal_keep_size": 0, "min_wal_size": "32MB",
        "max_wal_size": "64MB"})
    dsn = server.create_database("shop")
    setup_items(dsn)
    rig = capture_rig(dsn, "[public.items]")
    capture = stream_and_checkpoint(rig, dsn, 1)
    assert capture.stop() == 0

    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while (slot_row(dsn, rig.slot) or ("",))[0] != "lost":
            assert time.monotonic() < deadline, f"slot state {slot_row(dsn, rig.slot)}"
            conn.execute("CREATE TABLE IF NOT EXISTS filler (pad text)")
            conn.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, "
                         "5000)")
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
    capture = rig.start()
    assert_position_lost(rig, capture, f"replication slot '{rig.slot}' has wal_status=lost")
    counted(outcome="position lost: wal_status lost")


