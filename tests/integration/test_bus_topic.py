"""The internal topic: created as the spec says; one with too few partitions is a
configuration error naming `spec.bus.partitions`, the topic and both counts (waiting
cannot fix it)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from tailrace.bus import ensure_topic
from tailrace.errors import ConfigError

pytestmark = pytest.mark.integration


def partitions_of(brokers: str, topic: str) -> int:
    meta = AdminClient({"bootstrap.servers": brokers}).list_topics(topic, timeout=10)
    return len(meta.topics[topic].partitions)


def test_a_topic_with_too_few_partitions_is_a_config_error(kafka_broker: Any) -> None:
    topic = f"tailrace.t{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_broker.bootstrap, topic, 1)
    assert partitions_of(kafka_broker.bootstrap, topic) == 1
    ensure_topic(kafka_broker.bootstrap, topic, 1)  # as it is: nothing to do
    with pytest.raises(ConfigError) as caught:
        ensure_topic(kafka_broker.bootstrap, topic, 3)
    assert str(caught.value).startswith(
        f"spec.bus.partitions is 3 but bus topic {topic!r} has 1 partition(s); set "
        "spec.bus.partitions to 1")
