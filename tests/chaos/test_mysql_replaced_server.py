"""A different MariaDB on the same address, reusing our GTID numbers, is never followed.

MariaDB hands out `server_id` 1 and domain 0 on every fresh server, so a replacement's
GTIDs `0-1-N` reuse the numbers our checkpoint holds. Capture must stop with
`position lost` (health 503) and publish none of its changes, whatever the new
server's binlog looks like (issue 11.2); a routine PURGE on the same server is not a
change of identity.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tailrace.devservers import KafkaBroker, MariaDBServer, free_port
from tailrace.events import Op, python_of
from tailrace.proto.control_pb2 import HEALTH_POSITION_LOST, HEALTH_RUNNING
from tailrace_services.cli.supervisor import service_argv
from tests.fix_capture import Control
from tests.fix_mysql import BusReader, CaptureThread, alive, events, lost, purge_binlogs_to

pytestmark = pytest.mark.chaos

OURS = 20  # transactions captured from the first server


def _source(server: MariaDBServer) -> None:
    server.execute("CREATE DATABASE shop")
    server.execute("CREATE TABLE shop.t (id int PRIMARY KEY, v varchar(20) NOT NULL)")


def _write(server: MariaDBServer, first: int, count: int, tag: str,
           flush_every: int = 0) -> None:
    for i in range(first, first + count):
        server.execute("INSERT INTO shop.t VALUES (%s, %s)", (i, tag))
        if flush_every and i % flush_every == 0:
            server.execute("FLUSH BINARY LOGS")


def _values(reader: BusReader) -> list[tuple[int, str]]:
    return [(python_of(e.after.columns[0].value), python_of(e.after.columns[1].value))
            for e in events(reader.records) if e.op == Op.OP_INSERT]


def _capture_first(spec: Path, brokers: str) -> BusReader:
    """Capture the first server's OURS inserts, then stop."""
    with CaptureThread(spec) as cap:
        reader = BusReader(brokers, cap.spec.bus_topic)
        reader.read_until(lambda rs: len(_values(reader)) >= OURS, timeout=60,
                          alive=alive(cap))
    return reader


def _replace(first: MariaDBServer, make: Callable[..., MariaDBServer],
             extra_args: tuple[str, ...] = ()) -> MariaDBServer:
    """Stop `first`; start a fresh server (new data directory) on its port, server_id 1."""
    port = first.port
    created = first.execute("SELECT UNIX_TIMESTAMP(CREATE_TIME) FROM information_schema.TABLES "
                            "WHERE TABLE_SCHEMA = 'mysql' AND TABLE_NAME = 'global_priv'")[0][0]
    first.stop()
    while int(time.time()) <= created:  # data directories made in one second look alike
        time.sleep(0.05)
    new = make(port=port, server_id=1, extra_args=list(extra_args))
    _source(new)
    return new


# (new server's binlog basename, its transactions after CREATE DATABASE/TABLE, FLUSH every,
#  the reason's words)
VARIANTS = {
    "behind": ((), 5, 0, "the server is behind our checkpoint; this is a different server"),
    "past": ((), 150, 0, "has other contents than ours; this is a different server"),
    "past-first-binlog-purged": ((), 150, 10, "its binlogs were purged past it"),
    "other-basename": (("--log-bin=binlog",), 150, 0,
                       "has other contents than ours; this is a different server"),
}


@pytest.mark.matrix(
    scenario="MariaDB replaced on the same address (RESET MASTER, a fresh server, a server behind or past "
             "us)",
    guarantee="a lost position stops loudly with the reason, health position_lost, never adapt; none of the "
              "new server's changes published")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_replaced_server_on_the_same_address_is_a_lost_position(
        counted: Any, variant: str, mysql_spec: Callable[..., Path],
        make_mariadb_server: Callable[..., MariaDBServer], kafka_broker: KafkaBroker,
        control: Control) -> None:
    extra, count, flush_every, words = VARIANTS[variant]
    first = make_mariadb_server(server_id=1)
    _source(first)
    _write(first, 0, OURS, "old")
    name = f"replaced-{variant}"
    reader = _capture_first(mysql_spec(first, ["shop.t"], name=name), kafka_broker.bootstrap)
    checkpoint = first.execute("SELECT @@gtid_binlog_pos")[0][0]

    new = _replace(first, make_mariadb_server, extra)
    _write(new, 0, count, "new", flush_every)
    if flush_every:
        purge_binlogs_to(new, new.execute("SHOW BINARY LOGS")[-1][0])
    theirs = new.execute("SELECT @@gtid_binlog_pos")[0][0]

    cap = CaptureThread(mysql_spec(new, ["shop.t"], name=name)).start()
    err = lost(cap)
    cap.stop()
    reason = err.reason
    print(f"\n{variant}: ours {checkpoint}, theirs {theirs}: {err}")
    assert words in reason, reason
    assert checkpoint in reason or variant == "past" or variant == "other-basename", reason
    assert "  " not in reason and " at  " not in reason, "no blank where a position belongs"
    if variant == "behind":
        assert f"binlog ends at {theirs} but our checkpoint is at {checkpoint}" in reason
    if variant != "behind":
        assert "this is a different server (its data directory was created at" in reason
    assert "RESET MASTER" not in reason
    health = control.client.get_health(f"src-{name}")
    assert health is not None and health.state == HEALTH_POSITION_LOST
    assert health.reason == str(err)
    records = control.client.list_reconcile_records(f"src-{name}")
    assert [r.decision for r in records] == ["resnapshot"], "never adapt"
    reader.poll(2.0)
    values = _values(reader)
    assert values == [(i, "old") for i in range(OURS)], "none of the new server's changes"
    counted(changes_in=OURS, changes_out=len(values),
            outcome=f"position lost ({variant}); none of the new server's changes published")


@pytest.mark.matrix(
    scenario="the capture process on a replaced MariaDB server",
    guarantee="/health answers 503 naming the lost position")
def test_the_http_health_of_a_capture_on_a_replaced_server_is_503(
        counted: Any, tmp_path: Path, mysql_spec: Callable[..., Path],
        make_mariadb_server: Callable[..., MariaDBServer], kafka_broker: KafkaBroker) -> None:
    first = make_mariadb_server(server_id=1)
    _source(first)
    _write(first, 0, OURS, "old")
    spec = mysql_spec(first, ["shop.t"], name="replaced-http")
    _capture_first(spec, kafka_broker.bootstrap).close()
    new = _replace(first, make_mariadb_server)
    _write(new, 0, 150, "new")
    port = free_port()
    log = (tmp_path / "capture.log").open("wb")
    proc = subprocess.Popen(service_argv("tailrace-capture", str(spec), "--http-port", str(port)),
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "capture.log").read_text()[-2000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            except urllib.error.HTTPError as e:
                body = json.loads(e.read())
                assert e.code == 503 and body["reason"].startswith("position lost: this "
                                                                   "server's history does not")
                break
            except OSError:
                pass
            assert time.monotonic() < deadline, "/health never said 503"
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
    counted(outcome="/health 503: position lost")


@pytest.mark.matrix(
    scenario="binlogs already consumed purged on the same MariaDB server",
    guarantee="no false alarm: the same server goes on, health running, no reconcile record")
def test_purging_consumed_binlogs_on_the_same_server_is_no_identity_change(
        counted: Any, mysql_spec: Callable[..., Path], make_mariadb_server: Callable[..., MariaDBServer],
        kafka_broker: KafkaBroker, control: Control) -> None:
    server = make_mariadb_server(server_id=1)
    _source(server)
    _write(server, 0, OURS, "a", flush_every=5)
    spec = mysql_spec(server, ["shop.t"], name="purged-same")
    reader = _capture_first(spec, kafka_broker.bootstrap)
    server.execute("FLUSH BINARY LOGS")  # the checkpoint's transaction is in an older file now
    purge_binlogs_to(server, server.execute("SHOW BINARY LOGS")[-1][0])
    with CaptureThread(spec) as cap:
        cap.wait_streaming()
        _write(server, OURS, 10, "b")
        reader.read_until(lambda rs: len(_values(reader)) >= OURS + 10, timeout=60,
                          alive=alive(cap))
        health = control.client.get_health("src-purged-same")
        assert health is not None and health.state == HEALTH_RUNNING
    assert sorted(_values(reader)) == [(i, "a") for i in range(OURS)] + [
        (i, "b") for i in range(OURS, OURS + 10)]
    assert control.client.list_reconcile_records("src-purged-same") == []
    reader.close()
    counted(outcome="streaming went on; every change once; no reconcile record")


