"""The Kafka sink's stored checkpoint is read from the checkpoint topic's end, going further
back only while its key is not found: the same answer as reading the whole topic, at a cost
that does not grow with every batch the topic has kept; through a cut link, the read gives
up once no broker has answered for DOWN_S, not at its timeout."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tailrace.proto.event_pb2 import Position
from tailrace_services.delivery.sinks import _kafka_tx
from tailrace_services.delivery.sinks._kafka_tx import DOWN_S, read_checkpoint

pytestmark = pytest.mark.integration


def test_the_latest_committed_record_of_a_key_is_found_however_far_back_it_lies(
        noida_kafka: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kafka_tx, "CHECKPOINT_TAIL", 4)  # widened several times below
    brokers = noida_kafka.bootstrap
    topic = f"ckpt-{uuid.uuid4().hex[:8]}"
    noida_kafka.create_topic(topic, config={"cleanup.policy": "compact"})

    def position(n: int) -> bytes:
        return Position(tx_seq=n).SerializeToString()

    plain = Producer({"bootstrap.servers": brokers, "enable.idempotence": True})
    plain.produce(topic, position(1), b"early")  # once, at the start
    plain.produce(topic, position(2), b"gone")
    plain.produce(topic, None, b"gone")  # a tombstone: no checkpoint
    for n in range(1, 301):  # a busy writer's batches
        plain.produce(topic, position(n), b"busy")
        if n % 50 == 0:
            plain.produce(topic, position(n), b"now and then")
    assert plain.flush(30) == 0
    aborted = Producer({"bootstrap.servers": brokers, "transactional.id": f"t-{topic}"})
    aborted.init_transactions(30)
    aborted.begin_transaction()
    aborted.produce(topic, position(999), b"busy")  # never committed: not a checkpoint
    aborted.flush(30)
    aborted.abort_transaction(30)

    client = {"bootstrap.servers": brokers}
    assigned: list[int] = []  # where each reading consumer started

    class Recording(Consumer):  # type: ignore[misc]  # confluent-kafka's C type, subclassable
        def assign(self, partitions: list[TopicPartition]) -> None:
            assigned.extend(tp.offset for tp in partitions)
            super().assign(partitions)

    monkeypatch.setattr(_kafka_tx, "Consumer", Recording)

    def read(key: bytes) -> int | None:
        stored = read_checkpoint(client, topic, key, 30)
        return stored.tx_seq if stored is not None else None

    assert read(b"busy") == 300, "the last committed record, not the aborted one after it"
    assert assigned and min(assigned) > 0, f"read from the topic's start: {assigned}"
    assert read(b"now and then") == 300
    assert read(b"early") == 1, "found at the topic's start"
    assert read(b"gone") is None, "the latest record of the key is a tombstone"
    assert read(b"never") is None, "a key the topic does not hold"


def test_a_kept_writer_sees_that_the_checkpoint_topic_lost_its_last_record(
        noida_kafka: Any) -> None:
    """A writer kept across batches knows its stored checkpoint from memory; a topic that
    lost its records (its broker came back empty) shows in its high watermark."""
    from confluent_kafka.admin import AdminClient

    from tailrace_services.delivery.sinks._kafka_tx import TransactionalWriter
    from tailrace_services.delivery.sinks.base import BatchCommit

    brokers = noida_kafka.bootstrap
    topic = f"ckpt-{uuid.uuid4().hex[:8]}"
    noida_kafka.create_topic(topic, config={"cleanup.policy": "compact"})
    client = {"bootstrap.servers": brokers}
    writer = TransactionalWriter(client, {**client, "enable.idempotence": True, "acks": "all"},
                                 f"t-{topic}", topic, "p/k/0", 30)
    try:
        assert writer.stored is None and writer.holds_last()  # nothing written yet
        for n in (5, 6):
            writer.write([], BatchCommit(pipeline="p", source_id="s", sink_id="k",
                                         position=Position(tx_seq=n), partition=0), {})
        assert writer.stored is not None and writer.stored.tx_seq == 6
        assert writer.holds_last()
        admin = AdminClient(client)
        admin.delete_topics([topic], operation_timeout=10)[topic].result(15)
        noida_kafka.create_topic(topic, config={"cleanup.policy": "compact"})
        assert not writer.holds_last(), "the topic lost the writer's last record"
        writer.read_stored()
        assert writer.stored is None, "read back, the lost checkpoint is gone"
    finally:
        writer.close()


def test_a_checkpoint_read_through_a_cut_link_gives_up_once_no_broker_answers(
        proxied_broker: Any) -> None:
    """An exactly-once sink reads its checkpoint back with each new writer, and a kept one
    every CHECKPOINT_RECHECK_S. librdkafka waits out a metadata request's whole timeout
    (30 s) while connections are refused, so a cut found there kept its batch, and `/ready`,
    from naming the sink for over 30 s (a CI run's network-cut test saw `ready 200` for
    all of its 30 s cut)."""
    _, proxy = proxied_broker
    topic = f"ckpt-{uuid.uuid4().hex[:8]}"
    client = {"bootstrap.servers": f"127.0.0.1:{proxy.port}"}
    plain = Producer(client)
    plain.produce(topic, Position(tx_seq=7).SerializeToString(), b"p/k/0")
    assert plain.flush(30) == 0
    stored = read_checkpoint(client, topic, b"p/k/0", 30)
    assert stored is not None and stored.tx_seq == 7, "read through the link while it is up"
    proxy.cut()
    started = time.monotonic()
    with pytest.raises(KafkaException, match="no broker reachable for"):
        read_checkpoint(client, topic, b"p/k/0", 30)
    took = time.monotonic() - started
    assert took < DOWN_S + 5, f"gave up after {took:.1f} s, not once no broker answered"
    proxy.restore()
    stored = read_checkpoint(client, topic, b"p/k/0", 30)
    assert stored is not None and stored.tx_seq == 7, "read again once the link is back"
