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

import json
import re
import time
import urllib.error
import urllib.request
from typing import Any

import psycopg
import pytest

from tailrace.devservers import PostgresServer, TcpProxy
from tailrace.proto import control_pb2 as pb
from tailrace_services.capture_postgres.replication import ReplicationConnection, str_to_lsn
from tests.fix_capture import (
    CaptureProcess,
    CaptureRig,
    StandbyServer,
    slot_row,
)

pytestmark = pytest.mark.chaos

LOST = re.compile(r"position lost: (.+?)\. Re-snapshot required\.")


def stream_and_checkpoint(rig: CaptureRig, dsn: str, first_id: int, rows: int = 20
                          ) -> CaptureProcess:
    """Start capture (unless running), write `rows` single-row transactions, wait for them on
    the bus and commit the sink checkpoint at the latest epoch, as a delivery would."""
    capture = rig.processes[-1] if rig.processes and rig.processes[-1].proc.poll() is None \
        else rig.start()
    capture.wait_streaming()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(first_id, first_id + rows):
            conn.execute("INSERT INTO items VALUES (%s, 'x')", (i,))
    view = rig.read(lambda v: any(e.after.columns and e.after.columns[0].value.int_value ==
                                  first_id + rows - 1 for _, _, e in v.events), timeout=60)
    last_tx = max(e.position.tx_seq for _, _, e in view.events)
    epoch = rig.wait_epoch(lambda e: e.position.tx_seq >= last_tx, timeout=30)
    rig.checkpoint(epoch)
    return capture


def assert_position_lost(rig: CaptureRig, capture: CaptureProcess, reason: str,
                         exit_code: int | None = 1) -> str:
    """The exact error text in the log and in the control service's health; the exit code."""
    if exit_code is not None:
        assert capture.wait_exit(60) == exit_code, capture.tail()
    else:
        capture.wait_log("Re-snapshot required.")
    found = LOST.search(capture.log())
    assert found is not None, capture.tail()
    assert reason in found.group(1), found.group(0)
    health = rig.control.client.get_health(rig.source_id)
    assert health is not None and health.state == pb.HEALTH_POSITION_LOST
    assert health.reason == found.group(0)
    return found.group(0)


def side_url(capture: CaptureProcess) -> str:
    capture.wait_log('"event": "http side port"')
    return str(next(json.loads(line)["url"] for line in capture.log().splitlines()
                    if '"event": "http side port"' in line))


def http_health(capture: CaptureProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(side_url(capture) + "/health", timeout=5) as r:
            return r.status, {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def setup_items(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS items (id bigint PRIMARY KEY, v text)")


def test_promoted_standby_without_the_slot_is_a_lost_position(
        make_pg_server: Any, capture_rig: Any, tcp_proxy: Any) -> None:
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

        message = assert_position_lost(rig, capture, "does not exist but the sinks have "
                                                     "checkpointed up to")
    assert f"replication slot '{rig.slot}'" in message
    (record,) = rig.control.client.list_reconcile_records(rig.source_id)
    assert record.decision == "resnapshot"
    assert record.drift[0].startswith("promoted standby: system_identifier ")
    assert record.drift[0].endswith("timeline 1 -> 2")
    assert record.new_identity.attributes["timeline"] == "2"


def test_independent_server_on_the_same_address_is_a_lost_position(
        make_pg_server: Any, capture_rig: Any) -> None:
    server_a: PostgresServer = make_pg_server()
    dsn = server_a.create_database("shop")
    setup_items(dsn)
    rig = capture_rig(dsn, "[public.items]")
    rig.start("--http-port", "0")
    capture = stream_and_checkpoint(rig, dsn, 1)
    assert http_health(capture)[0] == 200
    with urllib.request.urlopen(side_url(capture) + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert f'tailrace_capture_postgres_events_total{{source="{rig.source_id}"}} 20.0' in metrics
    assert f'tailrace_capture_postgres_transactions_total{{source="{rig.source_id}"}} 20.0' \
        in metrics
    for name in ("wal_bytes_total", "lag_bytes", "lag_seconds", "retained_bytes", "spill_bytes"):
        assert f"tailrace_capture_postgres_{name}{{" in metrics
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


def test_dropped_slot_is_a_lost_position(pg_db: str, capture_rig: Any) -> None:
    setup_items(pg_db)
    rig = capture_rig(pg_db, "[public.items]")
    capture = stream_and_checkpoint(rig, pg_db, 1)
    assert capture.stop() == 0
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (rig.slot,))
        conn.execute("INSERT INTO items VALUES (1000, 'never captured')")
    capture = rig.start()
    assert_position_lost(rig, capture, f"replication slot '{rig.slot}' does not exist but the "
                                       "sinks have checkpointed up to")
    assert slot_row(pg_db, rig.slot) is None, "no new slot may paper over the gap"


def test_recreated_slot_past_the_checkpoint_is_a_lost_position(pg_db: str, capture_rig: Any
                                                               ) -> None:
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


def test_wal_status_lost_is_a_lost_position(make_pg_server: Any, capture_rig: Any) -> None:
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
