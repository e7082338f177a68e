"""A bus that lost its records is told within seconds, not after a timeout: delivery's read
of a range the partition no longer reaches fails after GONE_AFTER_S, and capture asks the bus
whether it lost what it held as soon as an epoch waits BUS_SUSPECT_S for its
acknowledgement (a broker restarted empty never acknowledges the old producer again)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from tailrace.bus import BusRangeGone, BusReader, ensure_topic, producer_config
from tailrace.devservers import KafkaBroker
from tailrace.errors import RetryableError
from tailrace.links import LINKS
from tailrace_services.capture.publisher import BUS_CHECK_S, BUS_SUSPECT_S, BusPublisher
from tests.fix_capture import Control
from tests.fix_delivery import synthetic_tx

pytestmark = pytest.mark.integration


def test_a_range_the_partition_no_longer_reaches_fails_within_seconds(kafka_broker: Any) -> None:
    topic = f"tailrace.t{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_broker.bootstrap, topic, 1)
    producer = Producer(producer_config(kafka_broker.bootstrap, "test"))
    for n in range(3):  # a batch each: the test broker's end of a partition is one past
        producer.produce(topic, value=b"%d" % n, partition=0)  # its last batch's start
        assert producer.flush(10) == 0
    with BusReader(kafka_broker.bootstrap, topic) as reader:
        read = [o for offsets, _ in reader.read_range(0, 1, 3, timeout_s=60) for o in offsets]
        assert read == [1, 2]
        with pytest.raises(BusRangeGone) as caught:  # not a TimeoutError after 60 s
            list(reader.read_range(0, 1, 10, timeout_s=60))
    assert str(caught.value) == (f"bus {topic}[0] ends at offset 3, before offsets 3..10 "
                                 "planned from records it acknowledged: the bus lost them")


def test_a_publisher_whose_bus_restarted_empty_says_so_once_an_epoch_waits(
        control: Control) -> None:
    topic = f"tailrace.t{uuid.uuid4().hex[:8]}"
    with KafkaBroker() as broker:
        ensure_topic(broker.bootstrap, topic, 1)
        publisher = BusPublisher(broker.bootstrap, topic, 1, "syn", control.client, epoch_ms=0)
        try:
            publisher.publish_transaction(synthetic_tx(1, [1, 2, 3]))
            publisher.drain()  # epoch 1 recorded
            assert control.client.latest_epoch("syn").epoch_id == 1
            broker.restart()  # in memory: the topic and its records are gone
            publisher.publish_transaction(synthetic_tx(2, [1, 2, 3]))
            with pytest.raises(RetryableError) as caught:
                publisher.drain()
            # meanwhile /ready named the bus (`tailrace.links`) ...
            assert [b.link for b in LINKS.broken()] == [f"bus at {broker.bootstrap}"]
        finally:
            publisher.abort()
        assert LINKS.broken() == []  # ... until the session gave up on it
    assert str(caught.value) == (
        f"the bus lost what this source published (epoch 2 not acknowledged within "
        f"{BUS_SUSPECT_S:.0f} s); starting again to republish from the sinks' checkpoint")


def test_an_epoch_recorded_puts_off_the_idle_check_of_the_bus(
        kafka_broker: Any, control: Control, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet source's publisher reads the bus every BUS_CHECK_S (~0.5 s, the source's next
    transaction waiting behind it); an epoch the control service recorded is that check
    already (it refuses offsets behind the latest epoch's), so a source writing a few
    transactions a second is not held up every 10 s."""
    topic = f"tailrace.t{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_broker.bootstrap, topic, 1)
    publisher = BusPublisher(kafka_broker.bootstrap, topic, 1, "syn", control.client, epoch_ms=0)
    checks: list[str] = []
    monkeypatch.setattr(publisher, "_check_bus",
                        lambda why, unanswered_is_fine=False: checks.append(why))
    try:
        publisher._bus_checked_at -= BUS_CHECK_S  # checked long ago
        publisher.tick()
        assert checks == ["checked while idle"]
        publisher._bus_checked_at -= BUS_CHECK_S
        publisher.publish_transaction(synthetic_tx(1, [1, 2, 3]))
        publisher.drain()  # epoch 1 recorded
        assert control.client.latest_epoch("syn").epoch_id == 1
        publisher.tick()
        assert checks == ["checked while idle"], "the recorded epoch was the check"
    finally:
        publisher.abort()
