"""`BrokerReach`: a Kafka call gives up early only while no broker answers (pure logic; the
cut itself: tests/chaos/test_network_cuts.py[sink-kafka])."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from tailrace_services.delivery.sinks import _kafka_tx
from tailrace_services.delivery.sinks._kafka_tx import DOWN_S, BrokerReach


class Producer:
    """What `wait` and `check` call on a producer: flush (messages left), poll, metadata."""

    def __init__(self, left: list[int], answers: bool) -> None:
        self.left, self.answers, self.asked = left, answers, 0

    def flush(self, timeout: float) -> int:
        return self.left.pop(0) if len(self.left) > 1 else self.left[0]

    def poll(self, timeout: float) -> int:
        return 0

    def list_topics(self, timeout: float) -> Any:
        self.asked += 1
        if not self.answers:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))
        return object()


def down_long_ago(reach: BrokerReach) -> None:
    reach.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert reach.down_since is not None
    reach.down_since -= DOWN_S + 1


@pytest.fixture(autouse=True)
def short_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kafka_tx, "_SLICE_S", 0.01)


def test_brokers_that_answer_metadata_are_not_given_up_on() -> None:
    """An all-brokers-down report (an idle connection the broker closed) and then a slow
    flush: the brokers answer a metadata request, so the call goes on."""
    reach, producer = BrokerReach(), Producer([3, 3, 0], answers=True)
    down_long_ago(reach)
    assert reach.wait(producer, producer.flush, 5.0) == 0  # type: ignore[arg-type]
    assert producer.asked >= 1 and reach.down_since is None


def test_brokers_that_stay_down_end_the_call_early_naming_it() -> None:
    reach, producer = BrokerReach(), Producer([3], answers=False)
    down_long_ago(reach)
    started = time.monotonic()
    with pytest.raises(KafkaException, match="no broker reachable for"):
        reach.wait(producer, producer.flush, 30.0)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5


def test_messages_going_out_show_the_brokers_answer() -> None:
    reach, producer = BrokerReach(), Producer([5, 4, 0], answers=False)
    reach.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert reach.wait(producer, producer.flush, 5.0) == 0  # type: ignore[arg-type]
    assert reach.down_since is None


class Unanswered:
    """A metadata request that times out `misses` times before it is answered; its `poll`
    serves an all-brokers-down report when given a `reach`."""

    def __init__(self, misses: int, reach: BrokerReach | None = None) -> None:
        self.misses, self.reach, self.asked = misses, reach, 0

    def poll(self, timeout: float) -> None:
        if self.reach is not None:
            self.reach.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))

    def list_topics(self, timeout: float) -> str:
        self.asked += 1
        if self.asked <= self.misses:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))
        return "metadata"


def in_30_s() -> float:
    return time.monotonic() + 30.0


def test_a_read_asked_again_is_answered_when_no_broker_was_reported_down() -> None:
    reach, client = BrokerReach(), Unanswered(misses=3)
    assert reach.read_in_slices(client, client.list_topics, in_30_s()) == "metadata"  # type: ignore[arg-type]
    assert client.asked == 4


def test_a_slow_answer_gets_longer_tries_until_one_waits_long_enough() -> None:
    """A slow link that is up: an answer comes 0.5 s after its request, later than a slice;
    each new try asks again from the start, so the tries grow until one waits long enough."""
    reach, waited = BrokerReach(), []

    def slow_metadata(timeout: float) -> str:
        waited.append(timeout)
        if timeout < 0.5:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get metadata"))
        return "metadata"

    assert reach.read_in_slices(Unanswered(0), slow_metadata, in_30_s()) == "metadata"  # type: ignore[arg-type]
    assert waited == sorted(waited) and waited[-1] >= 0.5 and len(waited) < 10, waited


def test_a_read_gives_up_once_every_broker_has_been_down_for_down_s() -> None:
    reach = BrokerReach()
    client = Unanswered(misses=10**6, reach=reach)
    down_long_ago(reach)
    with pytest.raises(KafkaException, match="no broker reachable for"):
        reach.read_in_slices(client, client.list_topics, in_30_s())  # type: ignore[arg-type]
    assert client.asked == 1


def test_other_errors_of_a_read_are_raised_at_once() -> None:
    reach = BrokerReach()

    def refused(timeout: float) -> None:
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"))

    with pytest.raises(KafkaException, match="denied"):
        reach.read_in_slices(Unanswered(0), refused, in_30_s())  # type: ignore[arg-type]


class Reader:
    """A checkpoint reader's consumer: `moves` batches of one record each, then none; its
    metadata request never answered (a broker slow to answer, or gone)."""

    def __init__(self, moves: int) -> None:
        self.moves, self.offset = moves, 0

    def assign(self, partitions: list[Any]) -> None:
        pass

    def consume(self, n: int, timeout: float) -> list[Any]:
        if self.offset >= self.moves:
            return []
        self.offset += 1

        class Record:
            def error(self) -> None:
                return None

            def key(self) -> bytes:
                return b"p/k/0"

            def value(self) -> bytes:
                return b"stored"
        return [Record()]

    def position(self, partitions: list[Any]) -> list[Any]:
        return [TopicPartition(tp.topic, tp.partition, self.offset) for tp in partitions]

    def list_topics(self, timeout: float) -> Any:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))


def test_a_checkpoint_read_that_moves_is_not_ended_by_a_stale_down_report() -> None:
    """An all-brokers-down report from before (an idle connection closed) must not end a
    read whose records keep coming, even if a metadata request would be slow."""
    reach = BrokerReach()
    down_long_ago(reach)
    found = _kafka_tx._last_value(Reader(moves=3), reach, "ckpt", b"p/k/0", {0: 0}, {0: 3},  # type: ignore[arg-type]
                                  time.monotonic() + 30, 30)
    assert found == (True, b"stored")


def test_a_checkpoint_read_that_does_not_move_gives_up_once_no_broker_answers() -> None:
    reach = BrokerReach()
    down_long_ago(reach)
    started = time.monotonic()
    with pytest.raises(KafkaException, match="no broker reachable for"):
        _kafka_tx._last_value(Reader(moves=0), reach, "ckpt", b"p/k/0", {0: 0}, {0: 3},  # type: ignore[arg-type]
                              time.monotonic() + 30, 30)
    assert time.monotonic() - started < 5
