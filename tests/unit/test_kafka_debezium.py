"""The Kafka sink's Debezium settings: what the loader accepts, and the messages an event
becomes (a delete and its tombstone, with their headers), before anything is sent."""

from __future__ import annotations

import json

import pytest

from tailrace.config import parse_pipeline
from tailrace.errors import ConfigError
from tailrace.events import Op
from tailrace_services.delivery.sinks.kafka import KafkaSink
from tests.fix_sinks import sink_spec, source_events

SPEC = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders}
spec:
  source: {type: postgres, id: pg1, dsn: "postgresql://u@h/db", tables: [public.orders]}
  sinks:
    - {id: k1, type: kafka, brokers: "127.0.0.1:9092", SINK}
  bus: {brokers: "127.0.0.1:9092"}
"""


def kafka_spec(fields: str) -> object:
    return parse_pipeline(SPEC.replace("SINK", fields), env={}).spec.sinks[0]


def test_debezium_settings_default_to_debeziums_defaults_and_can_be_turned_off() -> None:
    spec = kafka_spec("envelope: debezium")
    assert (spec.schemas_enable, spec.tombstones_on_delete) == (True, True)  # type: ignore[attr-defined]
    spec = kafka_spec("envelope: debezium, schemas_enable: false, tombstones_on_delete: false")
    assert (spec.schemas_enable, spec.tombstones_on_delete) == (False, False)  # type: ignore[attr-defined]


@pytest.mark.parametrize("field", ["schemas_enable: false", "tombstones_on_delete: true"])
def test_debezium_settings_are_refused_with_another_envelope(field: str) -> None:
    name = field.split(":")[0]
    with pytest.raises(ConfigError) as caught:
        kafka_spec(f"envelope: native, {field}")
    [problem] = caught.value.problems
    assert f"spec.sinks[0].{name}: applies to envelope: debezium only" in problem
    assert "sink's envelope is native; remove the field or set envelope: debezium" in problem
    with pytest.raises(ConfigError, match=rf"spec\.sinks\[0\]\.{name}"):
        kafka_spec(field)  # the default envelope is native


DELETES = [e for e in source_events(300) if e.op == Op.OP_DELETE][:3]


def messages(**fields: object) -> list[list[tuple[bytes, bytes | None, dict[str, bytes]]]]:
    """The messages of each of DELETES, as (key, value, headers); nothing is sent."""
    events = DELETES
    sink = KafkaSink(sink_spec(id="k", type="kafka", brokers="127.0.0.1:1", **fields))
    built = sink.messages(events, range(len(events)))
    return [[(m.key, m.value, dict(m.headers)) for j, m in built if j == i]
            for i in range(len(events))]


def test_a_delete_becomes_the_delete_and_its_tombstone_with_told_apart_headers() -> None:
    for event, msgs in zip(DELETES, messages(envelope="debezium"), strict=True):
        (key, value, headers), (t_key, t_value, t_headers) = msgs
        assert json.loads(value or b"")["payload"]["op"] == "d"
        assert t_key == key and t_value is None
        assert headers["tailrace-idempotency-key"] == event.idempotency_key.encode()
        assert t_headers["tailrace-idempotency-key"] == f"{event.idempotency_key}|tombstone".encode()
        assert t_headers["tailrace-event-id"] == headers["tailrace-event-id"] == event.id.encode()
        assert t_headers["tailrace-tx-id"] == event.tx_id.encode()
        assert "content-type" in headers and "content-type" not in t_headers
    bare = messages(envelope="debezium", schemas_enable=False, tombstones_on_delete=False)
    assert [len(m) for m in bare] == [1, 1, 1]
    assert set(json.loads(bare[0][0][0])) == {"id"}  # the bare key payload
    assert [len(m) for m in messages()] == [1, 1, 1]  # native: no tombstone
