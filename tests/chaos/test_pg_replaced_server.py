"""A PostgreSQL that is not our history is never followed (issue 11.2, the PostgreSQL audit).

Each case captures from server A, has a (fake) delivery checkpoint, then puts another
server — or another history — behind the same address, writes rows tagged 'theirs' on
it, and restarts capture. Capture must stop with `position lost: <reason>. Re-snapshot
required.` naming the real positions, serve 503 on `/health`, report `position_lost` to
the control service, and publish none of the other server's rows.

- an earlier file-level copy of the cluster (disk snapshot, restored file backup): the
  same system identifier, timeline and slot, so identity and slot checks pass; only the
  WAL tells. Behind our checkpoint; past it but behind what we published; past both,
  where its own transactions reuse our LSNs and only the re-read of our checkpoint's
  transaction (xid, commit time) tells;
- a standby promoted before it received our checkpoint (new timeline forked before it);
- another cluster past our LSNs that has a slot of the same name;
- our slot recreated after publishing but before any checkpoint;
- a position check that fails: on a changed server it never adopts it; on a known one
  capture continues, and the re-read of the checkpoint's transaction still decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tailrace.devservers import PostgresServer
from tailrace.events import python_of
from tailrace.proto import control_pb2 as pb
from tailrace_services.capture_postgres.connection import lsn_to_str, str_to_lsn
from tailrace_services.capture_postgres.position import lsn_of
from tests.fix_capture import (
    BusView,
    CaptureProcess,
    CaptureRig,
    RestoredServer,
    StandbyServer,
    assert_position_lost,
    http_health,
    setup_items,
    slot_row,
    stream_and_checkpoint,
)

pytestmark = pytest.mark.chaos

THEIRS = 1000  # ids of the other server's rows start here


def wal_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str_to_lsn(row[0])


def write_theirs(dsn: str, *, rows: int = 0, until_wal: int = 0) -> int:
    """Single-row transactions shaped like ours ('theirs' instead of 'x'): `rows` of them,
    or as many as it takes for the WAL to pass `until_wal`. Returns how many."""
    written = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while written < rows or (until_wal and wal_lsn(dsn) <= until_wal):
            conn.execute("INSERT INTO items VALUES (%s, 'theirs')", (THEIRS + written,))
            written += 1
    return written


def ids_on_bus(rig: CaptureRig, ours: int) -> tuple[set[int], set[int]]:
    """(our ids, their ids) among the inserts on the bus, once our `ours` rows are all there."""
    def values(view: BusView) -> list[int]:
        return [int(python_of(e.after.columns[0].value)) for _, _, e in view.events
                if e.after.columns]

    view = rig.read(lambda v: len({i for i in values(v) if i < THEIRS}) >= ours, timeout=60)
    found = set(values(view))
    return {i for i in found if i < THEIRS}, {i for i in found if i >= THEIRS}


def assert_not_followed(rig: CaptureRig, capture: CaptureProcess, reason: str, ours: int
                        ) -> str:
    """Lost with `reason`, 503 on /health, and nothing of theirs on the bus."""
    message = assert_position_lost(rig, capture, reason, exit_code=None)
    status, body = http_health(capture)  # the process stays up to tell why, until stopped
    assert status == 503 and body == {"status": "unhealthy", "reason": message}
    assert capture.stop() == 1
    mine, theirs = ids_on_bus(rig, ours)
    assert mine == set(range(1, ours + 1))
    assert not theirs, f"{len(theirs)} of the other server's rows were published"
    print(f"\n{message}")
    return message


def checkpoint_lsn(rig: CaptureRig) -> int:
    checkpoint = rig.sink_checkpoint()
    assert checkpoint is not None
    return lsn_of(checkpoint.position.tx_seq)


def publish_without_checkpoint(rig: CaptureRig, dsn: str, first_id: int, rows: int = 20
                               ) -> int:
    """Write `rows` more of ours and wait until capture published them (an epoch covers
    them), without any checkpoint: returns the end LSN of the latest published one."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(first_id, first_id + rows):
            conn.execute("INSERT INTO items VALUES (%s, 'x')", (i,))
    view = rig.read(lambda v: any(e.after.columns and python_of(e.after.columns[0].value)
                                  == first_id + rows - 1 for _, _, e in v.events))
    last = max(e.position.tx_seq for _, _, e in view.events)
    return lsn_of(rig.wait_epoch(lambda e: e.position.tx_seq >= last).position.tx_seq)


@pytest.mark.matrix(
    scenario="capture restarted on the same PostgreSQL server",
    guarantee="continuity proven by re-reading the checkpoint's transaction: streaming goes on, nothing lost")
def test_a_restart_on_the_same_server_verifies_the_checkpoint_transaction(
        counted: Any, pg_db: str, capture_rig: Callable[..., CaptureRig]) -> None:
    setup_items(pg_db)
    rig = capture_rig(pg_db, "[public.items]")
    capture = stream_and_checkpoint(rig, pg_db, 1)
    checkpoint = rig.sink_checkpoint()
    assert checkpoint is not None and checkpoint.position.postgres.commit_ts_us > 0
    last_change = checkpoint.position.postgres.event_lsn
    assert 0 < last_change < lsn_of(checkpoint.position.tx_seq)
    deadline = time.monotonic() + 30  # the slot is confirmed up to the checkpoint
    while (slot := slot_row(pg_db, rig.slot)) is None or slot[1] != last_change:
        assert slot is None or slot[1] < last_change, "confirmed past the last change"
        assert time.monotonic() < deadline, f"slot {slot}, last change {last_change:X}"
        time.sleep(0.1)
    assert capture.stop() == 0
    capture = stream_and_checkpoint(rig, pg_db, 21)
    assert '"event": "re-read transaction verified"' in capture.log()
    assert f"xid {checkpoint.position.postgres.xid} committed at" in capture.log()
    mine, _ = ids_on_bus(rig, 40)
    assert mine == set(range(1, 41))


# behind: the copy's WAL ends before our checkpoint; behind_published: it ends past the
# checkpoint, before the latest transaction we published; past: past both, so its own
# transactions sit at our LSNs and only the re-read of the checkpoint's transaction tells.
    counted(outcome="the checkpoint transaction found again; every change once")


COPY_VARIANTS = ["behind", "behind_published", "past"]


@pytest.mark.matrix(
    scenario="an earlier copy of our PostgreSQL cluster (a restored backup) behind the address",
    guarantee="never followed: position lost, not a silent rewind")
@pytest.mark.parametrize("variant", COPY_VARIANTS)
def test_an_earlier_copy_of_the_cluster_is_not_followed(
        counted: Any, variant: str, make_pg_server: Callable[..., PostgresServer],
        capture_rig: Callable[..., CaptureRig], tmp_path: Path) -> None:
    server_a = make_pg_server()
    dsn = server_a.create_database("shop")
    setup_items(dsn)
    rig = capture_rig(dsn, "[public.items]")
    rig.start("--http-port", "0")
    assert stream_and_checkpoint(rig, dsn, 1).stop() == 0

    # a file-level copy of A as it is now: same cluster, timeline 1, our slot
    server_a.stop(keep_data=True)
    snapshot = RestoredServer.copy_of(server_a, tmp_path / "snapshot")
    server_a.start()
    stream_and_checkpoint(rig, dsn, 21)  # ours continue on A: checkpoint C
    checkpoint = checkpoint_lsn(rig)
    ours, published = 40, checkpoint
    if variant == "behind_published":
        published = publish_without_checkpoint(rig, dsn, 41)
        ours = 60
    assert rig.processes[-1].stop() == 0
    port = server_a.port
    server_a.stop()

    restored = RestoredServer(snapshot, port=port)
    with restored:
        copy_dsn = restored.dsn("shop")
        assert wal_lsn(copy_dsn) < checkpoint
        if variant == "behind":
            write_theirs(copy_dsn, rows=3)
            assert wal_lsn(copy_dsn) < checkpoint
        elif variant == "behind_published":
            write_theirs(copy_dsn, until_wal=checkpoint)
            assert checkpoint < wal_lsn(copy_dsn) < published
        else:
            write_theirs(copy_dsn, until_wal=published + 0x2000)
        wal = wal_lsn(copy_dsn)
        capture = rig.start("--http-port", "0")
        reason = {
            "behind": f"has written WAL only up to {lsn_to_str(wal)}, but our checkpoint is "
                      f"{lsn_to_str(checkpoint)} on timeline 1",
            "behind_published": f"has written WAL only up to {lsn_to_str(wal)}, but we already "
                                f"published a transaction ending at {lsn_to_str(published)}",
            "past": "",
        }[variant]
        message = assert_not_followed(rig, capture, reason, ours)
    if variant == "past":  # their transaction at our LSN, or one across it
        assert ("our checkpoint's transaction (xid " in message
                or f"spans our resume position {lsn_to_str(checkpoint)}" in message), message
        assert lsn_to_str(checkpoint) in message
    assert rig.control.client.list_reconcile_records(rig.source_id) == [], \
        "the same identity: nothing to reconcile, the position decides"
    counted(outcome=f"position lost ({variant})")


@pytest.mark.matrix(
    scenario="a PostgreSQL standby promoted with our checkpoint and slot",
    guarantee="failover followed: the same history, streaming goes on, nothing lost or repeated")
def test_a_promoted_standby_that_holds_our_checkpoint_and_slot_is_followed(
        counted: Any, make_pg_server: Callable[..., PostgresServer], capture_rig: Callable[..., CaptureRig],
        tmp_path: Path) -> None:
    """The one identity change that may continue: the same cluster on a new timeline whose
    history contains our checkpoint, with our slot (a file copy made into a standby keeps
    it, as PostgreSQL 17 slot synchronisation would). Reconciled with `adapt`; the re-read
    shows our checkpoint's transaction; the new primary's rows flow."""
    primary = make_pg_server()
    dsn = primary.create_database("shop")
    setup_items(dsn)
    rig = capture_rig(dsn, "[public.items]")
    assert stream_and_checkpoint(rig, dsn, 1).stop() == 0
    primary.stop(keep_data=True)
    snapshot = RestoredServer.copy_of(primary, tmp_path / "snapshot")
    primary.start()
    with RestoredServer(snapshot, standby_of=primary) as standby:
        stream_and_checkpoint(rig, dsn, 21)  # replicated to the standby, slot and all
        checkpoint = rig.sink_checkpoint()
        assert checkpoint is not None
        assert rig.processes[-1].stop() == 0
        caught_up = primary.execute("SELECT pg_current_wal_lsn()::text")[0][0]
        deadline = time.monotonic() + 30
        while standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [caught_up]
                              ) != [(True,)]:
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.1)
        port = primary.port
        primary.stop()
        standby.promote()
        deadline = time.monotonic() + 30
        while standby.execute("SELECT pg_is_in_recovery()") != [(False,)]:
            assert time.monotonic() < deadline, "the standby was not promoted"
            time.sleep(0.1)
        standby.stop(keep_data=True)
        with open(standby.datadir / "postgresql.conf", "a") as conf:
            conf.write(f"port = {port}\n")
        standby.port = port
        standby.start()
        assert slot_row(standby.dsn("shop"), rig.slot) is not None

        capture = rig.start("--http-port", "0")
        capture.wait_streaming()
        capture.wait_log('"event": "re-read transaction verified"')
        assert f"xid {checkpoint.position.postgres.xid} committed at" in capture.log()
        with psycopg.connect(standby.dsn("shop"), autocommit=True) as conn:
            for i in range(41, 51):
                conn.execute("INSERT INTO items VALUES (%s, 'x')", (i,))
        mine, theirs = ids_on_bus(rig, 50)
        assert mine == set(range(1, 51)) and not theirs
        assert http_health(capture)[0] == 200
        assert capture.stop() == 0
    (record,) = rig.control.client.list_reconcile_records(rig.source_id)
    assert record.decision == "adapt" and "timeline 1 -> 2" in record.drift[0]
    counted(outcome="followed: every change once, none of another history")


@pytest.mark.matrix(
    scenario="a PostgreSQL standby promoted before it received our checkpoint",
    guarantee="never followed: position lost")
def test_a_standby_promoted_before_it_received_our_checkpoint_is_not_followed(
        counted: Any, make_pg_server: Callable[..., PostgresServer],
        capture_rig: Callable[..., CaptureRig]) -> None:
    primary = make_pg_server()
    dsn = primary.create_database("shop")
    setup_items(dsn)
    rig = capture_rig(dsn, "[public.items]")
    assert stream_and_checkpoint(rig, dsn, 1).stop() == 0
    with StandbyServer(primary) as standby:
        caught_up = primary.execute("SELECT pg_current_wal_lsn()::text")[0][0]
        deadline = time.monotonic() + 30
        while standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [caught_up]
                              ) != [(True,)]:
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.1)
        standby.stop(keep_data=True)  # it falls behind: our next rows never reach it
        stream_and_checkpoint(rig, dsn, 21)
        checkpoint = checkpoint_lsn(rig)
        assert rig.processes[-1].stop() == 0
        port = primary.port
        primary.stop()

        standby.start()
        standby.promote()
        deadline = time.monotonic() + 30
        while standby.execute("SELECT pg_is_in_recovery()") != [(False,)]:
            assert time.monotonic() < deadline, "the standby was not promoted"
            time.sleep(0.1)
        standby.stop(keep_data=True)  # serve on the old primary's address
        with open(standby.datadir / "postgresql.conf", "a") as conf:
            conf.write(f"port = {port}\n")
        standby.port = port
        standby.start()
        write_theirs(standby.dsn("shop"), rows=5)
        capture = rig.start("--http-port", "0")
        message = assert_not_followed(rig, capture, "left timeline 1 at ", 40)
    assert f"before our checkpoint {lsn_to_str(checkpoint)} on that timeline" in message
    assert "timeline 2) left timeline 1 at " in message
    (record,) = rig.control.client.list_reconcile_records(rig.source_id)
    assert record.decision == "resnapshot" and "timeline 1 -> 2" in record.drift[0]
    counted(outcome="position lost: the standby lacks our checkpoint")


@pytest.mark.matrix(
    scenario="another PostgreSQL cluster with a slot of our name whose LSNs pass ours",
    guarantee="a different server is told by its identity, not by LSNs: position lost")
def test_another_cluster_with_our_slot_past_our_lsns_is_not_followed(
        counted: Any, make_pg_server: Callable[..., PostgresServer],
        capture_rig: Callable[..., CaptureRig]) -> None:
    server_a = make_pg_server()
    dsn = server_a.create_database("shop")
    setup_items(dsn)
    rig = capture_rig(dsn, "[public.items]")
    assert stream_and_checkpoint(rig, dsn, 1).stop() == 0
    checkpoint = checkpoint_lsn(rig)
    old_system = server_a.execute("SELECT system_identifier::text FROM pg_control_system()")

    # server B: its own cluster, the same database, table, slot name, and WAL past ours
    server_b = make_pg_server()
    dsn_b = server_b.create_database("shop")
    setup_items(dsn_b)
    server_b.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [rig.slot],
                     dbname="shop")
    write_theirs(dsn_b, until_wal=checkpoint + 0x4000)
    new_system = server_b.execute("SELECT system_identifier::text FROM pg_control_system()")
    assert new_system != old_system
    server_b.stop(keep_data=True)
    with open(server_b.datadir / "postgresql.conf", "a") as conf:
        conf.write(f"port = {server_a.port}\n")
    server_b.port = server_a.port
    server_a.stop()
    server_b.start()

    capture = rig.start("--http-port", "0")
    message = assert_not_followed(
        rig, capture, f"the server changed (system_identifier {old_system[0][0]} -> "
                      f"{new_system[0][0]}): this is a different cluster", 20)
    assert f"our checkpoint {lsn_to_str(checkpoint)} on timeline 1 was read from slot " \
           f"'{rig.slot}'" in message
    (record,) = rig.control.client.list_reconcile_records(rig.source_id)
    assert record.decision == "resnapshot"
    counted(outcome="position lost: a different cluster")


@pytest.mark.matrix(
    scenario="our slot made again before any checkpoint",
    guarantee="a gap is a lost position, even before the first checkpoint")
def test_a_slot_recreated_before_any_checkpoint_is_a_gap(
        counted: Any, pg_db: str, capture_rig: Callable[..., CaptureRig]) -> None:
    setup_items(pg_db)
    rig = capture_rig(pg_db, "[public.items]")
    capture = rig.start("--http-port", "0")
    capture.wait_streaming()
    published = publish_without_checkpoint(rig, pg_db, 1)
    assert rig.sink_checkpoint() is None
    assert capture.stop() == 0
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (rig.slot,))
        conn.execute("INSERT INTO items VALUES (%s, 'in the gap')", (THEIRS,))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (rig.slot,))
    recreated = slot_row(pg_db, rig.slot)
    assert recreated is not None
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (%s, 'after')", (THEIRS + 1,))
    capture = rig.start("--http-port", "0")
    assert_not_followed(
        rig, capture, f"replication slot '{rig.slot}' confirmed_flush_lsn "
                      f"{lsn_to_str(recreated[1])} is past the latest transaction we "
                      f"published, ending at {lsn_to_str(published)} on timeline 1", 20)
    counted(outcome="position lost: the slot was made again")


def capture_role(server: PostgresServer, dbname: str) -> str:
    """A role with only what capture needs (REPLICATION, CREATE for its publication, the
    table's owner); its DSN."""
    server.execute("CREATE ROLE cap LOGIN REPLICATION")
    server.execute(f"GRANT CREATE ON DATABASE {dbname} TO cap")
    server.execute("GRANT CREATE ON SCHEMA public TO cap", dbname=dbname)
    dsn = server.dsn(dbname, user="cap")
    setup_items(dsn)
    return dsn


@pytest.mark.matrix(
    scenario="the identity check fails (connection cut) on a changed PostgreSQL server",
    guarantee="uncertainty never adopts a changed server")
def test_a_failing_check_on_a_changed_server_never_adopts_it(
        counted: Any, make_pg_server: Callable[..., PostgresServer],
        capture_rig: Callable[..., CaptureRig]) -> None:
    primary = make_pg_server()
    primary.create_database("shop")
    dsn = capture_role(primary, "shop")
    rig = capture_rig(dsn, "[public.items]")
    assert stream_and_checkpoint(rig, dsn, 1).stop() == 0
    with StandbyServer(primary) as standby:
        caught_up = primary.execute("SELECT pg_current_wal_lsn()::text")[0][0]
        deadline = time.monotonic() + 30
        while standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [caught_up]
                              ) != [(True,)]:
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.1)
        port = primary.port
        primary.stop()
        standby.promote()
        deadline = time.monotonic() + 30
        while standby.execute("SELECT pg_is_in_recovery()") != [(False,)]:
            assert time.monotonic() < deadline, "the standby was not promoted"
            time.sleep(0.1)
        standby.execute("REVOKE EXECUTE ON FUNCTION pg_current_wal_lsn() FROM PUBLIC",
                        dbname="shop")
        standby.stop(keep_data=True)
        with open(standby.datadir / "postgresql.conf", "a") as conf:
            conf.write(f"port = {port}\n")
        standby.port = port
        standby.start()
        write_theirs(standby.dsn("shop"), rows=5)

        capture = rig.start()
        assert capture.wait_exit(60) == 1, capture.tail()
        health = rig.control.client.get_health(rig.source_id)
        assert health is not None and health.state == pb.HEALTH_FAILED, health
        assert ("cannot check the position on the server (system_identifier " in health.reason
                and "timeline 2), whose identity changed" in health.reason
                and "permission denied for function pg_current_wal_lsn" in health.reason
                and "it is not adopted until the check has run" in health.reason), health.reason
        assert rig.control.client.list_reconcile_records(rig.source_id) == [], \
            "no decision was taken: neither adapt nor anything else"

        # once the check can run, it decides: PostgreSQL 15 promoted it without our slot
        standby.execute("GRANT EXECUTE ON FUNCTION pg_current_wal_lsn() TO PUBLIC",
                        dbname="shop")
        capture = rig.start("--http-port", "0")
        assert_not_followed(rig, capture, f"replication slot '{rig.slot}' does not exist, but "
                                          "our checkpoint ", 20)
    (record,) = rig.control.client.list_reconcile_records(rig.source_id)
    assert record.decision == "resnapshot"
    counted(outcome="not adopted while the check failed")


@pytest.mark.matrix(
    scenario="the identity check fails on the known PostgreSQL server",
    guarantee="uncertainty warns and continues; the re-read of the checkpoint transaction decides")
def test_a_failing_check_on_a_known_server_continues_and_the_re_read_decides(
        counted: Any, make_pg_server: Callable[..., PostgresServer],
        capture_rig: Callable[..., CaptureRig]) -> None:
    server = make_pg_server()
    server.create_database("shop")
    dsn = capture_role(server, "shop")
    rig = capture_rig(dsn, "[public.items]")
    assert stream_and_checkpoint(rig, dsn, 1).stop() == 0
    server.execute("REVOKE EXECUTE ON FUNCTION pg_current_wal_lsn() FROM PUBLIC",
                   dbname="shop")

    # the check fails, capture continues (DESIGN 9), and the re-read verifies our checkpoint
    capture = stream_and_checkpoint(rig, dsn, 21)
    log = capture.log()
    assert '"event": "position check failed; continuing' in log
    assert '"event": "re-read transaction verified"' in log
    assert capture.stop() == 0
    checkpoint = rig.sink_checkpoint()
    assert checkpoint is not None

    # the slot is recreated meanwhile: the check that would say so still fails, the re-read
    # does not show our checkpoint's transaction, and nothing after it is published
    server.execute("SELECT pg_drop_replication_slot(%s)", [rig.slot], dbname="shop")
    write_theirs(dsn, rows=3)
    server.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [rig.slot],
                   dbname="shop")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (%s, 'theirs')", (THEIRS + 100,))
    capture = rig.start("--http-port", "0")
    message = assert_not_followed(rig, capture, "our checkpoint's transaction (xid "
                                                f"{checkpoint.position.postgres.xid} ", 40)
    assert "was not sent again: the next transaction it sent is xid " in message
    assert "the slot was recreated or advanced past it" in message
    counted(outcome="continued; the re-read confirmed the history")


