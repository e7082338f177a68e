"""The Kafka sink's native-envelope messages made in C (`_cjson.kafka_records`) are the
ones its Python makes: the same topic, key, value, headers and size checks, the same
events refused for the same reasons. A difference would be silent (another key sends a
row to another partition), so the whole `KafkaSink.encoded` is compared, both ways."""

from __future__ import annotations

import random

import pytest

from tailrace.events import _codec
from tailrace.proto.event_pb2 import ChangeEvent, OutboxHeader, OutboxMessage, Value
from tailrace_services.delivery.sinks._kafka_tx import Message
from tailrace_services.delivery.sinks.kafka import NATIVE_CHUNK, KafkaSink
from tests.fix_sinks import sink_spec, source_events
from tests.unit.test_cjson import VALUES

Made = tuple[dict[int, list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]]],
             list[tuple[int, str]]]


def made(events: list[ChangeEvent], **fields: object) -> Made:
    """What `encoded` makes of every event, and the failures it names; nothing is sent."""
    sink = KafkaSink(sink_spec(id="k", type="kafka", brokers="127.0.0.1:1", **fields))
    failures: list[tuple[int, str]] = []
    out = {i: [(m.topic, m.key, m.value, m.headers) for m in msgs]
           for i, msgs in sink.encoded(events, range(len(events)), failures)}
    return out, failures


def in_python(events: list[ChangeEvent], monkeypatch: pytest.MonkeyPatch,
              **fields: object) -> Made:
    with monkeypatch.context() as patch:
        patch.setattr(_codec, "cjson", None)  # the Python twins of every C path
        return made(events, **fields)


def mixed_events(count: int) -> list[ChangeEvent]:
    """Source-shaped events, some with values of every kind (some Python's to write),
    outbox messages, routes (one naming no known field), no key columns."""
    rng = random.Random(20261130)
    events = source_events(count)
    for i, event in enumerate(events):
        pick = rng.random()
        if pick < 0.2 and event.after.columns:
            event.after.columns[-1].value.CopyFrom(rng.choice(VALUES))
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
    fast, fast_failures = made(events, **fields)
    slow, slow_failures = in_python(events, monkeypatch, **fields)
    assert fast_failures == slow_failures
    assert fast == slow
    reasons = " ".join(reason for _, reason in fast_failures)
    assert "KeyError" in reasons  # the route naming no field
    assert ("message too large" in reasons) == (max_bytes is not None)
    assert any(events[i].HasField("outbox") for i in fast)  # Python's, in the same stream
    assert len(fast) > len(events) // 2


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
