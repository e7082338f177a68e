"""Sink fixtures and helpers (plugin: `tests.fix_sinks`): a deterministic change source,
servers with passwords, noida-db's Kafka, and the batch driver the kill tests run.

The driver (`python -m tests.fix_sinks drive ...`) uses a sink as the delivery runtime
does: `open()`, then `write(batch, commit)` per batch, and commits nothing else; so a
process killed at any point restarts from the first batch and only the sink's own
checkpoint stops a replay from duplicating. With `--control-file` it also keeps a
runtime-style checkpoint after every acknowledged batch (what the control service
would hold) and resumes from it, which is the at-least-once situation.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from tailrace.config import SinkSpec
from tailrace.devservers import NatsServer, PostgresServer, RedisServer
from tailrace.devservers.noida import NoidaKafka
from tailrace.events import (
    ChangeEvent,
    Column,
    Op,
    Position,
    PostgresPosition,
    Row,
    event_id,
    idempotency_key,
    value_of,
)

TENANT, SOURCE, DATABASE = "acme", "src1", "shop"
REDIS_PASSWORD = "s3cret-redis"
NATS_USER, NATS_PASSWORD = "tailrace", "s3cret-nats"
PG_USER, PG_PASSWORD = "sinkuser", "s3cret-pg"


# -- a deterministic source --------------------------------------------------------------

def _column(name: str, type_: str, value: Any) -> Column:
    return Column(name=name, type=type_, value=value_of(value))


def _row(key: int, version: int, tx: int) -> Row:
    return Row(columns=[
        _column("id", "integer", key),
        _column("amount", "numeric(12,2)", Decimal(f"{key}.{version % 100:02d}")),
        _column("note", "text", f"k{key} v{version}"),
        _column("changed_at", "timestamp with time zone",
                dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=tx)),
        _column("version", "bigint", version),
    ])


def source_events(count: int, *, seed: int = 7, tables: Sequence[str] = ("orders", "items"),
                  keys: int = 300, max_tx: int = 8, first_tx: int = 1) -> list[ChangeEvent]:
    """`count` events in transactions of 1..`max_tx` rows over `tables`, PostgreSQL-shaped:
    updates carry no before image, deletes only the key. Same arguments, same events."""
    rng = random.Random(seed)
    live: dict[tuple[str, int], int] = {}
    events: list[ChangeEvent] = []
    tx = first_tx
    while len(events) < count:
        size = min(rng.randint(1, max_tx), count - len(events))
        commit_lsn = 0x1000000 + tx * 0x100
        ts_us = 1_700_000_000_000_000 + tx * 1000
        for index in range(size):
            table = rng.choice(tables)
            key = rng.randrange(keys)
            version = live.get((table, key))
            if version is None:
                op, version = Op.OP_INSERT, 1
            elif rng.random() < 0.25:
                op = Op.OP_DELETE
            else:
                op, version = Op.OP_UPDATE, version + 1
            after = _row(key, version, tx) if op != Op.OP_DELETE else Row()
            before = Row(columns=[_column("id", "integer", key)]) if op == Op.OP_DELETE else Row()
            if op == Op.OP_DELETE:
                live.pop((table, key))
            else:
                live[(table, key)] = version
            eid = event_id(SOURCE, f"{commit_lsn:X}", index, ts_us // 1000)
            events.append(ChangeEvent(
                id=eid, source_id=SOURCE, tenant=TENANT, database=DATABASE, schema="public",
                table=table, op=op, before=before, after=after, key_columns=["id"],
                tx_id=str(5000 + tx), tx_index=index, tx_size=size, tx_end=index == size - 1,
                position=Position(tx_seq=commit_lsn, event_index=index, postgres=PostgresPosition(
                    commit_lsn=commit_lsn, event_lsn=commit_lsn - 0x80 + index, timeline=1)),
                schema_version=f"fp-{table}", ts_source_micros=ts_us, ts_captured_micros=ts_us + 5,
                idempotency_key=idempotency_key(TENANT, DATABASE, f"public.{table}",
                                                str(5000 + tx), eid),
            ))
        tx += 1
    return events


def batches_of(events: Sequence[ChangeEvent], max_events: int) -> list[list[ChangeEvent]]:
    """Whole transactions per batch, at least `max_events` unless the events run out."""
    out: list[list[ChangeEvent]] = [[]]
    for event in events:
        out[-1].append(event)
        if event.tx_end and len(out[-1]) >= max_events:
            out.append([])
    return [b for b in out if b]


def save_events(path: Path, events: Sequence[ChangeEvent]) -> None:
    """Length-prefixed `ChangeEvent`s: the driver reads them back much faster than it makes them."""
    with open(path, "wb") as out:
        for event in events:
            data = event.SerializeToString()
            out.write(len(data).to_bytes(4, "big") + data)


def load_events(path: Path) -> list[ChangeEvent]:
    data, events, at = path.read_bytes(), [], 0
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        events.append(ChangeEvent.FromString(data[at + 4:at + 4 + size]))
        at += 4 + size
    return events


def final_state(events: Sequence[ChangeEvent]) -> dict[tuple[str, int], dict[str, Any]]:
    """What a table replica must hold after `events`: (table, id) -> JSON-ish row."""
    from tailrace.events import event_to_json_dict

    state: dict[tuple[str, int], dict[str, Any]] = {}
    for event in events:
        doc = event_to_json_dict(event)
        if event.op == Op.OP_DELETE:
            state.pop((event.table, doc["before"]["id"]), None)
        else:
            state[(event.table, doc["after"]["id"])] = doc["after"]
    return state


def read_kafka(brokers: str, topics: Sequence[str], isolation: str = "read_committed",
               timeout: float = 60) -> list[Any]:
    """Every message of `topics` (partition 0) from the beginning to the end, as a consumer
    with `isolation` sees them; fails if a topic was not read to its end in `timeout`."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition  # type: ignore[attr-defined]

    consumer = Consumer({"bootstrap.servers": brokers, "group.id": f"g{uuid.uuid4().hex[:6]}",
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "enable.auto.commit": False, "fetch.max.bytes": 50_000_000,
                         # noida-db answers a fetch with all it holds, whatever the limit
                         "receive.message.max.bytes": 1_000_000_000})
    consumer.assign([TopicPartition(t, 0, 0) for t in topics])
    out: list[Any] = []
    ended: set[str] = set()
    deadline = time.monotonic() + timeout
    while len(ended) < len(topics) and time.monotonic() < deadline:
        for msg in consumer.consume(5000, 0.5):
            if msg.error():
                ended.add(msg.topic())
            else:
                out.append(msg)
    consumer.close()
    assert len(ended) == len(topics), f"topics {sorted(set(topics) - ended)} not read to the end"
    return out


def sink_spec(**fields: Any) -> Any:
    return TypeAdapter(SinkSpec).validate_python(fields)


# -- servers ------------------------------------------------------------------------------

class PasswordRedis(RedisServer):
    """Redis with `requirepass`."""

    def _command(self) -> list[str]:
        return [*super()._command(), "--requirepass", REDIS_PASSWORD]

    def _wait_ready(self, proc: Any) -> None:
        import redis

        from tailrace.devservers._process import wait_until

        def ping() -> None:
            with redis.Redis(self.host, self.port, password=REDIS_PASSWORD,
                             socket_timeout=2) as client:
                client.ping()

        wait_until(ping, proc=proc, log_path=self.log_path, what="redis", timeout=30)


class PasswordNats(NatsServer):
    """nats-server -js with a user and password."""

    def _command(self) -> list[str]:
        return [*super()._command(), "--user", NATS_USER, "--pass", NATS_PASSWORD]


class PasswordPostgres(PostgresServer):
    """PostgreSQL where `sinkuser` must give its password (scram) over TCP."""

    def _prepare(self, directory: Path) -> None:
        super()._prepare(directory)
        hba = self.datadir / "pg_hba.conf"
        hba.write_text(f"host all {PG_USER} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())

    def start(self) -> PasswordPostgres:
        super().start()
        self.execute(f"DO $$ BEGIN CREATE ROLE {PG_USER} LOGIN SUPERUSER PASSWORD "
                     f"'{PG_PASSWORD}'; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        return self

    def password_dsn(self, password: str = PG_PASSWORD, dbname: str = "postgres") -> str:
        return f"postgresql://{PG_USER}:{password}@{self.host}:{self.port}/{dbname}"


@pytest.fixture(scope="session")
def noida_kafka() -> Iterator[NoidaKafka]:
    """A broker that filters aborted transactions and reports fencing (shared)."""
    broker = NoidaKafka().start()
    try:
        yield broker
    finally:
        gc.collect()  # clients left in reference cycles would retry the dead broker, loudly
        broker.kill()  # a graceful stop first saves every topic to disk: seconds, for nothing
        broker.stop()


@pytest.fixture
def make_noida_kafka() -> Iterator[Callable[..., NoidaKafka]]:
    """An own broker for a test that stops or restarts it."""
    made: list[NoidaKafka] = []

    def make(**kwargs: Any) -> NoidaKafka:
        made.append(NoidaKafka(**kwargs).start())
        return made[-1]

    yield make
    gc.collect()
    for broker in made:
        broker.kill()
        broker.stop()


@pytest.fixture(scope="session")
def password_redis() -> Iterator[PasswordRedis]:
    with PasswordRedis() as server:
        yield server


@pytest.fixture(scope="session")
def password_nats() -> Iterator[PasswordNats]:
    with PasswordNats() as server:
        yield server


@pytest.fixture(scope="session")
def password_pg() -> Iterator[PasswordPostgres]:
    with PasswordPostgres() as server:
        yield server


@pytest.fixture
def make_nats_server() -> Iterator[Callable[..., NatsServer]]:
    with ExitStack() as stack:
        yield lambda **kw: stack.enter_context(NatsServer(**kw))


# -- the kill-test driver -------------------------------------------------------------------

def drive(spec_json: str, pipeline: str, events_file: Path, batch: int,
          control_file: Path | None, commit_delay_s: float, ack_delay_s: float,
          hold_at_end: bool = False) -> None:
    """Write the source's batches through the sink; print one line per acknowledged batch.

    `hold_at_end`: after the last batch print `finished` and wait to be killed, so a test
    that kills by progress always gets its kill, however fast this run was.

    Fault injection widens the windows a kill should hit: `commit_delay_s` holds every Kafka
    transaction open (produced, not committed) that long; `ack_delay_s` waits between the
    sink's acknowledgement and the runtime-style checkpoint.
    """
    from tailrace.errors import RetryableError
    from tailrace_services.delivery.sinks import build_sink
    from tailrace_services.delivery.sinks.base import BatchCommit

    if commit_delay_s:
        from confluent_kafka import Producer  # type: ignore[attr-defined]

        from tailrace_services.delivery.sinks import _kafka_tx

        class SlowCommitProducer(Producer):  # type: ignore[misc]
            def commit_transaction(self, *args: Any) -> None:
                self.flush(10)  # the batch is on the broker, inside the open transaction
                time.sleep(commit_delay_s)
                super().commit_transaction(*args)

        _kafka_tx.Producer = SlowCommitProducer  # type: ignore[misc]

    sink = build_sink(sink_spec(**json.loads(spec_json)), pipeline=pipeline)
    sink.open()
    done = -1
    if control_file is not None and control_file.exists():
        done = int(control_file.read_text() or -1)
    print(f"ready stored={sink.stored_position() is not None} resume_after={done}", flush=True)
    for n, todo in enumerate(batches_of(load_events(events_file), batch)):
        if n <= done:
            continue
        commit = BatchCommit(pipeline=pipeline, source_id=SOURCE, sink_id=sink.id,
                             position=todo[-1].position)
        for attempt in range(20):  # the runtime's retry loop, simplified
            try:
                sink.write(todo, commit)
                break
            except Exception as e:
                if not isinstance(e, RetryableError) or attempt == 19:
                    raise
                time.sleep(0.2)
        time.sleep(ack_delay_s)
        if control_file is not None:
            tmp = control_file.with_suffix(".tmp")
            tmp.write_text(str(n))
            tmp.replace(control_file)
        print(f"batch {n} acked", flush=True)
    if hold_at_end:
        print("finished; holding until killed", flush=True)
        while True:
            time.sleep(3600)
    sink.close()
    print("finished", flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fix_sinks")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("drive")
    d.add_argument("--spec", required=True, help="the sink spec as JSON")
    d.add_argument("--pipeline", default="chaos")
    d.add_argument("--events-file", type=Path, required=True, help="made by save_events()")
    d.add_argument("--batch", type=int, default=500)
    d.add_argument("--control-file", type=Path)
    d.add_argument("--commit-delay", type=float, default=0.0)
    d.add_argument("--ack-delay", type=float, default=0.0)
    d.add_argument("--hold-at-end", action="store_true",
                   help="after the last batch, wait to be killed instead of exiting")
    args = parser.parse_args(argv)
    drive(args.spec, args.pipeline, args.events_file, args.batch, args.control_file,
          args.commit_delay, args.ack_delay, args.hold_at_end)


if __name__ == "__main__":
    main(sys.argv[1:])
