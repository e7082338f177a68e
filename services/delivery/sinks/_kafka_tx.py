"""One transactional producer per (pipeline, sink, partition), and its checkpoint record.

A write (after `exactly_once.ExactlyOnceSink` skipped what the stored checkpoint covers),
as one Kafka transaction:
1. `begin_transaction`, produce the events' messages in order (an event may have more
   than one: a Debezium delete and its tombstone), then the checkpoint record
   (key `{pipeline}/{sink}/{partition}`, value the serialized `Position`) to the
   compacted checkpoint topic;
2. `commit_transaction`: the events and the checkpoint become visible to
   `read_committed` readers together, or not at all.
At start, `init_transactions` fences every older producer with the same
`transactional.id` and settles its open transaction; then the checkpoint topic is
read `read_committed` up to its high watermark, so the stored checkpoint is the one
of the last committed transaction. After any failure the producer is discarded and
the next write starts over from there: a commit whose outcome was not seen is found
in the checkpoint topic instead of being written twice.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from itertools import chain
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from tailrace.events import Position
from tailrace_services.delivery.sinks._common import parse_position
from tailrace_services.delivery.sinks._kafka_errors import new_client
from tailrace_services.delivery.sinks.base import BatchCommit


class Message(NamedTuple):
    """A tuple: one is made per message, and a frozen dataclass took 0.9 µs to."""

    topic: str
    key: bytes
    value: bytes | None  # None: a tombstone
    headers: list[tuple[str, bytes]]

    @property
    def size(self) -> int:
        return len(self.key) + len(self.value or b"") + sum(map(len, chain.from_iterable(
            self.headers)))


DeliveryErrors = dict[int, KafkaError]
T = TypeVar("T")

# librdkafka holds a new connection back for half of reconnect.backoff.ms (default 100)
# once the bootstrap connection gives way to the broker's own, and `init_transactions`
# waits for it: the call took ~54 ms (a new writer's, every batch) at the default, ~14 ms
# at 20.
RECONNECT_BACKOFF_MS = 20
CHECKPOINT_TAIL = 256  # records read first from the checkpoint topic's end (`read_checkpoint`)
# A writer kept across batches reads its checkpoint back this often (a new one always does):
# a topic that lost acknowledged transactions is found (`exactly_once.SinkLostWrites`).
CHECKPOINT_RECHECK_S = 10.0
DOWN_S = 5.0  # no broker reachable this long: a cut link, and the call gives up for now
_SLICE_S = 1.0  # how long one wait inside librdkafka lasts before the brokers are looked at
# What a metadata or offsets request that no broker answered in time raises.
_UNANSWERED = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN)


class BrokerReach:
    """What a client's `error_cb` says of its brokers: since when none is reachable.

    librdkafka retries an unreachable broker until the call's own timeout (30 s), so a
    cut link would show only when a batch times out; a call that gives up once every
    broker has been down for DOWN_S fails its batch early, and `/ready` names the sink
    while the link is still cut. A slow link keeps its brokers up and its timeouts.
    Producers and consumers alike: `error_cb` is served by their `poll`."""

    def __init__(self) -> None:
        self.down_since: float | None = None
        self.error = ""

    def on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            if self.down_since is None:
                self.down_since = time.monotonic()
            self.error = err.str()

    def up(self) -> None:
        """A call went through: the brokers answer."""
        self.down_since = None

    def check(self, client: Producer | Consumer) -> None:
        """Raise once every broker has been down for DOWN_S and still does not answer:
        librdkafka says when brokers go down (also an idle connection the broker closed),
        never when they are back, so a metadata request asks them first."""
        if not self._down_long():
            return
        try:
            client.list_topics(timeout=1.0)
        except KafkaException:
            raise self._gone() from None
        self.up()

    def _down_long(self) -> bool:
        """Every broker reported down, and for DOWN_S at least."""
        return self.down_since is not None and time.monotonic() - self.down_since >= DOWN_S

    def _gone(self) -> KafkaException:
        since = time.monotonic() - (self.down_since or time.monotonic())
        return KafkaException(KafkaError(
            KafkaError._ALL_BROKERS_DOWN, f"no broker reachable for {since:.0f} s ({self.error})"))

    def read_in_slices(self, client: Producer | Consumer, call: Callable[..., T],
                       deadline: float) -> T:
        """A read of the brokers' metadata or offsets, `call(timeout=)`, asked again until
        `deadline`: a request no broker answered gives up once every broker has been down for
        DOWN_S (refused connections: librdkafka waits out the whole timeout, and reports the
        brokers down at once; a link that drops packets shows only after the connection
        set-up timeout). Each try waits twice as long as the one before: a slow link's
        answer may take longer than a slice, and a new try asks again from the start.
        `client`'s `poll` must not consume (a producer, or a consumer with nothing assigned)."""
        slice_s = _SLICE_S
        while True:
            left = deadline - time.monotonic()
            try:
                result = call(timeout=max(min(slice_s, left), 0.1))
            except KafkaException as e:
                err = e.args[0] if e.args else None
                unanswered = isinstance(err, KafkaError) and err.code() in _UNANSWERED
                if not unanswered or left <= slice_s:
                    raise
                client.poll(0)  # serves error_cb
                if self._down_long():
                    raise self._gone() from None
                slice_s *= 2
            else:
                self.up()
                return result

    def wait(self, producer: Producer, call: Callable[[float], Any], timeout_s: float) -> Any:
        """`call(timeout)` (init_transactions, commit_transaction, flush) in slices until
        `timeout_s`: librdkafka lets a timed-out transactional call be made again ("it is
        okay to call this function again"; it advises an infinite timeout against state
        desynchronization, which matters little here: a writer that failed is thrown away
        and the next one starts with init_transactions), and a flush that left messages is
        simply called again. Gives up early on `check`; a flush that got messages out
        shows the brokers answer."""
        deadline = time.monotonic() + timeout_s
        left_before: int | None = None
        while True:
            left = deadline - time.monotonic()
            try:
                result = call(max(min(_SLICE_S, left), 0.1))
            except KafkaException as e:
                err = e.args[0] if e.args else None
                timed_out = isinstance(err, KafkaError) and err.code() == KafkaError._TIMED_OUT \
                    and err.retriable()
                if not timed_out or left <= _SLICE_S:
                    raise
            else:
                if not result or left <= _SLICE_S:  # flush: messages left; others: None
                    if not result:
                        self.up()
                    return result
                if left_before is not None and result < left_before:
                    self.up()  # messages went out: the brokers answer
                left_before = result
            producer.poll(0)  # serves error_cb
            self.check(producer)


def produce_all(producer: Producer, messages: Iterable[tuple[int, Message]], errors: DeliveryErrors,
                timeout_s: float) -> None:
    """Produce in order; a full local queue is drained (served) for up to `timeout_s` a
    message (`messages` may be made as they are taken: their making is not counted). Each
    message comes with the index of its event, which failures are reported under."""
    produce = producer.produce
    for index, msg in messages:
        def report(err: KafkaError | None, _: Any, index: int = index) -> None:
            if err is not None:
                errors.setdefault(index, err)

        try:
            try:  # the usual case without produce_one's call and clock (~1 µs a message)
                produce(msg.topic, msg.value, msg.key,  # its stub: a list of wider tuples
                        headers=msg.headers, on_delivery=report)  # type: ignore[arg-type]
            except BufferError:
                produce_one(producer, msg.topic, msg.value, msg.key,
                            time.monotonic() + timeout_s, headers=msg.headers,
                            on_delivery=report)
        except KafkaException as e:
            errors.setdefault(index, e.args[0])
            raise


def produce_one(producer: Producer, topic: str, value: bytes | None, key: bytes,
                deadline: float, **kwargs: Any) -> None:
    """`produce`, waiting while the local queue is full (librdkafka sends from it
    meanwhile, also inside an open transaction) until `deadline`."""
    while True:
        try:
            producer.produce(topic, value, key, **kwargs)
            return
        except BufferError:
            if time.monotonic() >= deadline:
                raise KafkaException(KafkaError(
                    KafkaError._QUEUE_FULL, "the local producer queue stayed full")) from None
            producer.poll(0.05)


class TransactionalWriter:
    """Owns a transactional producer; discard it (`close`) after any error."""

    def __init__(self, client: Mapping[str, Any], producer: Mapping[str, Any],
                 transactional_id: str, checkpoint_topic: str, checkpoint_key: str,
                 timeout_s: float) -> None:
        self.transactional_id = transactional_id
        self.checkpoint_topic = checkpoint_topic
        self.checkpoint_key = checkpoint_key.encode()
        self.timeout_s = timeout_s
        self.reach = BrokerReach()
        self._producer: Producer | None = new_client(Producer, {
            **producer, "transactional.id": transactional_id, "error_cb": self.reach.on_error})
        self.reach.wait(self._producer, self._producer.init_transactions, timeout_s)
        self._client = client
        self.kept = False  # kept from an earlier batch (`TransactionalKafkaSink.start_partition`)
        self.checked = True  # its stored checkpoint checked against the topic this batch
        self.stored: Position | None = None
        self.read_at = 0.0
        self._written_at: tuple[int, int] | None = None  # our last checkpoint record's place
        self._sent_at: tuple[int, int] | None = None  # the same, of the transaction under way
        self._probe: Consumer | None = None  # for the checkpoint topic's high watermark
        self.read_stored()

    def read_stored(self) -> None:
        """`stored` as the checkpoint topic holds it now (after `init_transactions`: the
        last transaction of ours, committed or not, is settled)."""
        self.stored = read_checkpoint(self._client, self.checkpoint_topic, self.checkpoint_key,
                                      self.timeout_s)
        self.read_at = time.monotonic()

    def keep(self) -> None:
        """Kept for another batch of its partition (`TransactionalKafkaSink.start_partition`):
        its stored checkpoint is confirmed against the topic at the batch's first read."""
        self.kept, self.checked = True, False

    def confirm_stored(self) -> None:
        """Once a batch, for a kept writer: `stored` is its memory, which cannot see a topic
        that lost records; it is read back when the topic no longer holds our last record,
        and at least every CHECKPOINT_RECHECK_S."""
        if self.checked:
            return
        self.still_reaches()
        if time.monotonic() - self.read_at >= CHECKPOINT_RECHECK_S or not self.holds_last():
            self.read_stored()
        self.checked = True

    def still_reaches(self) -> None:
        """A kept writer, before it reads or writes: raise if its brokers went away since
        its last batch (its `error_cb`, served here, says so at once; a call through a cut
        link would wait for its timeout). Not a word into a broker that is away: what this
        producer queued would go out once it is back, into a transaction nobody ends. A new
        writer is made instead, whose init_transactions gives up after DOWN_S."""
        self._live().poll(0)
        if self.reach.down_since is not None:
            raise KafkaException(KafkaError(
                KafkaError._ALL_BROKERS_DOWN,
                f"the brokers went away since the last batch ({self.reach.error})"))

    def holds_last(self) -> bool:
        """Whether the checkpoint topic still holds this writer's last checkpoint record.

        A kept writer's `stored` is its memory, and a broker that came back empty may take
        its next transaction without a word (Kafka accepts any sequence from a producer it
        does not know, if its coordinator survived elsewhere). Its partition's high
        watermark then lies at or below our record's offset: one ListOffsets round trip,
        where reading the checkpoint back is a consumer's whole start."""
        if self._written_at is None:
            return True
        partition, offset = self._written_at
        if self._probe is None:
            self._probe = new_client(Consumer, {
                **self._client, "enable.auto.commit": False,
                "group.id": f"tailrace-checkpoint-probe-{uuid.uuid4().hex[:8]}"})
        _, high = self._probe.get_watermark_offsets(
            TopicPartition(self.checkpoint_topic, partition),
            timeout=min(self.timeout_s, DOWN_S), cached=False)  # a cut link: give up early
        return bool(high > offset)

    def _checkpoint_sent(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            self._sent_at = msg.partition(), msg.offset()

    def write(self, messages: Iterable[tuple[int, Message]], commit: BatchCommit | None,
              errors: DeliveryErrors, check: Callable[[], None] | None = None) -> None:
        """One transaction: `messages` (each with the index of its event, which delivery
        errors are reported under in `errors`) and, with a `commit`, the checkpoint record.
        `check`, once every message is produced, raises if the transaction must not be
        committed (a message that could not be made): it is aborted, and the error raised.
        An abort that fails raises its own error instead: the writer's failure, not the
        events' (a fenced producer may first show it there), which the sink handles as any
        other failed write."""
        producer = self._live()
        if self.kept:
            self.still_reaches()
        producer.begin_transaction()
        produce_all(producer, messages, errors, self.timeout_s)
        deadline = time.monotonic() + self.timeout_s  # (the messages' making not counted)
        if check is not None:
            try:
                check()
            except Exception:
                self.reach.wait(producer, producer.abort_transaction, self.timeout_s)
                raise
        if commit is not None:  # after a batch that filled the local queue, it waits too
            self._sent_at = None
            produce_one(producer, self.checkpoint_topic, commit.position.SerializeToString(),
                        self.checkpoint_key, deadline, on_delivery=self._checkpoint_sent)
        del producer  # a failure's traceback keeps this frame: let close() free the client
        self.reach.wait(self._live(), self._live().commit_transaction,
                        max(deadline - time.monotonic(), 1.0))
        if commit is not None:  # (commit_transaction served the delivery reports)
            self.stored, self._written_at = commit.position, self._sent_at

    def _live(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("this transactional writer was closed; make a new one")
        return self._producer

    def close(self) -> None:
        """Abort what is open (best effort) and drop the producer.

        The reference is dropped explicitly: a failed write's traceback may keep this
        writer alive for a while, and the client would go on reconnecting meanwhile.
        """
        producer, self._producer = self._producer, None
        probe, self._probe = self._probe, None
        if probe is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                probe.close()
        if producer is None:
            return
        # What it still holds is purged first: a client kept alive by a traceback would
        # otherwise send it once the broker is back, after the next writer's
        # init_transactions, into a transaction that nobody ends and that holds every
        # read_committed reader of the checkpoint topic.
        with contextlib.suppress(KafkaException):
            producer.purge(in_queue=True, in_flight=True)
        # Nothing open, fenced, or the broker is away: the next init_transactions settles it.
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(min(self.timeout_s, 2.0))


def read_checkpoint(client: Mapping[str, Any], topic: str, key: bytes,
                    timeout_s: float) -> Position | None:
    """The last committed checkpoint under `key`, read `read_committed` to the high watermark.

    Reading up to the committed end (the LSO) is not enough: while another producer's
    transaction is open on the topic, the LSO stays before it and our last record may
    lie beyond. So the target is the high watermark, and the reader waits for such
    transactions to finish (they commit or time out).
    """
    reach = BrokerReach()  # refused connections give up after DOWN_S, not timeout_s
    common = {**client, "group.id": f"tailrace-checkpoint-reader-{uuid.uuid4().hex[:8]}",
              "enable.auto.commit": False, "auto.offset.reset": "earliest",
              "error_cb": reach.on_error}
    deadline = time.monotonic() + timeout_s
    probe = new_client(Consumer, {**common, "isolation.level": "read_uncommitted"})
    try:
        meta = reach.read_in_slices(probe, partial(probe.list_topics, topic), deadline)
        described = meta.topics.get(topic)
        if described is None or described.error is not None:
            if described is not None and described.error.code() not in (
                    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                raise KafkaException(described.error)
            return None
        starts, targets = {}, {}
        for p in described.partitions:
            low, high = reach.read_in_slices(probe, partial(
                probe.get_watermark_offsets, TopicPartition(topic, p), cached=False), deadline)
            if high > 0:
                starts[p], targets[p] = low, high
    finally:
        probe.close()
    if not targets:
        return None
    # The topic keeps one record a batch for each writer (compaction leaves the active
    # segment alone), so reading it from its start would cost more with every batch: the
    # last records are read first, then twice as far back, each pass only what the one
    # before did not read (the key was not there), with one reader.
    reader = new_client(Consumer, {**common, "isolation.level": "read_committed",
                                   "enable.partition.eof": True})
    try:
        ends, tail = targets, CHECKPOINT_TAIL
        while True:
            froms = {p: max(starts[p], targets[p] - tail) for p in targets}
            found, value = _last_value(reader, reach, topic, key, froms, ends, deadline,
                                       timeout_s)
            if found or froms == starts:
                return parse_position(value)
            ends, tail = froms, tail * 2
    finally:
        reader.close()


def _last_value(reader: Consumer, reach: BrokerReach, topic: str, key: bytes,
                froms: dict[int, int], ends: dict[int, int], deadline: float, timeout_s: float
                ) -> tuple[bool, bytes | None]:
    """Whether a committed record of `key` lies between `froms` and `ends`, and the value
    of the last one (None: a tombstone)."""
    parts = [p for p in ends if froms[p] < ends[p]]
    if not parts:
        return False, None
    found, value = False, None
    # From offsets the probe saw, not OFFSET_BEGINNING: a new consumer that must look a
    # logical offset up before it knows the partition's leader retries on a 500 ms timer.
    # (Moved on meanwhile, the fetch resets to the earliest offset.)
    reader.assign([TopicPartition(topic, p, froms[p]) for p in parts])
    while True:
        for msg in reader.consume(1000, 0.01):
            error = msg.error()
            if error is None or error.code() == KafkaError._PARTITION_EOF:
                reach.up()  # the broker answered: a stale down report must not end the read
            if error is None and msg.key() == key:
                found, value = True, msg.value()  # the latest wins
        positions = reader.position([TopicPartition(topic, p) for p in parts])
        behind = [tp for tp in positions if tp.offset < ends[tp.partition]]
        if not behind:
            return found, value
        reach.check(reader)  # (consume served its error_cb)
        if time.monotonic() >= deadline:
            tp = behind[0]
            raise KafkaException(KafkaError(
                KafkaError._TIMED_OUT,
                f"reading checkpoint topic {topic} partition {tp.partition}: stuck at offset "
                f"{tp.offset} below the high watermark {ends[tp.partition]} for "
                f"{timeout_s:.0f} s (a transaction of another producer is still open)"))
