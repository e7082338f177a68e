"""The internal topic: producer/consumer settings shared by capture and delivery.

One record per change (`BusRecord.event`, keyed by primary key) and, after a
transaction ends, one `BusRecord.epoch` marker per partition. The broker's
"latest offset" answer is not trusted (some Kafka-protocol brokers get it
wrong); readers plan from the epoch offsets recorded in the control service.
"""

from __future__ import annotations

import zlib
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tailrace.errors import RetryableError


def producer_config(brokers: str, client_id: str) -> dict[str, Any]:
    """Idempotent producer: retries never duplicate or reorder within a partition."""
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
    }


def consumer_config(brokers: str, group: str) -> dict[str, Any]:
    """Manual assignment, no auto commit: positions live in the control service."""
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
    }


def partition_for(key: bytes, partitions: int) -> int:
    """Stable key -> partition, computed by us so every producer agrees."""
    return 0 if partitions == 1 else zlib.crc32(key) % partitions


def ensure_topic(brokers: str, topic: str, partitions: int, timeout: float = 15.0) -> None:
    """Create the internal topic if missing; an existing topic with fewer partitions is an error."""
    admin = AdminClient({"bootstrap.servers": brokers})
    try:
        meta = admin.list_topics(timeout=timeout)
    except KafkaException as e:
        raise RetryableError(f"bus at {brokers} is unreachable: {e}") from None
    existing = meta.topics.get(topic)
    if existing is not None and existing.error is None:
        have = len(existing.partitions)
        if have < partitions:
            raise RetryableError(
                f"bus topic {topic!r} has {have} partitions but bus.partitions is {partitions}; "
                "delete the topic or lower bus.partitions")
        return
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                            replication_factor=1)])
    for fut in futures.values():
        try:
            fut.result(timeout)
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise RetryableError(f"cannot create bus topic {topic!r}: {e}") from None
