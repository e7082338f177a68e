"""A schema the registry refuses: its event fails alone (DLQ), or, with the source's
`on_schema_drift: halt`, the pipeline stops (pure logic: the registry is a stand-in; the
real one refusing: tests/integration/test_kafka_avro.py, test_kafka_registry_formats.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tailrace.errors import FatalError
from tailrace_services.delivery.sinks._avro import AvroEncoder
from tailrace_services.delivery.sinks._registry import RegistryRefused
from tailrace_services.delivery.sinks.kafka import KafkaSink
from tests.fix_sinks import sink_spec, source_events


class RefusingRegistry:
    def latest(self, subject: str, fmt: str | None = None) -> None:
        return None

    def register(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        raise RegistryRefused(f"subject {subject}: incompatible with version 1 (test)")


def spec() -> Any:
    return sink_spec(id="k1", type="kafka", brokers="127.0.0.1:9", topic="t.{table}",
                     envelope="debezium", format="avro",
                     schema_registry={"url": "http://127.0.0.1:9"})


@pytest.mark.parametrize("halt", [False, True])
def test_a_refused_schema_fails_its_event_or_halts(halt: bool) -> None:
    encoder = AvroEncoder(spec(), RefusingRegistry(), lambda e: f"t.{e.table}",  # type: ignore[arg-type]
                          halt=halt)
    event = next(e for e in source_events(20) if e.after.columns)
    if halt:
        with pytest.raises(FatalError, match="on_schema_drift is halt, so the pipeline stops"):
            encoder.records(event)
    else:
        with pytest.raises(ValueError, match="incompatible with version 1"):
            encoder.records(event)


def test_the_kafka_sink_takes_the_sources_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from tailrace_services.delivery.sinks import kafka

    monkeypatch.setattr(kafka, "registry_client", lambda _: RefusingRegistry())
    event = next(e for e in source_events(20) if e.after.columns)
    with pytest.raises(FatalError):
        KafkaSink(spec(), on_schema_drift="halt").messages([event], [0])
    failures = KafkaSink(spec()).per_event_failures([event])
    assert [i for i, _ in failures] == [0] and "incompatible" in failures[0][1]


@pytest.mark.parametrize(("body", "detail"), [
    (b'{"error_code": 409, "message": "incompatible"}', "incompatible"),
    (b'["not", "an", "object"]', "Conflict: ['not', 'an', 'object']"),  # it raised before
    (b"<html>a proxy's page</html>", "Conflict")])
def test_a_registry_error_is_told_whatever_its_body(body: bytes, detail: str) -> None:
    import io
    import urllib.error

    from tailrace_services.delivery.sinks._registry import _detail

    error = urllib.error.HTTPError("http://registry", 409, "Conflict", {},  # type: ignore[arg-type]
                                   io.BytesIO(body))
    assert _detail(error) == detail
