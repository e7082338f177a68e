"""kill -9 of a process writing batches through a sink, ten times at random points.

The driver (`tests.fix_sinks drive`) uses the sink as the runtime does and commits no
checkpoint of its own, so every restart re-sends the source from its first batch: only
the checkpoint an exactly-once sink stores with the data keeps the result free of
duplicates. The at-least-once Kafka run keeps a runtime-style checkpoint after each
acknowledged batch instead, and shows (prints) the duplicates that tier allows.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from tailrace.devservers.noida import NoidaKafka
from tailrace.events import ChangeEvent
from tests.fix_sinks import final_state, read_kafka, save_events, source_events

pytestmark = pytest.mark.chaos

REPO = Path(__file__).resolve().parents[2]
KILLS = 10


@dataclass
class KillRun:
    kills: int
    acked_before_kill: list[int]
    output: str


def run_with_kills(spec: dict[str, Any], events_file: Path, workdir: Path, *, seed: int,
                   batch: int = 500, control: bool = False, pipeline: str = "chaos",
                   faults: tuple[str, ...] = (), window_s: float = 0.15) -> KillRun:
    """Start the driver and SIGKILL it `KILLS` times, each time a little further on (after
    0-2 batches past the furthest acknowledged so far, plus a random 0-`window_s`, about
    a batch's write time, so that a kill lands mid-write as often as not); then let it
    finish. Every killed run holds at its end instead of exiting, so each of the `KILLS`
    kills happens whatever the timing: a fast run is killed holding, never missed."""
    rng = random.Random(seed)
    cmd = [sys.executable, "-m", "tests.fix_sinks", "drive", "--spec", json.dumps(spec),
           "--pipeline", pipeline, "--events-file", str(events_file), "--batch", str(batch)]
    if control:
        cmd += ["--control-file", str(workdir / "control.ckpt")]
    cmd += faults
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    kills, acked, furthest = 0, [], -1
    for attempt in range(KILLS + 1):
        out = workdir / f"driver-{attempt}.out"
        argv = cmd if attempt == KILLS else [*cmd, "--hold-at-end"]
        with open(out, "w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                    env=env)
        if attempt == KILLS:  # the last run goes to the end
            assert proc.wait(timeout=240) == 0, out.read_text()[-3000:]
            assert "finished" in out.read_text()
            break
        target = furthest + rng.randint(0, 2)
        deadline = time.monotonic() + 120
        while _last_acked(out) < target and "finished" not in out.read_text():
            assert proc.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() < deadline, "the driver made no progress"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, window_s))
        assert proc.poll() is None, out.read_text()[-3000:]  # it holds at its end
        proc.kill()  # SIGKILL: no cleanup, no abort, mid-write as likely as not
        kills += 1
        proc.wait()
        furthest = max(furthest, _last_acked(out))
        acked.append(furthest)
    return KillRun(kills, acked, out.read_text())


def _last_acked(out: Path) -> int:
    lines = [ln for ln in out.read_text().splitlines() if ln.startswith("batch ")]
    return int(lines[-1].split()[1]) if lines else -1


@pytest.fixture(scope="module")
def events_20k(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[ChangeEvent], Path]:
    events = source_events(20_000, seed=11, max_tx=12)
    path = tmp_path_factory.mktemp("src") / "events.bin"
    save_events(path, events)
    return events, path


@pytest.fixture(scope="module")
def events_50k(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[ChangeEvent], Path]:
    events = source_events(50_000, seed=13, max_tx=12)
    path = tmp_path_factory.mktemp("src") / "events.bin"
    save_events(path, events)
    return events, path


def report(name: str, run: KillRun, **figures: Any) -> None:
    extra = " ".join(f"{k}={v}" for k, v in figures.items())
    print(f"\n[{name}] kills={run.kills} furthest batch acked at each kill={run.acked_before_kill} "
          f"{extra}")


# -- Redis ---------------------------------------------------------------------------------


@pytest.mark.matrix(
    scenario="the delivery worker killed -9 ten times by progress (acknowledged batches), Redis sink",
    guarantee="exactly once on Redis: a batch and its checkpoint in one MULTI/EXEC; every event once, in "
              "source order")
def test_redis_exactly_once_through_ten_kills(
        counted: Any, redis_server: Any, events_20k: Any, tmp_path: Path) -> None:
    events, path = events_20k
    prefix = f"k{uuid.uuid4().hex[:8]}"
    spec = {"id": "r1", "type": "redis", "url": redis_server.url, "stream": prefix + ".{table}"}
    run = run_with_kills(spec, path, tmp_path, seed=1, pipeline=prefix)
    client = redis.Redis.from_url(redis_server.url)
    for table in ("orders", "items"):
        got = [f[b"id"].decode() for _, f in client.xrange(f"{prefix}.{table}")]
        assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicate entries"
        assert got == [e.id for e in events if e.table == table]  # all, once, in source order
    counted(changes_in=len(events), changes_out=len(events),
            outcome=f"{run.kills} kills")
    report("redis", run, entries=len(events))
    assert run.kills == KILLS


# -- PostgreSQL ------------------------------------------------------------------------------


@pytest.mark.matrix(
    scenario="the delivery worker killed -9 ten times by progress, PostgreSQL sink",
    guarantee="exactly once on PostgreSQL: rows and checkpoint in one transaction; each row change applied "
              "once (audit trigger)")
def test_postgres_exactly_once_through_ten_kills(
        counted: Any, pg_db: str, events_20k: Any, tmp_path: Path) -> None:
    events, path = events_20k
    with psycopg.connect(pg_db, autocommit=True) as conn:  # count every applied row change
        conn.execute("CREATE TABLE audit (n bigserial, op text)")
        conn.execute("CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                     "INSERT INTO audit (op) VALUES (TG_OP); RETURN NULL; END $$")
        for table in ("orders", "items"):
            conn.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, amount numeric(12,2), "
                         "note text, changed_at timestamptz, version bigint)")
            conn.execute(f"CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON {table} "
                         "FOR EACH ROW EXECUTE FUNCTION audit()")
    spec = {"id": "pg1", "type": "postgres", "dsn": pg_db}
    run = run_with_kills(spec, path, tmp_path, seed=2)
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT 'orders', id, amount::text, note, version FROM orders UNION "
                            "ALL SELECT 'items', id, amount::text, note, version FROM items"
                            ).fetchall()
        applied = conn.execute("SELECT count(*) FROM audit").fetchone()[0]  # type: ignore[index]
    expected = {k: (v["amount"], v["note"], v["version"]) for k, v in final_state(events).items()}
    assert {(r[0], r[1]): (r[2], r[3], r[4]) for r in rows} == expected
    assert applied == len(events), f"{applied - len(events)} row changes applied twice"
    counted(changes_in=len(events), changes_out=applied, duplicates=applied - len(events),
            outcome=f"{run.kills} kills")
    report("postgres", run, rows=len(rows), applied=applied)
    assert run.kills == KILLS


# -- Kafka -----------------------------------------------------------------------------------

def read_all(brokers: str, prefix: str, isolation: str) -> list[tuple[str, str]]:
    return [(m.topic().rsplit(".", 1)[1], dict(m.headers())["tailrace-event-id"].decode())
            for m in read_kafka(brokers, [f"{prefix}.orders", f"{prefix}.items"], isolation)]


@pytest.mark.matrix(
    scenario="the delivery worker killed -9 ten times by progress, most kills inside an open Kafka "
             "transaction",
    guarantee="exactly once on Kafka: read_committed holds every event once, in order, whole transactions; "
              "aborted ones invisible")
def test_kafka_exactly_once_through_ten_kills(
        counted: Any, noida_kafka: Any, events_50k: Any, tmp_path: Path) -> None:
    events, path = events_50k
    prefix = f"k{uuid.uuid4().hex[:8]}"
    spec = {"id": "k1", "type": "kafka", "brokers": noida_kafka.bootstrap,
            "topic": prefix + ".{table}", "exactly_once": True}
    run = run_with_kills(spec, path, tmp_path, seed=3, batch=2000, pipeline=prefix,
                         faults=("--commit-delay", "0.3"),  # most kills hit an open transaction
                         window_s=0.8)
    committed = read_all(noida_kafka.bootstrap, prefix, "read_committed")
    for table in ("orders", "items"):
        got = [i for t, i in committed if t == table]
        assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicates"
        # every event once, per key (and per table) in source order; whole transactions
        assert got == [e.id for e in events if e.table == table]
    counted(changes_in=len(events), changes_out=len(committed),
            duplicates=len(committed) - len({i for _, i in committed}), outcome=f"{run.kills} kills")
    uncommitted = read_all(noida_kafka.bootstrap, prefix, "read_uncommitted")
    report("kafka exactly-once", run, read_committed=len(committed),
           read_uncommitted_incl_aborted=len(uncommitted))
    assert run.kills == KILLS
    assert len(uncommitted) > len(committed), "no kill hit an open transaction"


@pytest.mark.matrix(
    scenario="the delivery worker killed -9 ten times by progress, Kafka at-least-once",
    guarantee="at-least-once: nothing lost; the duplicates it allows, counted")
def test_kafka_at_least_once_shows_the_duplicates_it_allows(
        counted: Any, noida_kafka: Any, events_50k: Any, tmp_path: Path) -> None:
    events, path = events_50k
    prefix = f"k{uuid.uuid4().hex[:8]}"
    spec = {"id": "k1", "type": "kafka", "brokers": noida_kafka.bootstrap,
            "topic": prefix + ".{table}", "exactly_once": False}
    run = run_with_kills(spec, path, tmp_path, seed=3, batch=2000, control=True,
                         pipeline=prefix, faults=("--ack-delay", "0.2"), window_s=0.8)
    got = read_all(noida_kafka.bootstrap, prefix, "read_uncommitted")
    counts = Counter(i for _, i in got)
    assert set(counts) == {e.id for e in events}  # nothing lost
    duplicates = sum(n - 1 for n in counts.values())
    counted(changes_in=len(events), changes_out=len(got), duplicates=duplicates,
            outcome=f"{run.kills} kills")
    report("kafka at-least-once", run, messages=len(got), events=len(events),
           duplicates=duplicates)


@pytest.mark.matrix(
    scenario="the Kafka sink's broker stops answering for 15 s (SIGSTOP) while a transaction "
             "is open, then answers again",
    guarantee="exactly once on Kafka through a partition inside a transaction: read_committed "
              "holds every event once, in source order")
def test_kafka_exactly_once_through_a_broker_that_stops_answering_mid_transaction(
        counted: Any, events_20k: Any, tmp_path: Path) -> None:
    """What a network partition looks like to the producer: its connections stay open and
    nothing answers. (A proxy cannot sit in front of noida-db, which advertises only its own
    port.) The freeze comes by progress: after 5 acknowledged batches, inside the next
    batch's transaction, which the driver holds open 0.5 s before committing."""
    events, path = events_20k
    prefix = f"p{uuid.uuid4().hex[:8]}"
    with NoidaKafka() as broker:
        spec = {"id": "k1", "type": "kafka", "brokers": broker.bootstrap,
                "topic": prefix + ".{table}", "exactly_once": True}
        out = tmp_path / "driver.out"
        cmd = [sys.executable, "-m", "tests.fix_sinks", "drive", "--spec", json.dumps(spec),
               "--pipeline", prefix, "--events-file", str(path), "--batch", "1000",
               "--commit-delay", "0.5"]
        with open(out, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                    env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            deadline = time.monotonic() + 120
            while _last_acked(out) < 5:
                assert proc.poll() is None, out.read_text()[-3000:]
                assert time.monotonic() < deadline, "the driver made no progress"
                time.sleep(0.005)
            time.sleep(0.2)  # batch 6's transaction: produced, not committed
            frozen_at = _last_acked(out)
            assert broker.pid is not None
            os.kill(broker.pid, signal.SIGSTOP)
            time.sleep(15)
            during = _last_acked(out)
            os.kill(broker.pid, signal.SIGCONT)
            assert proc.wait(timeout=300) == 0, out.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
        committed = read_all(broker.bootstrap, prefix, "read_committed")
    ids = [i for _, i in committed]
    counted(changes_in=len(events), changes_out=len(ids), duplicates=len(ids) - len(set(ids)),
            order_violations=sum(
                [i for t, i in committed if t == table] != [e.id for e in events
                                                              if e.table == table]
                for table in ("orders", "items")),
            outcome=f"frozen after batch {frozen_at}; acknowledged meanwhile: up to {during}")
    assert during == frozen_at, "no batch acknowledged while the broker did not answer"
    for table in ("orders", "items"):
        got = [i for t, i in committed if t == table]
        assert got == [e.id for e in events if e.table == table], "once each, in order"
    print(f"\nKafka broker frozen 15 s inside batch {frozen_at + 1}'s open transaction: "
          f"{len(committed)} events read_committed for {len(events)}, each once, in order")
