"""Restarts mid-workload (issue 16, item 3), each counted: every change in Redis once, per
key in source order, and no other process died.

- A sink's server killed -9 and started again on its own data: Redis with its append-only
  file fsynced at every write. The Redis sink keeps its checkpoint beside the entries, in
  the same MULTI/EXEC, so what the restarted server holds and its checkpoint agree.
- The control service killed -9 and started again on its SQLite file: capture and delivery
  wait for it (their `/ready` names it meanwhile) and go on.
- An exactly-once sink's server started empty (Redis without persistence killed -9,
  noida-db's Kafka on a new data dir): the sink lost writes it had acknowledged. Delivery
  stops with both positions and the way back rather than write on past the gap; the way
  back it names (pause, rewind --reset, resume) brings every change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from tailrace.devservers import RedisServer
from tests.fix_pipeline import reached, values_per_key, write_account_tx
from tests.fix_sinks import read_kafka

pytestmark = pytest.mark.chaos

KEYS = 20
KILLED_AT, STARTED_AT, TRANSACTIONS = 20, 40, 60  # transactions written before each step


def test_redis_killed_and_started_on_its_append_only_file_loses_and_repeats_nothing(
        pg_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    stream = "aof.acct"
    with RedisServer(appendonly=True) as red:
        pipeline = pg_redis_pipeline(
            tables="[public.acct]",
            sink=f'{{id: redis1, type: redis, url: "{red.url}", stream: "aof.{{table}}"}}')
        pipeline.start_all()
        pipeline.wait_capture_streaming()

        def delivered_up_to() -> int:
            return reached(values_per_key(red.url, stream), KEYS)

        with psycopg.connect(pg_db, autocommit=True) as conn:
            for t in range(KILLED_AT):
                write_account_tx(conn, t, KEYS)
            # mid-stream: the first half delivered, the rest on its way
            pipeline.wait_for(lambda: delivered_up_to() >= KILLED_AT // 2, 180,
                              "the first changes in Redis")
            red.kill()
            refused = pipeline.log_count("delivery", "sink did not acknowledge")
            for t in range(KILLED_AT, STARTED_AT):
                write_account_tx(conn, t, KEYS)
            pipeline.wait_for(
                lambda: pipeline.log_count("delivery", "sink did not acknowledge") > refused,
                180, "a batch the killed Redis did not acknowledge")
            red.start()  # the same port, the same append-only file
            for t in range(STARTED_AT, TRANSACTIONS):
                write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: delivered_up_to() == TRANSACTIONS - 1, 300,
                          "every change in Redis after it came back")
        values = values_per_key(red.url, stream)
        assert values == {k: list(range(TRANSACTIONS)) for k in range(KEYS)}, \
            "each key's values once each, in source order"
        pipeline.assert_running()
        print(f"\nRedis (appendonly, appendfsync always) killed -9 with transactions up to "
              f"{KILLED_AT - 1} written, started again after {STARTED_AT - KILLED_AT} more: "
              f"{KEYS * TRANSACTIONS} changes in Redis once each, in order")


def test_control_killed_and_started_again_capture_and_delivery_wait_and_go_on(
        pg_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    pipeline = pg_redis_pipeline(tables="[public.acct]", stream="ctl.{table}")
    pipeline.start("control")
    pipeline.start("capture", "--http-port", "0")
    pipeline.start("delivery", "--http-port", "0")
    pipeline.wait_capture_streaming()

    def delivered_up_to() -> int:
        return reached(values_per_key(pipeline.redis_url, "ctl.acct"), KEYS)

    def names_control(service: str) -> bool:
        status, body = pipeline.http_side(service, "/ready")
        return status == 503 and "control service at" in body.get("reason", "")

    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(KILLED_AT):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: delivered_up_to() >= KILLED_AT // 2, 180,
                          "the first changes in Redis")
        pipeline.kill("control")
        pipeline.procs.pop("control")  # down on purpose: not a process that died
        for t in range(KILLED_AT, STARTED_AT):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: names_control("capture"), 120,
                          "capture's /ready to name the control service")
        pipeline.start("control")  # the same SQLite file
        for t in range(STARTED_AT, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: delivered_up_to() == TRANSACTIONS - 1, 300,
                      "every change in Redis after the control service came back")
    values = values_per_key(pipeline.redis_url, "ctl.acct")
    assert values == {k: list(range(TRANSACTIONS)) for k in range(KEYS)}, \
        "each key's values once each, in source order"
    pipeline.wait_for(lambda: pipeline.http_side("capture", "/ready")[0] == 200, 60,
                      "capture ready again")
    pipeline.assert_running()
    print(f"\ncontrol killed -9 with transactions up to {KILLED_AT - 1} written, started "
          f"again after {STARTED_AT - KILLED_AT} more (capture's /ready named it meanwhile): "
          f"{KEYS * TRANSACTIONS} changes in Redis once each, in order")



@pytest.fixture(params=["redis", "kafka"])
def forgetful_sink(request: pytest.FixtureRequest, make_noida_kafka: Any) -> Iterator[Sink]:
    """An exactly-once sink whose server comes back empty: Redis without persistence killed
    -9 and started, noida-db's Kafka stopped and started on a new data dir (same port)."""
    if request.param == "redis":
        with RedisServer() as red:

            def read() -> dict[int, list[int]]:
                return values_per_key(red.url, "lost.acct")

            yield Sink(f'{{id: s1, type: redis, url: "{red.url}", stream: "lost.{{table}}"}}',
                       read, lambda: (red.kill(), red.start()))
        return
    broker = make_noida_kafka()

    def read_topic() -> dict[int, list[int]]:
        values: dict[int, list[int]] = {}
        topics = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
        if "lost.acct" not in topics.topics:
            return values  # the empty broker has no topic until the sink writes one
        for m in read_kafka(broker.bootstrap, ["lost.acct"]):
            after = json.loads(m.value())["after"]
            values.setdefault(after["id"], []).append(after["v"])
        return values

    def empty_again() -> None:
        broker.kill()
        broker.stop()  # its data dir goes
        broker.start()

    yield Sink(f'{{id: s1, type: kafka, brokers: "{broker.bootstrap}", topic: "lost.{{table}}", '
               'exactly_once: true}', read_topic, empty_again)


@dataclass
class Sink:
    spec: str
    values_per_key: Callable[[], dict[int, list[int]]]
    restart_empty: Callable[[], Any]


def test_a_sink_restarted_empty_stops_delivery_and_the_rewind_it_names_brings_all_back(
        pg_db: str, pg_redis_pipeline: Any, forgetful_sink: Sink) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    sink = forgetful_sink
    pipeline = pg_redis_pipeline(tables="[public.acct]", sink=sink.spec)
    name = pipeline.spec_path.stem
    pipeline.start_all()
    control = pipeline.control_client()

    def acknowledged_stored() -> int:
        cp = control.get_checkpoint(f"src-{name}", "s1")
        return cp.sink_stored[0].tx_seq if cp is not None and 0 in cp.sink_stored else 0

    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(KILLED_AT):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: acknowledged_stored() > 0, 180,
                          "a batch the sink acknowledged storing, in the control checkpoint")
        before_restart = acknowledged_stored()
        sink.restart_empty()  # what it acknowledged is gone
        for t in range(KILLED_AT, STARTED_AT):
            write_account_tx(conn, t, KEYS)
    code = pipeline.exit_code("delivery", 180)
    log = (pipeline.dir / "delivery.log").read_text(errors="replace")
    assert code != 0 and "sink s1 lost writes it had acknowledged" in log, \
        pipeline.log_tail("delivery")
    assert f"tailrace rewind {name} s1 --reset --confirm s1" in log
    assert sink.values_per_key() == {}, "nothing written past the gap"

    pipeline.cli("pause", name)
    pipeline.cli("rewind", name, "s1", "--reset", "--confirm", "s1")
    pipeline.cli("resume", name)
    pipeline.start("delivery")

    def delivered_up_to() -> int:
        return reached(sink.values_per_key(), KEYS)

    pipeline.wait_for(lambda: delivered_up_to() == STARTED_AT - 1, 300,
                      "every change in the sink after the rewind")
    assert sink.values_per_key() == {k: list(range(STARTED_AT)) for k in range(KEYS)}, \
        "each key's values once each, in source order"
    pipeline.wait_for(lambda: acknowledged_stored() > before_restart, 60,
                      "the rewound checkpoint to record what the sink stores again")
    pipeline.assert_running()
    print(f"\nsink server restarted empty after the control checkpoint recorded tx "
          f"{before_restart} stored: delivery stopped (exit {code}) naming the gap; pause, "
          f"rewind --reset, resume: {KEYS * STARTED_AT} changes in the sink once each, in order")
