"""The Kafka sink's client settings that its per-batch costs depend on."""

from __future__ import annotations

from tailrace_services.delivery.sinks.kafka import KafkaSink, TransactionalKafkaSink
from tests.fix_sinks import sink_spec

LIBRDKAFKA_DEFAULT_RECONNECT_BACKOFF_MS = 100


def test_a_new_transactional_writer_is_not_held_back_by_the_default_reconnect_backoff() -> None:
    # Every batch of an exactly-once sink makes a writer; librdkafka holds its coordinator
    # connection back for half of reconnect.backoff.ms (~50 ms a batch at the default).
    spec = sink_spec(id="k", type="kafka", brokers="127.0.0.1:1", topic="t", exactly_once=True)
    sink = TransactionalKafkaSink(spec, pipeline="p")
    assert sink._producer_conf["reconnect.backoff.ms"] < LIBRDKAFKA_DEFAULT_RECONNECT_BACKOFF_MS
    assert sink._client["reconnect.backoff.ms"] < LIBRDKAFKA_DEFAULT_RECONNECT_BACKOFF_MS


def test_the_spec_client_config_still_sets_the_reconnect_backoff() -> None:
    spec = sink_spec(id="k", type="kafka", brokers="127.0.0.1:1", topic="t",
                     client_config={"reconnect.backoff.ms": "250"})
    assert KafkaSink(spec, pipeline="p")._producer_conf["reconnect.backoff.ms"] == "250"
