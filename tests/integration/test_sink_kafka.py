"""Kafka sink on noida-db's Kafka (it filters aborted transactions and reports fencing, which
Tansu does not): at-least-once, the exactly-once transaction with its checkpoint, fencing,
outage, too-large messages."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition  # type: ignore[attr-defined]

from tailrace.errors import FatalError, NonRetryableError, RetryableError
from tailrace.events import ChangeEvent
from tailrace_services.delivery.sinks.base import BatchCommit, PerEventError
from tailrace_services.delivery.sinks.kafka import KafkaSink, TransactionalKafkaSink
from tests.fix_sinks import batches_of, read_kafka, sink_spec, source_events

pytestmark = pytest.mark.integration


def make_sink(brokers: str, prefix: str, exactly_once: bool, **kw: Any) -> KafkaSink:
    spec = sink_spec(id="k1", type="kafka", brokers=brokers, topic=prefix + ".{table}",
                     exactly_once=exactly_once)
    kind = TransactionalKafkaSink if exactly_once else KafkaSink
    return kind(spec, timeout_s=kw.pop("timeout_s", 10), **kw)


def commit(batch: list[ChangeEvent], pipeline: str) -> BatchCommit:
    return BatchCommit(pipeline=pipeline, source_id="src1", sink_id="k1",
                       position=batch[-1].position)


def read_topics(brokers: str, prefix: str, isolation: str = "read_committed",
                tables: tuple[str, ...] = ("items", "orders")) -> list[Any]:
    """Every message of the sink's topics, from the beginning to the end."""
    return read_kafka(brokers, [f"{prefix}.{t}" for t in tables], isolation, timeout=20)


def messages_in(brokers: str, prefix: str, tables: tuple[str, ...] = ("items", "orders")
                ) -> int:
    """How many messages the sink's topics hold, aborted ones too (0: none made yet)."""
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": "count"})
    try:
        topics = consumer.list_topics(timeout=10).topics
        return sum(consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1]
                   for name in (f"{prefix}.{t}" for t in tables) if name in topics
                   for p in topics[name].partitions)
    finally:
        consumer.close()


def ids(messages: list[Any]) -> list[str]:
    return [dict(m.headers())["tailrace-event-id"].decode() for m in messages]


def test_at_least_once_delivers_in_key_order_with_headers(noida_kafka: Any) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    sink = make_sink(noida_kafka.bootstrap, prefix, exactly_once=False)
    events = source_events(800)
    for batch in batches_of(events, 200):
        sink.write(batch, commit(batch, "p"))
    sink.close()
    msgs = read_topics(noida_kafka.bootstrap, prefix)
    assert sorted(ids(msgs)) == sorted(e.id for e in events)
    by_id = {e.id: e for e in events}
    for msg in msgs[:20]:
        event = by_id[dict(msg.headers())["tailrace-event-id"].decode()]
        headers = dict(msg.headers())
        assert headers["tailrace-idempotency-key"].decode() == event.idempotency_key
        assert headers["tailrace-tx-id"].decode() == event.tx_id
        assert headers["tailrace-schema-version"].decode() == event.schema_version
        assert msg.key() == b'{"pk":{"id":%d},"table":"shop.public.%s"}' % (
            (event.after.columns or event.before.columns)[0].value.int_value, event.table.encode())
    for table in ("orders", "items"):  # one partition per topic: source order per table
        got = [i for m, i in zip(msgs, ids(msgs), strict=True) if m.topic().endswith(table)]
        assert got == [e.id for e in events if e.table == table]
    assert sink.stored_position() is None  # no checkpoint beside the data in this tier


def test_a_rewound_exactly_once_sink_receives_again_what_it_had(noida_kafka: Any) -> None:
    """After an operator's rewind (generation 1) the checkpoint of generation 0 in the
    checkpoint topic no longer skips the replay; within generation 1 it is exactly-once."""
    prefix, pipeline = f"t{uuid.uuid4().hex[:8]}", f"p{uuid.uuid4().hex[:6]}"
    events = source_events(300)
    batches = batches_of(events, 100)
    sink = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True)
    for batch in batches * 2:  # the replay is skipped
        sink.write(batch, commit(batch, pipeline))
    for batch in batches * 2:  # rewound: written once more, and only once
        sink.write(batch, replace(commit(batch, pipeline), rewind=1))
    assert sink.stored_position(0, rewind=1) == batches[-1][-1].position
    sink.close()
    got = ids(read_topics(noida_kafka.bootstrap, prefix))
    assert len(got) == 2 * len(events) and set(Counter(got).values()) == {2}


def test_exactly_once_replay_is_skipped_and_the_checkpoint_reads_back(noida_kafka: Any) -> None:
    prefix, pipeline = f"t{uuid.uuid4().hex[:8]}", f"p{uuid.uuid4().hex[:6]}"
    events = source_events(900)
    batches = batches_of(events, 150)
    sink = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True)
    for batch in batches[:4]:
        sink.write(batch, commit(batch, pipeline))
    sink.close()
    # Crash after the Kafka commit, before the control checkpoint: the restarted sink reads
    # its checkpoint back read_committed and skips what the transaction already holds.
    restarted = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True, pipeline=pipeline)
    assert restarted.stored_position() == batches[3][-1].position
    for batch in batches:
        restarted.write(batch, commit(batch, pipeline))
    assert restarted.stored_position() == batches[-1][-1].position
    restarted.close()
    got = ids(read_topics(noida_kafka.bootstrap, prefix))
    assert len(got) == len(set(got)) == len(events)


def test_an_unfinished_transaction_is_invisible_and_aborted_on_restart(noida_kafka: Any) -> None:
    prefix, pipeline = f"t{uuid.uuid4().hex[:8]}", f"p{uuid.uuid4().hex[:6]}"
    batches = batches_of(source_events(300), 100)
    sink = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True)
    sink.write(batches[0], commit(batches[0], pipeline))
    # a crash inside the next write: produced, never committed
    writer = next(iter(sink._writers.values()))
    producer: Producer = writer._producer
    producer.begin_transaction()
    for event in batches[1]:
        producer.produce(f"{prefix}.{event.table}", b"half", b"k",
                         headers=[("tailrace-event-id", event.id.encode())])
    producer.flush(10)
    done, half = len(batches[0]), len(batches[1])
    assert len(read_topics(noida_kafka.bootstrap, prefix, "read_uncommitted")) == done + half
    assert len(read_topics(noida_kafka.bootstrap, prefix)) == done  # read_committed
    restarted = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True)
    for batch in batches:
        restarted.write(batch, commit(batch, pipeline))
    got = ids(read_topics(noida_kafka.bootstrap, prefix))
    assert sorted(got) == sorted(e.id for b in batches for e in b)
    restarted.close()
    sink.close()


def test_a_second_instance_fences_the_first_which_stops_fatally(noida_kafka: Any) -> None:
    prefix, pipeline = f"t{uuid.uuid4().hex[:8]}", f"p{uuid.uuid4().hex[:6]}"
    batches = batches_of(source_events(400), 100)
    first = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True)
    first.write(batches[0], commit(batches[0], pipeline))
    second = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True)
    second.write(batches[1], commit(batches[1], pipeline))  # init_transactions fences `first`
    with pytest.raises(FatalError) as caught:
        first.write(batches[2], commit(batches[2], pipeline))
    # the client reports the fence either as FENCED or, first, as a generic fatal error
    assert f"tailrace.{pipeline}.k1.0" in str(caught.value)
    second.write(batches[2], commit(batches[2], pipeline))
    second.write(batches[3], commit(batches[3], pipeline))
    got = ids(read_topics(noida_kafka.bootstrap, prefix))
    assert len(got) == len(set(got)) == 400  # nothing of the zombie's batch, nothing twice
    second.close()
    first.close()


def test_a_transaction_that_fills_the_local_queue_still_commits_its_checkpoint(
        noida_kafka: Any) -> None:
    # A source transaction goes whole into one sink write; one as large as librdkafka's
    # local queue (queue.buffering.max.messages, 100,000 by default) left no room for the
    # checkpoint record, the write failed every time, and the pipeline stood still. Here
    # the queue holds 500 and linger keeps them queued until the checkpoint comes.
    prefix, pipeline = f"t{uuid.uuid4().hex[:8]}", f"p{uuid.uuid4().hex[:6]}"
    batch = source_events(500)
    sink = make_sink(noida_kafka.bootstrap, prefix, exactly_once=True,
                     client_config={"queue.buffering.max.messages": 500, "linger.ms": 500})
    sink.write(batch, commit(batch, pipeline))
    assert sink.stored_position() == batch[-1].position
    sink.close()
    got = ids(read_topics(noida_kafka.bootstrap, prefix))
    assert sorted(got) == sorted(e.id for e in batch)


def test_too_large_messages_fail_alone_and_nothing_of_the_batch_commits(noida_kafka: Any
                                                                       ) -> None:
    prefix, pipeline = f"t{uuid.uuid4().hex[:8]}", f"p{uuid.uuid4().hex[:6]}"
    batch = source_events(10)
    batch[3].after.columns[2].value.text_value = "x" * 1_100_000
    rest = [e for i, e in enumerate(batch) if i != 3]  # what the runtime re-sends after the DLQ
    for exactly_once in (False, True):
        sink = make_sink(noida_kafka.bootstrap, prefix, exactly_once=exactly_once)
        with pytest.raises(PerEventError) as caught:
            sink.write(batch, commit(batch, pipeline))
        assert [i for i, _ in caught.value.failures] == [3]
        assert isinstance(caught.value, NonRetryableError)
        if not exactly_once:  # refused before anything is sent
            assert messages_in(noida_kafka.bootstrap, prefix) == 0
        else:  # each message produced once encoded, the transaction aborted at its end;
            sink.write(rest, commit(rest, pipeline))  # the writer goes on after the abort
        sink.close()
    got = ids(read_topics(noida_kafka.bootstrap, prefix))  # read_committed
    assert sorted(got) == sorted(e.id for e in rest)  # nothing of the refused batches
    everything = ids(read_topics(noida_kafka.bootstrap, prefix, "read_uncommitted"))
    assert batch[3].id not in everything  # the too-large message never left the client
    assert len(everything) <= 2 * len(rest)  # the aborted ones, at most once each


def test_broker_outage_is_retryable_and_recovers_exactly_once(make_noida_kafka: Any) -> None:
    broker = make_noida_kafka()
    prefix, pipeline = f"t{uuid.uuid4().hex[:8]}", "outage"
    batches = batches_of(source_events(300), 100)
    sink = make_sink(broker.bootstrap, prefix, exactly_once=True, timeout_s=3)
    sink.write(batches[0], commit(batches[0], pipeline))
    broker.stop(keep_data=True)
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        sink.write(batches[1], commit(batches[1], pipeline))
    assert isinstance(caught.value, RetryableError), caught.value
    assert time.monotonic() - started < 15
    broker.start()
    for batch in batches:  # the runtime retries from its (older) checkpoint
        for attempt in range(10):
            try:
                sink.write(batch, commit(batch, pipeline))
                break
            except Exception as e:
                assert isinstance(e, RetryableError), e
                assert attempt < 9
                time.sleep(0.5)
    got = ids(read_topics(broker.bootstrap, prefix))
    assert len(got) == len(set(got)) == 300
    sink.close()
