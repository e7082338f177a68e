"""`produce_all`: every message once, in order, and a full local queue waited out (served
by `poll`) rather than a message skipped or produced twice."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaException

from tailrace_services.delivery.sinks._kafka_tx import DeliveryErrors, Message, produce_all


class QueueOf:
    """A producer whose local queue holds `room` messages until `poll` sends them."""

    def __init__(self, room: int) -> None:
        self.room, self.queued, self.sent = room, 0, []  # type: list[bytes]
        self.polls = 0

    def produce(self, topic: str, value: bytes | None, key: bytes, **_: Any) -> None:
        if self.queued >= self.room:
            raise BufferError("Local: Queue full")
        self.queued += 1
        self.sent.append(key)

    def poll(self, timeout: float) -> int:
        self.polls += 1
        self.queued = 0
        return 0


def messages(count: int) -> list[tuple[int, Message]]:
    return [(i, Message("t", str(i).encode(), b"v", [])) for i in range(count)]


def test_a_full_queue_is_waited_out_and_every_message_produced_once_in_order() -> None:
    producer = QueueOf(room=3)
    errors: DeliveryErrors = {}
    produce_all(producer, messages(10), errors, timeout_s=5)  # type: ignore[arg-type]
    assert producer.sent == [str(i).encode() for i in range(10)]
    assert producer.polls == 3 and errors == {}


def test_a_queue_that_stays_full_fails_the_message_it_stopped_at() -> None:
    producer = QueueOf(room=2)
    producer.poll = lambda timeout: 0  # type: ignore[method-assign]  # nothing ever leaves
    errors: DeliveryErrors = {}
    with pytest.raises(KafkaException, match="stayed full"):
        produce_all(producer, messages(5), errors, timeout_s=0.2)  # type: ignore[arg-type]
    assert producer.sent == [b"0", b"1"] and list(errors) == [2]
