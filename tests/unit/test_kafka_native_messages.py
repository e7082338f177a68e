"""The Kafka sink's native-envelope messages made in C (`_cjson.kafka_records`) are the
ones its Python makes: the same topic, key, value, headers and size checks, the same
events refused for the same reasons. A difference would be silent (another key sends a
row to another partition), so the whole `KafkaSink.encoded` is compared, both ways."""

from __future__ import annotations

import random

import pytest

from tailrace.events import _codec
from tailrace.proto.event_pb2 import (
    ChangeEvent,
    MysqlPosition,
    Op,
    OutboxHeader,
    OutboxMessage,
    Value,
)
from tailrace_services.delivery.sinks._kafka_tx import Message
from tailrace_services.delivery.sinks.kafka import NATIVE_CHUNK, KafkaSink
from tests.fix_sinks import sink_spec, source_events
from tests.unit.test_cjson import RAISING, VALUES

Made = tuple[dict[int, list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]]],
             list[tuple[int, str]]]


def made(events: list[ChangeEvent], **fields: object) -> Made:
    """What `encoded` makes of every event, and the failures it names; nothing is sent."""
    sink = KafkaSink(sink_spec(id="k", type="kafka", brokers="127.0.0.1:1", **fields))
    failures: list[tuple[int, str]] = []
    out: dict[int, list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]]] = {}
    for i, m in sink.encoded(events, range(len(events)), failures):
        out.setdefault(i, []).append((m.topic, m.key, m.value, m.headers))
    return out, failures


def in_python(events: list[ChangeEvent], monkeypatch: pytest.MonkeyPatch,
              **fields: object) -> Made:
    with monkeypatch.context() as patch:
        patch.setattr(_codec, "cjson", None)  # the Python twins of every C path
        return made(events, **fields)


def mixed_events(count: int) -> list[ChangeEvent]:
    """Source-shaped events, some with values of every kind (some Python's to write) in
    key and other columns, other ops, MySQL positions, outbox messages, routes (one naming
    no known field), no key columns."""
    rng = random.Random(20261130)
    events = source_events(count)
    for i, event in enumerate(events):
        pick = rng.random()
        if pick < 0.1 and event.after.columns:
            spelled = [v for v in RAISING if v.WhichOneof("kind") == "time_value"]
            event.after.columns[-1].value.CopyFrom(rng.choice(VALUES + spelled))
        elif pick < 0.2:
            row = event.after if event.after.columns else event.before
            key = [c for c in row.columns if c.name in event.key_columns]
            if key:
                key[0].value.CopyFrom(rng.choice(VALUES))
        elif pick < 0.22:
            event.op = rng.choice([Op.OP_DDL, Op.OP_TRUNCATE, Op.OP_SNAPSHOT_READ, 9])
            event.ddl = "ALTER TABLE orders ADD COLUMN x int" if event.op == Op.OP_DDL else ""
        elif pick < 0.24:
            event.position.mysql.CopyFrom(MysqlPosition(gtid="0-1-12", gtid_set="0-1-12",
                                                        file="bin.000003", offset=4567))
        elif pick < 0.25:
            event.outbox.CopyFrom(OutboxMessage(key=f"agg-{i}".encode(), payload=b'{"x":1}',
                                                headers=[OutboxHeader(name="id", value=b"7")]))
        elif pick < 0.3:
            event.route = rng.choice(["r.{table}.{op}", "r.{nope}", "fixed"])
        elif pick < 0.33:
            del event.key_columns[:]
        elif pick < 0.35 and event.after.columns:
            event.after.columns[-1].value.CopyFrom(Value(text_value="x" * 900))
    return events


@pytest.mark.parametrize("max_bytes", [None, 1000])
def test_native_messages_made_in_c_are_the_ones_python_makes(
        monkeypatch: pytest.MonkeyPatch, max_bytes: int | None) -> None:
    events = mixed_events(3 * NATIVE_CHUNK + 17)  # several C calls, the last one short
    fields: dict[str, object] = {"topic": "cdc.{table}"}
    if max_bytes is not None:
        fields["client_config"] = {"message.max.bytes": str(max_bytes)}
    assert _codec.cjson is not None, "the C extension is built (make setup)"
    fast, fast_failures = made(events, **fields)
    slow, slow_failures = in_python(events, monkeypatch, **fields)
    assert fast_failures == slow_failures
    assert fast == slow
    reasons = " ".join(reason for _, reason in fast_failures)
    assert "KeyError" in reasons  # the route naming no field
    assert ("message too large" in reasons) == (max_bytes is not None)
    assert any(events[i].HasField("outbox") for i in fast)  # Python's, in the same stream
    assert len(fast) > len(events) // 2


def test_keyless_rows_are_warned_about_the_same_both_ways(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The C path looks at the event's key columns only for a key without values (its
    bytes first): every row of a table without key columns is still found, and no other."""
    events = mixed_events(3 * NATIVE_CHUNK)
    warned: list[str] = []
    monkeypatch.setattr(KafkaSink, "_warn_keyless", lambda _, event: warned.append(event.id))
    made(events)
    fast, warned[:] = list(warned), []
    in_python(events, monkeypatch)
    assert fast == warned
    assert len(fast) > 10


def test_only_the_native_envelope_is_made_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other envelopes never reach `kafka_records` (its messages are the native ones)."""
    calls: list[int] = []
    real = _codec.kafka_records
    monkeypatch.setattr("tailrace_services.delivery.sinks.kafka.kafka_records",
                        lambda events, ct: calls.append(len(events)) or real(events, ct))
    events = source_events(10)
    made(events, envelope="cloudevents")
    made(events, envelope="protobuf")
    assert calls == []
    made(events)
    assert calls == [10]


def test_the_size_made_in_c_is_what_message_size_counts() -> None:
    events = mixed_events(300)
    records = _codec.kafka_records(events, b"application/json")
    assert records is not None
    sized = [(r, Message("t", r[0], r[1], r[2]).size) for r in records if r is not None]
    assert len(sized) > 200
    assert all(r[3] == size for r, size in sized)


@pytest.mark.parametrize("where", ["key", "row"])
def test_a_value_python_refuses_raises_the_same_both_ways(
        monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """A value out of Python's range (a date past 9999): C leaves it to Python, whose error
    is the one raised, as without C. (Every value C leaves to Python and Python spells is
    in `mixed_events`.)"""
    refused = [v for v in RAISING if v.WhichOneof("kind") in ("date_value", "timestamp_value")]
    assert len(refused) == 5
    for value in refused:
        events = source_events(5)
        event = events[3]
        row = event.after if event.after.columns else event.before
        column = next(c for c in row.columns if (c.name in event.key_columns) == (where == "key"))
        column.value.CopyFrom(value)
        with pytest.raises(Exception) as fast:
            made(events)
        with pytest.raises(Exception) as slow:
            in_python(events, monkeypatch)
        assert (type(fast.value), str(fast.value)) == (type(slow.value), str(slow.value))
