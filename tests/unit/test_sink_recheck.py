"""Each exactly-once sink's `per_event_failures` answers what its write refuses one by one,
without a server (fan-out asks it again after a crash: tests/unit/test_fanout.py)."""

from __future__ import annotations

from tailrace.events import ChangeEvent, Column, Op, Row, Value
from tailrace_services.delivery.sinks import build_sink
from tests.fix_sinks import sink_spec


def events() -> list[ChangeEvent]:
    good = ChangeEvent(id="e0", database="db", schema="public", table="t", op=Op.OP_INSERT,
                       key_columns=["id"], after=Row(columns=[Column(
                           name="id", value=Value(int_value=1))]))
    keyless = ChangeEvent(id="e1", database="db", schema="public", table="t", op=Op.OP_UPDATE,
                          after=Row(columns=[Column(name="id", value=Value(int_value=2))]))
    unroutable = ChangeEvent()
    unroutable.CopyFrom(good)
    unroutable.id = "e2"
    unroutable.route = "{nowhere}"  # a route processor's template naming no field
    return [good, keyless, unroutable]


def test_redis_kafka_and_postgres_name_the_events_they_would_refuse() -> None:
    redis = build_sink(sink_spec(id="r", type="redis", url="redis://127.0.0.1:1/0",
                                 stream="s.{table}"), pipeline="p")
    kafka = build_sink(sink_spec(id="k", type="kafka", brokers="127.0.0.1:1",
                                 topic="t.{table}", exactly_once=True), pipeline="p")
    postgres = build_sink(sink_spec(id="g", type="postgres", dsn="host=127.0.0.1 port=1"),
                          pipeline="p")
    assert [i for i, _ in redis.per_event_failures(events())] == [2]
    assert [i for i, _ in kafka.per_event_failures(events())] == [2]
    assert [i for i, _ in postgres.per_event_failures(events())] == [1]
