"""Error classification of every sink, and the per-event errors a batch can raise."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import psycopg
import psycopg.errors
import pytest
import redis
from confluent_kafka import KafkaError, KafkaException  # type: ignore[attr-defined]

from tailrace.errors import (
    ConfigError,
    FatalError,
    NonRetryableError,
    RetryableError,
    TailraceError,
)
from tailrace_services.delivery.sinks import build_sink
from tailrace_services.delivery.sinks.base import PerEventError
from tailrace_services.delivery.sinks.kafka import KafkaSink, classify_kafka
from tailrace_services.delivery.sinks.nats import classify_nats, subject_filter
from tailrace_services.delivery.sinks.postgres import classify_postgres
from tailrace_services.delivery.sinks.redis import classify_redis
from tests.fix_sinks import sink_spec, source_events

R, N, F = RetryableError, NonRetryableError, FatalError


def _k(code: int, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, "test", **flags))


@pytest.mark.parametrize(("error", "expected"), [
    (BufferError("queue full"), R),
    (_k(KafkaError._QUEUE_FULL), R),
    (_k(KafkaError._MSG_TIMED_OUT), R),
    (_k(KafkaError._TIMED_OUT), R),
    (_k(KafkaError._ALL_BROKERS_DOWN), R),
    (_k(KafkaError._TRANSPORT), R),
    (_k(KafkaError.NOT_ENOUGH_REPLICAS), R),
    (_k(KafkaError.COORDINATOR_NOT_AVAILABLE), R),
    (_k(KafkaError._STATE, txn_requires_abort=True), R),  # abortable: abort, then retry
    # "Current transaction failed in state BeginCommit: N message(s) failed delivery" when
    # the broker stopped mid-transaction (seen in a fresh-clone run): abortable, not fatal
    (_k(KafkaError._INCONSISTENT, txn_requires_abort=True), R),
    (_k(KafkaError._INCONSISTENT), F),  # the idempotent producer's state: fatal
    (_k(KafkaError.PRODUCER_FENCED, txn_requires_abort=True), F),
    (_k(KafkaError.MSG_SIZE_TOO_LARGE), N),
    (_k(KafkaError.SASL_AUTHENTICATION_FAILED), N),
    (_k(KafkaError.TOPIC_AUTHORIZATION_FAILED), N),
    (_k(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED), N),
    (_k(KafkaError._FENCED), F),
    (_k(KafkaError.PRODUCER_FENCED), F),
    (_k(KafkaError.INVALID_PRODUCER_EPOCH), F),
    (_k(KafkaError.UNKNOWN, fatal=True), F),  # a fatal commit error
    (RetryableError("x"), R), (NonRetryableError("x"), N), (FatalError("x"), F),
])
def test_kafka_classification(error: BaseException, expected: type[TailraceError]) -> None:
    assert classify_kafka(error) is expected


@pytest.mark.parametrize(("error", "expected"), [
    (redis.ConnectionError("refused"), R),
    (redis.TimeoutError("slow"), R),
    (redis.BusyLoadingError("loading"), R),
    (redis.WatchError("moved"), R),
    (redis.ResponseError("LOADING Redis is loading the dataset in memory"), R),
    (redis.AuthenticationError("invalid password"), N),
    (redis.ResponseError("WRONGPASS invalid username-password pair"), N),
    (redis.ResponseError("NOAUTH Authentication required."), N),
    (redis.ResponseError("WRONGTYPE Operation against a key"), N),
])
def test_redis_classification(error: BaseException, expected: type[TailraceError]) -> None:
    assert classify_redis(error) is expected


@pytest.mark.parametrize(("error", "expected"), [
    (nats.errors.ConnectionClosedError(), R),
    (nats.errors.TimeoutError(), R),
    (nats.errors.NoServersError(), R),
    (nats.js.errors.ServiceUnavailableError(), R),
    (nats.errors.AuthorizationError(), N),
    (nats.errors.Error("nats: 'Authorization Violation'"), N),
    (nats.js.errors.NoStreamResponseError(), N),
    (nats.errors.NoRespondersError(), N),
    (nats.errors.MaxPayloadError(), N),
])
def test_nats_classification(error: BaseException, expected: type[TailraceError]) -> None:
    assert classify_nats(error) is expected


@pytest.mark.parametrize(("error", "expected"), [
    (psycopg.OperationalError("connection failed: Connection refused"), R),
    (psycopg.OperationalError("consuming input failed: server closed the connection"), R),
    (psycopg.InterfaceError("the connection is closed"), R),
    (psycopg.errors.AdminShutdown(), R),
    (psycopg.errors.SerializationFailure(), R),
    (psycopg.errors.DeadlockDetected(), R),
    (psycopg.OperationalError('FATAL:  password authentication failed for user "u"'), N),
    (psycopg.errors.InvalidPassword(), N),
    (psycopg.errors.InsufficientPrivilege(), N),
    (psycopg.errors.UndefinedTable(), N),
    (psycopg.errors.NumericValueOutOfRange(), N),
])
def test_postgres_classification(error: BaseException, expected: type[TailraceError]) -> None:
    assert classify_postgres(error) is expected


def test_too_large_and_unroutable_events_fail_alone_with_their_indexes() -> None:
    events = source_events(6)
    events[1].after.columns[2].value.text_value = "x" * 5000
    events[4].route = "cdc.{nope}"
    sink = KafkaSink(sink_spec(id="k", type="kafka", brokers="127.0.0.1:1"),
                     client_config={"message.max.bytes": 4000})
    with pytest.raises(PerEventError) as caught:
        sink.write(events)  # fails before any connection is made
    assert [i for i, _ in caught.value.failures] == [1, 4]
    assert "message too large" in caught.value.failures[0][1]
    assert "nope" in caught.value.failures[1][1]
    assert isinstance(caught.value, NonRetryableError)


@pytest.mark.parametrize(("setting", "refused"), [
    ({"no.such.property": "1"}, 'No such configuration property: "no.such.property"'),
    ({"linger.ms": "soon"}, "Invalid value for configuration property"),
    ({"message.max.bytes": "lots"}, "message.max.bytes is 'lots'"),
])
def test_settings_librdkafka_refuses_are_a_config_error_naming_the_sink(
        setting: dict[str, str], refused: str) -> None:
    """Checked where the sink runs (the executor's librdkafka), before any connection."""
    spec = sink_spec(id="k9", type="kafka", brokers="127.0.0.1:1",
                     client_config={"sasl.password": "hunter2", **setting})
    with pytest.raises(ConfigError) as caught:
        KafkaSink(spec).open()
    assert str(caught.value).startswith("kafka sink k9: client_config: ")
    assert refused in str(caught.value) and "hunter2" not in str(caught.value)


def test_build_sink_maps_every_spec_type() -> None:
    specs = [
        sink_spec(id="a", type="kafka", brokers="127.0.0.1:1"),
        sink_spec(id="b", type="nats", url="nats://127.0.0.1:1"),
        sink_spec(id="c", type="redis", url="redis://127.0.0.1:1/0"),
        sink_spec(id="d", type="postgres", dsn="postgresql://u@127.0.0.1:1/db"),
    ]
    specs.append(sink_spec(id="e", type="kafka", brokers="127.0.0.1:1", exactly_once=True))
    kinds = [type(build_sink(s, pipeline="p")).__name__ for s in specs]
    assert kinds == ["KafkaSink", "NatsSink", "RedisSink", "PostgresSink",
                     "TransactionalKafkaSink"]
    assert build_sink(specs[0]).retry.base_s == 0.1 and build_sink(specs[0]).retry.max_s == 10
    assert build_sink(specs[1]).retry.base_s == 0.05 and build_sink(specs[2]).retry.max_s == 5
    with pytest.raises(ValueError, match="kafka, nats, redis or postgres"):
        build_sink(object())


def test_subject_filter_covers_the_template() -> None:
    assert subject_filter("cdc.{database}.{table}") == "cdc.*.>"
    assert subject_filter("cdc.{table}.changes") == "cdc.*.changes"
    assert subject_filter("events") == "events"
