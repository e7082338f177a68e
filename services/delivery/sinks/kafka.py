"""Kafka sink (confluent-kafka): at-least-once by default, exactly-once with transactions.

`KafkaSink`: an idempotent producer (`acks=all`), so retries inside the client never
duplicate or reorder; a batch the runtime re-sends after a failure may be
delivered twice (at-least-once). `TransactionalKafkaSink` (`exactly_once: true`, an
`exactly_once.ExactlyOnceSink`): each write is one Kafka transaction holding the batch
and the sink's checkpoint (see `_kafka_tx`), so a `read_committed` consumer sees every
event once, every batch (and thus every source transaction) atomically.
`transactional.id` is `tailrace.{pipeline}.{sink}.{partition}`: a second delivery
process for the same pipeline fences the first, which stops with `ProducerFencedError`
(fatal). `build_sink` picks the one the spec asks for. An event that cannot be written
(routing, encoding, `message.max.bytes`) fails alone (`PerEventError`): at-least-once
before anything of the batch is sent; exactly-once, which produces each message as soon as
it is encoded, by aborting the transaction at its end: nothing of the batch is committed,
but what was sent of it stays in the topic as aborted records, which a `read_committed`
consumer skips and a `read_uncommitted` one (the Java client's default) reads.

Every message: key = the row's primary key (`key_bytes`; Debezium's key document with
`envelope: debezium`), value = the envelope, headers `tailrace-event-id`,
`tailrace-idempotency-key`, `tailrace-schema-version`, `tailrace-tx-id`, `content-type`.
A table without a key (no primary key under REPLICA IDENTITY FULL or NOTHING) is keyed
by its name alone: its messages stay in order in one partition, and a warning says so
once per table.

With `envelope: debezium` an event may be several messages (`Encoder.records`): a delete
and its tombstone (`tombstones_on_delete`), or the delete, tombstone and create of a key
change. They are written with their event: in the same transaction, skipped together on
a replay. Each has the event's headers; one that is not the event itself has the
idempotency key `{key}|{part}` (`|tombstone`, `|delete`), so a consumer that deduplicates
by it keeps them, and a tombstone has no `content-type` (it has no content).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tailrace.config import KafkaSinkSpec
from tailrace.envelopes import Encoder, Record
from tailrace.errors import ConfigError, FatalError, NonRetryableError, RetryableError, TailraceError
from tailrace.events import ChangeEvent, Op, Position
from tailrace.events._codec import kafka_records
from tailrace.logs import get_logger, kafka_logger, redact
from tailrace_services.delivery.sinks._avro import AvroEncoder
from tailrace_services.delivery.sinks._common import (
    checkpoint_name,
    describe,
    destination,
    routing,
)
from tailrace_services.delivery.sinks._json_schema import JsonSchemaEncoder
from tailrace_services.delivery.sinks._kafka_errors import (
    AUTH,
    FENCED,
    TOO_LARGE,
    ProducerFencedError,
    classify_kafka,
    kafka_error_of,
    new_client,
)
from tailrace_services.delivery.sinks._kafka_tx import (
    DOWN_S,
    RECONNECT_BACKOFF_MS,
    BrokerReach,
    DeliveryErrors,
    Message,
    TransactionalWriter,
    produce_all,
)
from tailrace_services.delivery.sinks._protobuf import ProtobufEncoder
from tailrace_services.delivery.sinks._registry import registry_client
from tailrace_services.delivery.sinks._registry_encoder import RegistryEncoder
from tailrace_services.delivery.sinks.base import (
    BatchCommit,
    PerEventError,
    RetryPolicy,
    Sink,
)
from tailrace_services.delivery.sinks.exactly_once import AtomicWrite, ExactlyOnceSink

__all__ = ["CHECKPOINT_TOPIC", "KafkaSink", "ProducerFencedError", "TransactionalKafkaSink",
           "classify_kafka", "record_headers"]

log = get_logger(__name__)

CHECKPOINT_TOPIC = "__tailrace_checkpoints"
_ROW_OPS = (Op.OP_INSERT, Op.OP_UPDATE, Op.OP_DELETE, Op.OP_SNAPSHOT_READ)
_REGISTRY_FORMATS: dict[str, type[RegistryEncoder]] = {
    "avro": AvroEncoder, "json_schema": JsonSchemaEncoder, "protobuf": ProtobufEncoder}
MAX_MESSAGE_BYTES = 1_000_000  # librdkafka's message.max.bytes default
NATIVE_CHUNK = 256  # events made a C call: librdkafka sends the first while more are made
_NO_KEY = b'{"pk":{}'  # how the native key of a row without key values begins


def _unroutable(error: Exception) -> str:
    return f"cannot route or encode the event: {type(error).__name__}: {error}"


def _too_large(size: int, max_bytes: int) -> str:
    return f"message too large: {size} bytes > message.max.bytes {max_bytes}"


def record_headers(event: ChangeEvent, record: Record, content_type: str
                   ) -> list[tuple[str, bytes]]:
    """The event's headers, told apart for a message that is not the event itself (see the
    module's docstring), plus the record's own (Debezium's key-change headers)."""
    idempotency_key = event.idempotency_key
    if record.part:
        idempotency_key = f"{idempotency_key}|{record.part}"
    fields = [("tailrace-event-id", event.id.encode()),
              ("tailrace-idempotency-key", idempotency_key.encode()),
              ("tailrace-schema-version", event.schema_version.encode()),
              ("tailrace-tx-id", event.tx_id.encode())]
    if record.value is not None and not event.HasField("outbox"):  # else none, or the app's
        fields.append(("content-type", content_type.encode()))
    if record.headers:
        fields.extend(record.headers)
    return fields


class KafkaSink(Sink):
    """At-least-once: an idempotent producer, no checkpoint beside the data."""

    retry = RetryPolicy(base_s=0.1, max_s=10.0, attempts=3)

    def __init__(self, spec: KafkaSinkSpec, *, pipeline: str | None = None,
                 timeout_s: float = 30.0, client_config: Mapping[str, Any] | None = None,
                 on_schema_drift: str = "adapt") -> None:
        if spec.exactly_once and not isinstance(self, TransactionalKafkaSink):
            raise ValueError(f"kafka sink {spec.id} has exactly_once: true; build it as a "
                             "TransactionalKafkaSink (build_sink does)")
        self.id = spec.id
        self.required = spec.required
        self.pipeline = pipeline
        self._spec = spec
        self._timeout_s = timeout_s
        self._client: dict[str, Any] = {  # every client's: producers, admin, checkpoint reader
            "bootstrap.servers": spec.brokers,
            "socket.connection.setup.timeout.ms": 5000,
            "reconnect.backoff.ms": RECONNECT_BACKOFF_MS, "reconnect.backoff.max.ms": 2000,
            "logger": kafka_logger(),  # librdkafka's lines through our logging
            **spec.client_config, **(client_config or {}),
        }
        try:
            self._max_bytes = int(self._client.get("message.max.bytes", MAX_MESSAGE_BYTES))
        except ValueError:
            raise ConfigError(f"kafka sink {self.id}: client_config: message.max.bytes is "
                              f"{self._client['message.max.bytes']!r}; use a number of "
                              "bytes") from None
        self._producer_conf = {  # the spec's client_config may tune linger.ms, not the rest
            "linger.ms": 5, **self._client, "enable.idempotence": True, "acks": "all",
            "message.timeout.ms": int(timeout_s * 1000),
            "transaction.timeout.ms": max(60_000, int(timeout_s * 2000)),
        }
        self._producer: Producer | None = None
        self._reach = BrokerReach()  # the at-least-once producer's brokers
        self._checked = False
        self._keyless: set[tuple[str, str, str]] = set()  # tables already warned about
        self._debezium = {"schemas": spec.schemas_enable, "tombstones": spec.tombstones_on_delete
                          } if spec.envelope == "debezium" else {}
        self._halt_on_refused = on_schema_drift == "halt"  # a registry's refusal stops all
        self._registered: RegistryEncoder | None = None  # a registry format's, for the sink's life

    # -- lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        """Reach the brokers (and prepare what the sink needs there)."""
        if self._checked:
            return
        try:
            admin = new_client(AdminClient, self._client)
            meta = admin.list_topics(timeout=min(self._timeout_s, DOWN_S))  # as BrokerReach
            self._prepare(admin, meta)
        except Exception as e:
            raise self._error("cannot reach the brokers or create the checkpoint topic",
                              e) from None
        self._checked = True

    def _prepare(self, admin: AdminClient, meta: Any) -> None:
        """Once the brokers answered `meta` (their topics): nothing more at-least-once."""

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(min(self._timeout_s, 5.0))
            self._producer = None

    # -- writing -----------------------------------------------------------------------

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        messages = self.messages(events, range(len(events)))
        self.open()
        self._write_at_least_once(messages, {})

    def _write_at_least_once(self, messages: Sequence[tuple[int, Message]],
                             errors: DeliveryErrors) -> None:
        """`messages`: each with the index of its event."""
        if self._producer is None:
            self._reach = BrokerReach()
            self._producer = new_client(Producer, {**self._producer_conf,
                                                   "error_cb": self._reach.on_error})
        producer = self._producer
        try:
            produce_all(producer, messages, errors, self._timeout_s)
            left = self._reach.wait(producer, producer.flush, self._timeout_s)
            if left:
                raise KafkaException(KafkaError(
                    KafkaError._MSG_TIMED_OUT,
                    f"{left} of {len(messages)} message(s) not acknowledged within "
                    f"{self._timeout_s:.0f} s"))
            if errors:
                raise KafkaException(next(iter(errors.values())))
        except Exception as e:
            # What is still queued is not sent after the failure: the retry produces the
            # batch again (left queued, each retry during an outage would add a copy).
            with contextlib.suppress(Exception):
                producer.purge(in_queue=True, in_flight=False)
                producer.flush(0)
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
        raise failure  # outside the except block: no traceback keeps the producer alive

    def per_event_failures(self, events: Sequence[ChangeEvent]) -> list[tuple[int, str]]:
        """The client's own checks (routing, encoding, `message.max.bytes`); a refusal by
        the broker alone (a topic's smaller `max.message.bytes`) cannot be made again here."""
        try:
            self.messages(events, range(len(events)))
        except PerEventError as e:
            return e.failures
        return []

    def messages(self, events: Sequence[ChangeEvent], indexes: Iterable[int]
                 ) -> list[tuple[int, Message]]:
        """Route and encode `events[i]` for each index, into its messages, each with the
        index; the events that cannot be, or are too large, fail alone (a PerEventError
        naming them, before anything is sent)."""
        failures: list[tuple[int, str]] = []
        messages = list(self.encoded(events, indexes, failures))
        self.refuse(failures)
        return messages

    def encoded(self, events: Sequence[ChangeEvent], indexes: Iterable[int],
                failures: list[tuple[int, str]]) -> Iterator[tuple[int, Message]]:
        """`messages`, one at a time as it is made, with the index of its event (a
        transaction produces each while the next is made): an event that cannot be
        written is left out, named in `failures`, and so are its messages. The native
        envelope's are made in C, NATIVE_CHUNK events a call. The batch's encoder is made
        here, before the first message is asked for (a registry's failure to make it
        comes before a transaction begins)."""
        encoder = self._encoder()
        route = routing(self._spec.topic)
        if isinstance(encoder, Encoder) and encoder.envelope == "native":
            return self._encoded_native(encoder, events, list(indexes), failures, route)
        return ((i, m) for i in indexes
                for m in self._encoded_one(encoder, events[i], i, failures, route) or ())

    def _encoded_native(self, encoder: Encoder, events: Sequence[ChangeEvent],
                        indexes: list[int], failures: list[tuple[int, str]],
                        route: Callable[[ChangeEvent], str]) -> Iterator[tuple[int, Message]]:
        """The loop every event of a bulk goes through: what `_encoded_one` does with a C
        record, inline (one call and one list less an event: ~1 µs of ~5)."""
        content_type = encoder.content_type.encode()
        max_bytes = self._max_bytes
        for start in range(0, len(indexes), NATIVE_CHUNK):
            chunk = indexes[start:start + NATIVE_CHUNK]
            made = kafka_records([events[i] for i in chunk], content_type) or [None] * len(chunk)
            for i, record in zip(chunk, made, strict=True):
                event = events[i]
                if record is None:  # one the C encoder leaves to Python (an outbox message)
                    for message in self._encoded_one(encoder, event, i, failures, route) or ():
                        yield i, message
                    continue
                key, value, headers, size = record
                if key.startswith(_NO_KEY) and not event.key_columns and event.op in _ROW_OPS:
                    self._warn_keyless(event)  # (the bytes first: a keyed row's key is not)
                try:
                    topic = route(event)
                except (KeyError, ValueError, TypeError) as e:
                    failures.append((i, _unroutable(e)))
                    continue
                if size > max_bytes:
                    failures.append((i, _too_large(size, max_bytes)))
                    continue
                yield i, Message(topic, key, value, headers)

    def _encoded_one(self, encoder: Encoder | RegistryEncoder, event: ChangeEvent, i: int,
                     failures: list[tuple[int, str]], route: Callable[[ChangeEvent], str]
                     ) -> list[Message] | None:
        """The messages of `events[i]`; None, named in `failures`, if it cannot be
        written."""
        if not event.key_columns and event.op in _ROW_OPS:
            self._warn_keyless(event)
        try:
            topic = route(event)
            records = encoder.records(event)
        except (KeyError, ValueError, TypeError) as e:
            failures.append((i, _unroutable(e)))
            return None
        msgs = [Message(topic, r.key, r.value, record_headers(event, r, encoder.content_type))
                for r in records]
        # one message is the usual case: without max()'s generator (~3 µs an event here);
        # none: DDL in a registry format
        size = msgs[0].size if len(msgs) == 1 else max((m.size for m in msgs), default=0)
        if size > self._max_bytes:
            failures.append((i, _too_large(size, self._max_bytes)))
            return None
        return msgs

    def refuse(self, failures: list[tuple[int, str]]) -> None:
        """The PerEventError naming `failures`, if any."""
        if failures:
            raise PerEventError(f"kafka sink {self.id}: {len(failures)} event(s) cannot be "
                                f"written; first: {failures[0][1]}", failures)

    def _encoder(self) -> Encoder | RegistryEncoder:
        """One per batch (it counts `data_collection_order`): a new `Encoder`, or the
        registry format's, kept for the sink's life with its registry client, schema ids
        and table schemas, started again."""
        registry_format = _REGISTRY_FORMATS.get(self._spec.format)
        if registry_format is None:
            return Encoder(self._spec.envelope, **self._debezium)
        if self._registered is None:
            self._registered = registry_format(
                self._spec, registry_client(self._spec),
                lambda event: destination(self._spec.topic, event), halt=self._halt_on_refused)
        self._registered.new_batch()
        return self._registered

    def _warn_keyless(self, event: ChangeEvent) -> None:
        table = (event.database, event.schema, event.table)
        if table in self._keyless:
            return
        self._keyless.add(table)
        name = ".".join(p for p in table if p)
        log.warning("table has no key columns: its messages are keyed by the table name alone, "
                    "so they all go to one partition (in order) and a compacted topic keeps only "
                    "the last of them; add a primary key to the source table, or set its "
                    "replica identity USING INDEX on a unique index",
                    sink=self.id, table=name)

    # -- errors ------------------------------------------------------------------------

    def _write_error(self, error: BaseException, errors: DeliveryErrors,
                     transactional_id: str = "") -> Exception:
        too_large = [(i, f"message too large: {e.str()}") for i, e in sorted(errors.items())
                     if e.code() in TOO_LARGE]
        if too_large:
            return PerEventError(f"kafka sink {self.id}: {len(too_large)} message(s) refused as "
                                 f"too large by the broker; first: {too_large[0][1]}", too_large)
        return self._error("write failed", error, transactional_id)

    def _error(self, what: str, error: BaseException, transactional_id: str = "") -> Exception:
        if isinstance(error, ConfigError) and not str(error).startswith("kafka sink "):
            return ConfigError(f"kafka sink {self.id}: {error}")
        if isinstance(error, TailraceError):
            return error
        err = kafka_error_of(error)
        text = redact(err.str() if err is not None else f"{type(error).__name__}: {error}")
        cls = classify_kafka(error)
        if cls is FatalError:
            tid = transactional_id or "-"
            if err is not None and err.code() in FENCED:
                return ProducerFencedError(
                    f"kafka sink {self.id}: producer fenced: another delivery process took over "
                    f"transactional.id {tid} ({text}); stop this one: only one delivery process "
                    f"may run pipeline {self.pipeline}")
            return FatalError(f"kafka sink {self.id}: fatal producer error on {tid}: {text}")
        if cls is RetryableError:
            return RetryableError(f"kafka sink {self.id}: {what}: {text}")
        if err is not None and err.code() in AUTH:
            return NonRetryableError(f"kafka sink {self.id}: not allowed: {text}; check the "
                                     "credentials and ACLs of the sink's Kafka user")
        return NonRetryableError(f"kafka sink {self.id}: {what}: {text}")


class _Transaction(AtomicWrite):
    """One Kafka transaction of a writer: the events' messages and the checkpoint record."""

    def __init__(self, sink: TransactionalKafkaSink, writer: TransactionalWriter,
                 errors: DeliveryErrors) -> None:
        self._sink, self._writer, self._errors = sink, writer, errors
        self.stored = writer.stored

    def write(self, events: Sequence[ChangeEvent], indexes: list[int],
              commit: BatchCommit) -> None:
        """Each message produced once encoded (librdkafka sends the first while the rest
        are encoded); an event that cannot be written aborts the transaction at its end
        (`TransactionalWriter.write`'s `check`): nothing of it is committed."""
        failures: list[tuple[int, str]] = []
        self._writer.write(self._sink.encoded(events, indexes, failures), commit, self._errors,
                           check=lambda: self._sink.refuse(failures))


class TransactionalKafkaSink(ExactlyOnceSink, KafkaSink):
    """`exactly_once: true`: one Kafka transaction per write, with the sink's checkpoint."""

    def __init__(self, spec: KafkaSinkSpec, *, pipeline: str | None = None,
                 timeout_s: float = 30.0, client_config: Mapping[str, Any] | None = None,
                 on_schema_drift: str = "adapt") -> None:
        super().__init__(spec, pipeline=pipeline, timeout_s=timeout_s,
                         client_config=client_config, on_schema_drift=on_schema_drift)
        self.pipeline = pipeline
        self.checkpoint_topic = spec.checkpoint_topic or CHECKPOINT_TOPIC
        self._writers: dict[str, TransactionalWriter] = {}  # per transactional.id
        self._errors: DeliveryErrors = {}  # the delivery errors of the write under way

    def _prepare(self, admin: AdminClient, meta: Any) -> None:
        """Create the compacted checkpoint topic if missing."""
        if self.checkpoint_topic in meta.topics:
            return
        topic = NewTopic(self.checkpoint_topic, num_partitions=1, replication_factor=-1,
                         config={"cleanup.policy": "compact"})
        future = admin.create_topics([topic], operation_timeout=10)[self.checkpoint_topic]
        try:
            future.result(timeout=15)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        log.info("checkpoint topic created", sink=self.id, topic=self.checkpoint_topic)

    def start_partition(self, partition: int, kept: bool) -> None:
        """A writer lives from one batch of its bus partition to the next while this worker
        delivers them: no `init_transactions` (~15-500 ms on the test broker) and no
        checkpoint read a batch. Not `kept`, its partition's last batch ran in another
        worker or attempt, whose writer fenced ours: it goes, and the next write starts
        again with `init_transactions` and the committed checkpoint."""
        tid = self._transactional_id(partition)
        if not kept:
            writer = self._writers.pop(tid, None)
            if writer is not None:
                writer.close()
        elif tid in self._writers:
            self._writers[tid].keep()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        super().close()

    # -- writing (exactly_once.ExactlyOnceSink) -----------------------------------------

    @contextmanager
    def begin(self, commit: BatchCommit) -> Iterator[AtomicWrite]:
        self._errors = {}
        self.open()
        yield _Transaction(self, self._writer(commit.partition, commit.rewind), self._errors)

    def write_unchecked(self, events: Sequence[ChangeEvent]) -> None:
        """One transaction without a checkpoint record."""
        messages = self.messages(events, range(len(events)))
        self._errors = {}
        self.open()
        self._writer(0).write(messages, None, self._errors)

    def write_failed(self, error: Exception, commit: BatchCommit | None) -> Exception:
        if isinstance(error, PerEventError):
            return error  # nothing was committed (the transaction aborted): the writer is good
        writer_id = self._transactional_id(commit.partition if commit else 0)
        dropped = self._writers.pop(writer_id, None)
        if dropped is not None:
            dropped.close()  # the next write starts from the committed checkpoint
        failure = self._write_error(error, self._errors, writer_id)
        if dropped is None or not dropped.kept or isinstance(failure, PerEventError):
            return failure  # a new writer's failure is the sink's own answer (fenced: stop)
        if isinstance(failure, ProducerFencedError):
            # Fenced since its last batch by another delivery instance's writer: one that
            # took the pipeline over, or one that lost it and still finishes a batch. Not
            # retried now: a new writer would fence the other's in turn, and the owner may
            # be the other. The sink gives this batch up (its checkpoint stays); before the
            # next, the driver asks the control service who owns the pipeline
            # (`Committer.check_owner`): the instance that lost it stops there, and the
            # owner delivers the batch again with a new writer.
            return NonRetryableError(f"kafka sink {self.id}: the producer kept from the last "
                                     f"batch was fenced by another delivery instance "
                                     f"({failure}); this batch is given up and delivered "
                                     "again by the instance that owns the pipeline")
        # Any other failure of a kept writer (a fatal one too, such as the sequence
        # desynchronization of a broker that lost its producer state) is retried with a new
        # writer, which starts with init_transactions and the committed checkpoint: what a
        # broker lost is then found (`exactly_once.SinkLostWrites`), not hidden by the error.
        return RetryableError(f"kafka sink {self.id}: the producer kept from the last batch "
                              f"failed ({failure}); writing with a new one")

    def read_checkpoint(self, pipeline: str, partition: int, rewind: int) -> Position | None:
        """The checkpoint of the last committed transaction."""
        self.open()
        try:
            writer = self._writer(partition, rewind)
            writer.confirm_stored()
            return writer.stored
        except Exception as e:
            dropped = self._writers.pop(self._transactional_id(partition), None)
            if dropped is not None:
                dropped.close()
            failure = self._write_error(e, {}, self._transactional_id(partition))
        raise failure  # outside the except block: no traceback keeps the producer alive

    def _writer(self, partition: int, rewind: int = 0) -> TransactionalWriter:
        tid = self._transactional_id(partition)
        key = checkpoint_name(self.pipeline or "-", self.id, partition, sep="/", rewind=rewind)
        writer = self._writers.get(tid)
        if writer is not None and writer.checkpoint_key != key.encode():
            self._writers.pop(tid).close()  # rewound: the checkpoint of the new generation
            writer = None
        if writer is None:
            writer = TransactionalWriter(self._client, self._producer_conf, tid,
                                         self.checkpoint_topic, key, self._timeout_s)
            log.info("transactional producer ready", sink=self.id, transactional_id=tid,
                     stored_position=describe(writer.stored))
            self._writers[tid] = writer
        return writer

    def _transactional_id(self, partition: int) -> str:
        return "tailrace." + checkpoint_name(self.pipeline or "-", self.id, partition, sep=".")
