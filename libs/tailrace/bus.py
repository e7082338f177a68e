"""The internal topic: producer settings, and the one reader of it, for capture and delivery.

One record per change (`BusRecord.event`, keyed by primary key) and, after a
transaction ends, one `BusRecord.epoch` marker per partition. The broker's
"latest offset" answer is not trusted (some Kafka-protocol brokers get it
wrong); readers plan from the epoch offsets recorded in the control service,
or read until the broker says a partition has nothing more (`BusReader`).
"""

from __future__ import annotations

import time
import uuid
import zlib
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tailrace.errors import ConfigError, RetryableError
from tailrace.events import decode_record
from tailrace.logs import kafka_logger, redact
from tailrace.proto.event_pb2 import BusRecord

__all__ = ["BusMessage", "BusRangeGone", "BusReadError", "BusReader", "consumer_config", "ensure_topic",
           "partition_for", "producer_config"]


def producer_config(brokers: str, client_id: str, extra: Mapping[str, str] | None = None
                    ) -> dict[str, Any]:
    """Idempotent producer: retries never duplicate or reorder within a partition. `extra`:
    the spec's `bus.client_config` (SASL, TLS), applied over the defaults."""
    return {
        "bootstrap.servers": brokers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 100_000,
        "queue.buffering.max.kbytes": 256 * 1024,
        "message.max.bytes": 16 * 1024 * 1024,
        "logger": kafka_logger(),  # librdkafka's lines through our logging
        **(extra or {}),
    }


def consumer_config(brokers: str, group: str, extra: Mapping[str, str] | None = None
                    ) -> dict[str, Any]:
    """Manual assignment, no auto commit: positions live in the control service. `extra`: the
    spec's `bus.client_config` (SASL, TLS)."""
    return {
        "bootstrap.servers": brokers,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "isolation.level": "read_committed",
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        # A partition whose fetched records pass queued.min.messages (100,000) or
        # queued.max.messages.kbytes is not fetched again for this long (a 16 MB fetch holds
        # ~87,000 of a bulk's records: the second passes it). librdkafka's 1 s default
        # stalled such a read though the reader took the records within ~20 ms: 200,000
        # records in 1.2 s, 0.4 s with 10 ms (docs/performance.md)
        "fetch.queue.backoff.ms": 10,
        "logger": kafka_logger(),
        **(extra or {}),
    }


def partition_for(key: bytes, partitions: int) -> int:
    """Stable key -> partition, computed by us so every producer agrees."""
    return 0 if partitions == 1 else zlib.crc32(key) % partitions


def ensure_topic(brokers: str, topic: str, partitions: int, timeout: float = 15.0,
                 extra: Mapping[str, str] | None = None) -> None:
    """Create the internal topic if missing. An existing topic with fewer partitions than
    `spec.bus.partitions` is a configuration error: waiting cannot fix it."""
    # A logging.Logger is a valid `logger` setting; AdminClient's annotation only lists scalars.
    config: dict[str, Any] = {"bootstrap.servers": brokers, "logger": kafka_logger(),
                              **(extra or {})}
    admin = AdminClient(config)
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as e:
        raise RetryableError(f"bus at {brokers} is unreachable: {e}") from None
    existing = meta.topics.get(topic)
    if existing is not None and existing.error is None:
        have = len(existing.partitions)
        if have < partitions:
            raise ConfigError(
                f"spec.bus.partitions is {partitions} but bus topic {topic!r} has {have} "
                f"partition(s); set spec.bus.partitions to {have} (a running pipeline's bus "
                "cannot be repartitioned yet: the control service refuses epochs that end "
                "before the ones recorded on the old topic)")
        return
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                            replication_factor=1)])
    for fut in futures.values():
        try:
            fut.result(timeout)
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise RetryableError(f"cannot create bus topic {topic!r}: {e}") from None


class BusReadError(RetryableError):
    """The broker answered a read of the internal topic with an error."""


GONE_AFTER_S = 5.0  # `read_range`: nothing arrived, and the partition ends where it waits


class BusRangeGone(BusReadError):
    """A range planned from acknowledged records is not on the bus any more."""


@dataclass(frozen=True, slots=True)
class BusMessage:
    """One record of the internal topic as read: where it is, and its bytes."""

    partition: int
    offset: int
    value: bytes

    def record(self) -> BusRecord:
        return decode_record(self.value)


class BusReader:
    """The one reader of the internal topic: a consumer with manual assignment (positions
    live in the control service, never in consumer groups) that knows where a partition
    ends. Used by delivery's executors (`read_range`), by capture to find what the bus
    already holds (`read_at`, `read_to_end`) and by tests (`assign` and `poll`).

    `committed_only=False` also reads records of unfinished producer transactions (a
    capture's own records, which it writes without transactions, read the same either way).
    `client_config`: the spec's `bus.client_config` (SASL, TLS).
    """

    def __init__(self, brokers: str, topic: str, *, client_id: str = "tailrace-reader",
                 client_config: Mapping[str, str] | None = None,
                 committed_only: bool = True) -> None:
        config = consumer_config(brokers, f"{client_id}-{uuid.uuid4().hex[:8]}", client_config)
        config["enable.partition.eof"] = True
        if not committed_only:
            config["isolation.level"] = "read_uncommitted"
        self.topic = topic
        self.at_end: set[int] = set()
        """Partitions read to their end (no record since the broker said so)."""
        self._read_up_to: tuple[int, int] | None = None
        """(partition, offset) where the last `read_range` ended, when the consumer handed out
        nothing after it: the next range from there may read on, without assigning anew."""
        self._config = config
        self._probe: Consumer | None = None
        """A client of its own for `_still_past`: a query on the reading consumer's connection,
        between its fetches, held back the fetches after it on the test broker (a read of
        16,700 records 7 ms -> 108 ms with fetch.wait.max.ms 100, 508 ms with 500)."""
        try:  # creating a client does no I/O: a refusal is about the settings
            self._consumer = Consumer(config)
        except KafkaException as e:
            raise ConfigError(f"spec.bus.client_config: librdkafka refuses the settings: "
                              f"{redact(str(e))}; fix or remove the setting") from None

    def assign(self, starts: Mapping[int, int]) -> None:
        """Read partition p from offset starts[p] on (and no other partition)."""
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])
        self.at_end = set()
        self._read_up_to = None

    def poll(self, max_messages: int = 10_000, timeout_s: float = 0.5) -> list[BusMessage]:
        """What arrived within `timeout_s`, in offset order per partition."""
        return self._consume(max_messages, timeout_s)

    def _consume(self, max_messages: int, timeout_s: float) -> list[BusMessage]:
        self._read_up_to = None  # what it hands out moves the consumer on
        out = []
        for msg in self._consumer.consume(max_messages, timeout_s):
            # confluent-kafka types these as optional (an error event may lack them); records
            # and partition-end events always carry their partition, records their offset and
            # value (the bus holds no null values).
            partition = cast(int, msg.partition())
            if msg.error() is None:
                self.at_end.discard(partition)
                out.append(BusMessage(partition, cast(int, msg.offset()), cast(bytes, msg.value())))
            else:
                self._not_a_record(msg)
        return out

    def _not_a_record(self, msg: Message) -> None:
        """A partition's end, noted; any other error raised."""
        err, partition = cast(KafkaError, msg.error()), cast(int, msg.partition())
        if err.code() != KafkaError._PARTITION_EOF:
            raise BusReadError(f"bus {self.topic}[{partition}]: {err.str()}")
        self.at_end.add(partition)

    def read_range(self, partition: int, start: int, end: int, timeout_s: float = 60.0,
                   chunk: int = 4096, read_on: bool = False
                   ) -> Generator[tuple[list[int], list[bytes]], None, None]:
        """Offsets [start, end) of one partition in offset order, as (offsets, values) chunks
        of at most `chunk`; TimeoutError when nothing arrives for `timeout_s`. BusRangeGone
        sooner, when nothing arrived for GONE_AFTER_S and the partition ends where the read
        waits (or before): the range was planned from acknowledged records, so a bus without
        them lost them. Not at the first empty read: the test broker gives a partition's end
        as one past the start of its last batch, below the records after it in that batch.

        With `read_on`, a range that starts where this reader's last one ended continues with
        what the consumer fetched meanwhile (a kept reader: `delivery.executor`), once the
        broker says the partition still goes on past `start`: a bus restarted empty since is
        read again (and found lost), not served from that fetch. Any other range assigns the
        partition anew."""
        if not (read_on and self._read_up_to == (partition, start)
                and self._still_past(partition, start)):
            self.assign({partition: start})
        self._read_up_to = None  # until this range ends
        offsets: list[int] = []
        values: list[bytes] = []
        next_offset = start
        handed_past_end = False
        deadline = time.monotonic() + timeout_s
        waiting_since = time.monotonic()
        while next_offset < end:
            got = past_end = False  # past_end: a record after the partition's end event
            # the consumer's messages as they come (no BusMessage each: ~10 % of a task)
            for msg in self._consumer.consume(min(10_000, end - next_offset), 1.0):
                if msg.error() is not None:
                    self._not_a_record(msg)  # the partition's end (any other error raises)
                    past_end = False
                    continue
                past_end = True
                offset = cast(int, msg.offset())
                if offset < next_offset:
                    continue
                if offset >= end:  # the next range's, handed out now: that one assigns anew
                    handed_past_end = True
                    continue
                offsets.append(offset)
                values.append(cast(bytes, msg.value()))
                next_offset, got = offset + 1, True
                if len(offsets) >= chunk:
                    yield offsets, values
                    offsets, values = [], []
            if past_end:
                self.at_end.discard(partition)
            if got:
                deadline = time.monotonic() + timeout_s
                waiting_since = time.monotonic()
            elif time.monotonic() - waiting_since >= GONE_AFTER_S and \
                    (high := self._end_or_none(partition)) is not None and high <= next_offset:
                raise BusRangeGone(f"bus {self.topic}[{partition}] ends at offset {high}, "
                                   f"before offsets {next_offset}..{end} planned from records "
                                   "it acknowledged: the bus lost them")
            elif time.monotonic() > deadline:
                raise TimeoutError(f"bus {self.topic}[{partition}]: offsets {next_offset}..{end} "
                                   f"not readable within {timeout_s:.0f} s")
        if offsets:
            yield offsets, values
        if not handed_past_end:
            self._read_up_to = partition, end

    def end_offset(self, partition: int, timeout_s: float = 20.0) -> int:
        """The offset after the partition's last record now (its high watermark)."""
        return self._high_watermark(self._consumer, partition, timeout_s)

    def _high_watermark(self, client: Consumer, partition: int, timeout_s: float) -> int:
        try:
            _, high = client.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                   timeout=timeout_s)
        except KafkaException as e:
            raise BusReadError(f"bus {self.topic}[{partition}]: {redact(str(e))}") from None
        return int(high)

    def unanswered(self, timeout_s: float) -> str:
        """Why no broker answered a metadata request for the topic within `timeout_s`; ""
        when one did (whether or not the topic exists yet)."""
        try:
            self._consumer.list_topics(self.topic, timeout=timeout_s)
        except KafkaException as e:
            return redact(str(e))
        return ""

    def _still_past(self, partition: int, offset: int) -> bool:
        """Whether the broker answers that the partition ends after `offset` (not whether it
        reaches a range's end: the test broker answers one past its last batch's start)."""
        if self._probe is None:
            self._probe = Consumer(self._config)
        try:
            return self._high_watermark(self._probe, partition, 5.0) > offset
        except BusReadError:
            return False  # not answered: assigned anew, the read's own timeout decides

    def _end_or_none(self, partition: int) -> int | None:
        try:
            return self.end_offset(partition, 5.0)
        except BusReadError:
            return None  # not answered: the read's own timeout decides

    def read_at(self, partition: int, offset: int, timeout_s: float = 20.0) -> BusMessage | None:
        """The record at `offset`, None when the partition ends before it; TimeoutError
        when the broker does not answer within `timeout_s`."""
        return next(self.read_to_end(partition, offset, timeout_s, batch=1), None)

    def read_to_end(self, partition: int, start: int, timeout_s: float = 20.0,
                    batch: int = 10_000) -> Iterator[BusMessage]:
        """The records from `start` until the partition's end; TimeoutError when the end
        is not reached within `timeout_s`."""
        self.assign({partition: start})
        deadline = time.monotonic() + timeout_s
        while partition not in self.at_end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bus {self.topic}[{partition}]: reading from offset {start}, "
                                   f"the end was not reached within {timeout_s:.0f} s")
            # A short wait: a batch that does not fill up returns only when the wait is over
            # (librdkafka), and the end usually comes before `batch` records.
            yield from self.poll(batch, 0.05)

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()
        self._consumer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
