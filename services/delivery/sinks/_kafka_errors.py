"""The Kafka sink's error table: librdkafka's errors as Tailrace's error classes.

By code first, then by what librdkafka says about the error (fatal, retriable,
abortable). A client that cannot even be created was refused its settings
(`client_config`): a configuration error, never retried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from tailrace.errors import ConfigError, FatalError, NonRetryableError, RetryableError, TailraceError
from tailrace.logs import redact
from tailrace_services.delivery.sinks.base import error_class

__all__ = ["AUTH", "FENCED", "TOO_LARGE", "ProducerFencedError", "classify_kafka",
           "kafka_error_of", "new_client"]

T = TypeVar("T")
_K = KafkaError
FENCED = {_K._FENCED, _K.PRODUCER_FENCED, _K.INVALID_PRODUCER_EPOCH}
_FATAL = {*FENCED, _K._FATAL, _K.INVALID_TXN_STATE, _K._INCONSISTENT}
TOO_LARGE = {_K.MSG_SIZE_TOO_LARGE, _K.RECORD_LIST_TOO_LARGE}
AUTH = {_K.SASL_AUTHENTICATION_FAILED, _K._AUTHENTICATION, _K.TOPIC_AUTHORIZATION_FAILED,
        _K.CLUSTER_AUTHORIZATION_FAILED, _K.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
_NON_RETRYABLE = {
    *TOO_LARGE, *AUTH, _K.INVALID_RECORD, _K._INVALID_ARG, _K.TOPIC_EXCEPTION,
    _K._UNSUPPORTED_FEATURE, _K.UNSUPPORTED_VERSION, _K._SSL, _K.INVALID_CONFIG,
    _K.POLICY_VIOLATION, _K.INVALID_TRANSACTION_TIMEOUT,
}
_RETRYABLE = {
    _K._QUEUE_FULL, _K._MSG_TIMED_OUT, _K._TIMED_OUT, _K._TIMED_OUT_QUEUE, _K._TRANSPORT,
    _K._ALL_BROKERS_DOWN, _K._RESOLVE, _K.REQUEST_TIMED_OUT, _K.NOT_ENOUGH_REPLICAS,
    _K.NOT_ENOUGH_REPLICAS_AFTER_APPEND, _K.LEADER_NOT_AVAILABLE, _K.NOT_LEADER_FOR_PARTITION,
    _K.NETWORK_EXCEPTION, _K.COORDINATOR_NOT_AVAILABLE, _K.NOT_COORDINATOR,
    _K.COORDINATOR_LOAD_IN_PROGRESS, _K.CONCURRENT_TRANSACTIONS, _K.UNKNOWN_TOPIC_OR_PART,
    _K._UNKNOWN_PARTITION, _K._PURGE_QUEUE, _K._PURGE_INFLIGHT, _K.KAFKA_STORAGE_ERROR,
    _K.TRANSACTION_ABORTABLE, _K.UNKNOWN_PRODUCER_ID, _K._STATE,
}


class ProducerFencedError(FatalError):
    """Another producer with our transactional.id took over: this delivery process must stop."""


def kafka_error_of(error: BaseException) -> KafkaError | None:
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return error.args[0]
    if isinstance(error, KafkaError):
        return error
    return None


def classify_kafka(error: BaseException) -> type[TailraceError]:
    """By code first (the tables above), then by what librdkafka says about the error."""
    if isinstance(error, BufferError):
        return RetryableError  # local queue full
    err = kafka_error_of(error)
    if err is None:
        return error_class(error)
    code = err.code()
    if err.fatal() or code in FENCED or code == _K._FATAL:
        return FatalError
    if err.txn_requires_abort():  # "N message(s) failed delivery" (_INCONSISTENT) at commit
        return RetryableError     # on a broker outage: the writer aborts, the batch goes again
    if code in _FATAL:
        return FatalError
    if code in _NON_RETRYABLE:
        return NonRetryableError
    if code in _RETRYABLE or err.retriable() or err.txn_requires_abort():
        return RetryableError
    return NonRetryableError


def new_client(kind: Callable[[dict[str, Any]], T], config: Mapping[str, Any]) -> T:
    """A librdkafka client (`Producer`, `Consumer`, `AdminClient`); creating one does no I/O,
    so a refusal is about the settings: a ConfigError naming client_config."""
    try:
        return kind(dict(config))
    except KafkaException as e:
        err = kafka_error_of(e)
        text = redact(err.str() if err is not None else str(e))
        raise ConfigError(f"client_config: librdkafka refuses the settings: {text}; fix or "
                          "remove the setting (librdkafka's CONFIGURATION.md lists them)") from None
