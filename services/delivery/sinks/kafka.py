"""Kafka sink (confluent-kafka): at-least-once by default, exactly-once with transactions.

Default: an idempotent producer (`acks=all`), so retries inside the client never
duplicate or reorder; a batch the runtime re-sends after a failure may be
delivered twice (at-least-once). `exactly_once: true`: each write is one Kafka
transaction holding the batch and the sink's checkpoint (see `_kafka_tx`), so a
`read_committed` consumer sees every event once, every batch (and thus every source
transaction) atomically. `transactional.id` is `tailrace.{pipeline}.{sink}.{partition}`:
a second delivery process for the same pipeline fences the first, which stops
with `ProducerFencedError` (fatal).

Every message: key = the row's primary key (`key_bytes`), value = the envelope,
headers `tailrace-event-id`, `tailrace-idempotency-key`, `tailrace-schema-version`,
`tailrace-tx-id`, `content-type`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer  # type: ignore[attr-defined]
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tailrace.config._model import KafkaSinkSpec
from tailrace.envelopes import Encoder
from tailrace.errors import FatalError, NonRetryableError, RetryableError
from tailrace.events import ChangeEvent, Position, key_bytes
from tailrace.logs import get_logger, redact
from tailrace_services.delivery.sinks._common import (
    checkpoint_name,
    describe,
    destination,
    headers,
)
from tailrace_services.delivery.sinks._kafka_tx import (
    DeliveryErrors,
    Message,
    TransactionalWriter,
    produce_all,
)
from tailrace_services.delivery.sinks.base import (
    BatchCommit,
    ErrorClass,
    PerEventError,
    RetryPolicy,
    Sink,
    classify_default,
)

log = get_logger(__name__)

CHECKPOINT_TOPIC = "__tailrace_checkpoints"
MAX_MESSAGE_BYTES = 1_000_000  # librdkafka's message.max.bytes default

_K = KafkaError
_FATAL = {_K._FENCED, _K.PRODUCER_FENCED, _K.INVALID_PRODUCER_EPOCH, _K._FATAL,
          _K.INVALID_TXN_STATE, _K._INCONSISTENT}
_TOO_LARGE = {_K.MSG_SIZE_TOO_LARGE, _K.RECORD_LIST_TOO_LARGE}
_NON_RETRYABLE = {
    *_TOO_LARGE, _K.TOPIC_AUTHORIZATION_FAILED, _K.CLUSTER_AUTHORIZATION_FAILED,
    _K.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, _K.SASL_AUTHENTICATION_FAILED, _K._AUTHENTICATION,
    _K.INVALID_RECORD, _K._INVALID_ARG, _K.TOPIC_EXCEPTION, _K._UNSUPPORTED_FEATURE,
    _K.UNSUPPORTED_VERSION, _K._SSL, _K.INVALID_CONFIG, _K.POLICY_VIOLATION,
    _K.INVALID_TRANSACTION_TIMEOUT,
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


def classify_kafka(error: BaseException) -> ErrorClass:
    """By code first (the table above), then by what librdkafka says about the error."""
    if isinstance(error, BufferError):
        return ErrorClass.RETRYABLE  # local queue full
    err = kafka_error_of(error)
    if err is None:
        return classify_default(error)
    code = err.code()
    if code in _FATAL or err.fatal():
        return ErrorClass.FATAL
    if code in _NON_RETRYABLE:
        return ErrorClass.NON_RETRYABLE
    if code in _RETRYABLE or err.retriable() or err.txn_requires_abort():
        return ErrorClass.RETRYABLE
    return ErrorClass.NON_RETRYABLE


class KafkaSink(Sink):
    retry = RetryPolicy(base_s=0.1, max_s=10.0, attempts=3)

    def __init__(self, spec: KafkaSinkSpec, *, pipeline: str | None = None,
                 timeout_s: float = 30.0, client_config: Mapping[str, Any] | None = None) -> None:
        self.id = spec.id
        self.required = spec.required
        self._spec = spec
        self._pipeline = pipeline
        self._timeout_s = timeout_s
        self.exactly_once = spec.exactly_once
        self.checkpoint_topic: str = getattr(spec, "checkpoint_topic", None) or CHECKPOINT_TOPIC
        self._client: dict[str, Any] = {
            "bootstrap.servers": spec.brokers,
            "socket.connection.setup.timeout.ms": 5000,
            "reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 2000,
            **(getattr(spec, "client_config", None) or {}), **(client_config or {}),
        }
        self._max_bytes = int(self._client.get("message.max.bytes", MAX_MESSAGE_BYTES))
        self._producer_conf = {
            **self._client, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": int(timeout_s * 1000),
            "transaction.timeout.ms": max(60_000, int(timeout_s * 2000)),
        }
        self._producer: Producer | None = None             # at-least-once
        self._writers: dict[str, TransactionalWriter] = {}  # exactly-once, per transactional.id
        self._checked = False

    # -- lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        """Reach the brokers; for exactly-once, create the compacted checkpoint topic if missing."""
        if self._checked:
            return
        try:
            admin = AdminClient(self._client)
            meta = admin.list_topics(timeout=min(self._timeout_s, 10.0))
            if self.exactly_once and self.checkpoint_topic not in meta.topics:
                topic = NewTopic(self.checkpoint_topic, num_partitions=1, replication_factor=-1,
                                 config={"cleanup.policy": "compact"})
                future = admin.create_topics([topic], operation_timeout=10)[self.checkpoint_topic]
                try:
                    future.result(timeout=15)
                except KafkaException as e:
                    if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise
                log.info("checkpoint topic created", sink=self.id, topic=self.checkpoint_topic)
        except Exception as e:
            raise self._error("cannot reach the brokers or create the checkpoint topic",
                              e) from None
        self._checked = True

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        if self._producer is not None:
            self._producer.flush(min(self._timeout_s, 5.0))
            self._producer = None

    # -- writing -----------------------------------------------------------------------

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        if not self.exactly_once:
            messages = self._messages(events, range(len(events)))
            self.open()
            self._write_at_least_once(list(messages.values()), {})
            return
        self.open()
        errors: DeliveryErrors = {}
        if commit is not None:
            self._pipeline = commit.pipeline
        writer_id = self._transactional_id(commit.partition if commit else 0)
        failure: Exception | None = None
        try:
            writer = self._writer(commit.partition if commit else 0)
            writer.write(events, self._messages, commit, errors, on_skip=lambda n: log.info(
                "replayed events skipped", sink=self.id, skipped=n))
        except PerEventError:
            raise  # nothing was sent: the writer is still good
        except Exception as e:
            dropped = self._writers.pop(writer_id, None)
            if dropped is not None:
                dropped.close()  # the next write starts from the committed checkpoint
            failure = self._write_error(e, errors, writer_id)
        if failure is not None:
            # Raised here, not in the except block: no __context__ whose traceback would keep
            # the dropped producer (and its broker connections) alive.
            raise failure

    def _write_at_least_once(self, messages: Sequence[Message], errors: DeliveryErrors) -> None:
        if self._producer is None:
            self._producer = Producer(self._producer_conf)
        producer = self._producer
        deadline = time.monotonic() + self._timeout_s
        try:
            produce_all(producer, list(enumerate(messages)), errors, deadline)
            left = producer.flush(max(deadline - time.monotonic(), 0.1))
            if left:
                producer.purge(in_queue=True, in_flight=False)
                producer.flush(0)
                raise KafkaException(KafkaError(
                    KafkaError._MSG_TIMED_OUT,
                    f"{left} of {len(messages)} message(s) not acknowledged within "
                    f"{self._timeout_s:.0f} s"))
            if errors:
                raise KafkaException(next(iter(errors.values())))
        except Exception as e:
            err = kafka_error_of(e)
            if err is not None and err.fatal():
                self._producer = None  # an idempotence failure: a new producer, then retry
                failure: Exception = RetryableError(
                    f"kafka sink {self.id}: the producer failed ({redact(str(err))}); it is "
                    "replaced, retry")
            else:
                failure = self._write_error(e, errors)
        else:
            return
        raise failure  # outside the except block: see write()

    def _writer(self, partition: int) -> TransactionalWriter:
        tid = self._transactional_id(partition)
        writer = self._writers.get(tid)
        if writer is None:
            key = checkpoint_name(self._pipeline or "-", self.id, partition, sep="/")
            writer = TransactionalWriter(self._client, self._producer_conf, tid,
                                         self.checkpoint_topic, key, self._timeout_s)
            log.info("transactional producer ready", sink=self.id, transactional_id=tid,
                     stored_position=describe(writer.stored))
            self._writers[tid] = writer
        return writer

    def _transactional_id(self, partition: int) -> str:
        return "tailrace." + checkpoint_name(self._pipeline or "-", self.id, partition, sep=".")

    def _messages(self, events: Sequence[ChangeEvent], indexes: Iterable[int]
                  ) -> dict[int, Message]:
        """Route and encode `events[i]` for each index; the ones that cannot be, or are too
        large, fail alone (a PerEventError naming them, before anything is sent)."""
        encoder = Encoder(self._spec.envelope)
        messages: dict[int, Message] = {}
        failures: list[tuple[int, str]] = []
        for i in indexes:
            event = events[i]
            try:
                msg = Message(destination(self._spec.topic, event), key_bytes(event),
                              encoder.encode(event),
                              [(k, v.encode()) for k, v in
                               headers(event, encoder.content_type).items()])
            except (KeyError, ValueError, TypeError) as e:
                failures.append((i, f"cannot route or encode the event: {type(e).__name__}: {e}"))
                continue
            if msg.size > self._max_bytes:
                failures.append((i, f"message too large: {msg.size} bytes > message.max.bytes "
                                    f"{self._max_bytes}"))
            messages[i] = msg
        if failures:
            raise PerEventError(f"kafka sink {self.id}: {len(failures)} event(s) cannot be "
                                f"written; first: {failures[0][1]}", failures)
        return messages

    def stored_position(self, partition: int = 0) -> Position | None:
        """The checkpoint of the last committed transaction (exactly-once only)."""
        if not self.exactly_once or self._pipeline is None:
            return None
        self.open()
        try:
            return self._writer(partition).stored
        except Exception as e:
            self._writers.pop(self._transactional_id(partition), None)
            failure = self._write_error(e, {}, self._transactional_id(partition))
        raise failure  # outside the except block: see write()

    # -- errors ------------------------------------------------------------------------

    def classify(self, error: BaseException) -> ErrorClass:
        return classify_kafka(error)

    def _write_error(self, error: BaseException, errors: DeliveryErrors,
                     transactional_id: str = "") -> Exception:
        too_large = [(i, f"message too large: {e.str()}") for i, e in sorted(errors.items())
                     if e.code() in _TOO_LARGE]
        if too_large:
            return PerEventError(f"kafka sink {self.id}: {len(too_large)} message(s) refused as "
                                 f"too large by the broker; first: {too_large[0][1]}", too_large)
        return self._error("write failed", error, transactional_id)

    def _error(self, what: str, error: BaseException, transactional_id: str = "") -> Exception:
        if isinstance(error, PerEventError | RetryableError | NonRetryableError | FatalError):
            return error
        err = kafka_error_of(error)
        text = redact(err.str() if err is not None else f"{type(error).__name__}: {error}")
        cls = classify_kafka(error)
        if cls is ErrorClass.FATAL:
            tid = transactional_id or self._transactional_id(0)
            if err is not None and err.code() in (_K._FENCED, _K.PRODUCER_FENCED,
                                                  _K.INVALID_PRODUCER_EPOCH):
                return ProducerFencedError(
                    f"kafka sink {self.id}: producer fenced: another delivery process took over "
                    f"transactional.id {tid} ({text}); stop this one: only one delivery process "
                    f"may run pipeline {self._pipeline}")
            return FatalError(f"kafka sink {self.id}: fatal producer error on {tid}: {text}")
        if cls is ErrorClass.RETRYABLE:
            return RetryableError(f"kafka sink {self.id}: {what}: {text}")
        if err is not None and err.code() in (_K.SASL_AUTHENTICATION_FAILED, _K._AUTHENTICATION,
                                              _K.TOPIC_AUTHORIZATION_FAILED,
                                              _K.CLUSTER_AUTHORIZATION_FAILED,
                                              _K.TRANSACTIONAL_ID_AUTHORIZATION_FAILED):
            return NonRetryableError(f"kafka sink {self.id}: not allowed: {text}; check the "
                                     "credentials and ACLs of the sink's Kafka user")
        return NonRetryableError(f"kafka sink {self.id}: {what}: {text}")
