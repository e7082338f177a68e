"""Where to resume: the minimum sink checkpoint, or later when the bus provably has more.

Sinks checkpoint behind the bus. Resuming at the checkpoint alone would
publish again every transaction the bus already holds (after a kill -9 of
capture that is everything since the last delivery). So on start:

1. the latest epoch recorded in the control service is trusted only if its
   marker is still on the bus at the recorded offset (a broker that lost its
   data, or a recreated topic, fails this — then we resume at the checkpoint,
   which is what guarantees no loss even with a lost bus);
2. with one partition (the default), the records after that marker are read
   to the end: the last event ending a transaction (`tx_end`) marks the last
   transaction the broker has whole — a partition keeps the producer's order,
   so everything before it is there too. A transaction cut by the kill has no
   `tx_end` and is published again, whole.

The result is the position to continue from; its `tx_seq` continues from
there. With several partitions only step 1 is used (per-partition order does
not order partitions among themselves).
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from tailrace.bus import consumer_config
from tailrace.events import decode_record
from tailrace.logs import get_logger
from tailrace.proto.control_pb2 import Epoch
from tailrace.proto.event_pb2 import Position

__all__ = ["published_tail"]

log = get_logger(__name__)


def published_tail(brokers: str, topic: str, partitions: int, source_id: str,
                   epoch: Epoch | None, timeout_s: float = 20.0) -> Position | None:
    """The position of the last transaction the bus holds whole, or None when unknown."""
    config = consumer_config(brokers, f"tailrace-capture-tail-{source_id}")
    config.update({"enable.partition.eof": True, "isolation.level": "read_uncommitted"})
    consumer = Consumer(config)
    try:
        if epoch is not None:
            present = _marker_present(consumer, topic, partitions, epoch, timeout_s)
            if present is False:
                log.warning("the latest epoch's marker is not on the bus; resuming from the "
                            "sinks' checkpoint", epoch=epoch.epoch_id)
                return None
            if present is None:  # could not tell in time: the epoch is what we know
                return epoch.position
        best = epoch.position if epoch is not None else None
        if partitions != 1:
            return best
        start = epoch.end_offsets.get(0, 0) if epoch is not None else 0
        tail = _last_complete(consumer, topic, start, source_id, timeout_s)
        return tail if tail is not None else best
    finally:
        consumer.close()


def _marker_present(consumer: Consumer, topic: str, partitions: int, epoch: Epoch,
                    timeout_s: float) -> bool | None:
    """True / False, or None when the bus did not answer in time."""
    for partition in range(partitions):
        end = epoch.end_offsets.get(partition)
        if not end:
            return False
        consumer.assign([TopicPartition(topic, partition, end - 1)])
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                return None
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return False  # nothing at that offset: the bus lost it
                continue
            record = decode_record(msg.value())
            if record.WhichOneof("record") != "epoch":
                return False
            if record.epoch.epoch_id != epoch.epoch_id or record.epoch.source_id != \
                    epoch.source_id:
                return False
            break
    return True


def _last_complete(consumer: Consumer, topic: str, start: int, source_id: str,
                   timeout_s: float) -> Position | None:
    consumer.assign([TopicPartition(topic, 0, start)])
    deadline = time.monotonic() + timeout_s
    last: Position | None = None
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return last
            log.warning("cannot read the bus tail", error=err.str())
            return None
        record = decode_record(msg.value())
        if record.WhichOneof("record") == "event":
            ev = record.event
            if ev.source_id == source_id and ev.tx_end:
                last = Position()
                last.CopyFrom(ev.position)
        elif record.WhichOneof("record") == "epoch" and record.epoch.source_id == source_id:
            last = Position()
            last.CopyFrom(record.epoch.position)
    log.warning("reading the bus tail timed out; resuming from the latest epoch")
    return None
