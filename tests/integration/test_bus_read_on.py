"""A kept bus reader (delivery's, one per worker and partition) reads a range that starts
where its last one ended on from what its consumer fetched meanwhile, records written since
included, and any other start, a rewind, from the broker again: every record once, in order."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from tailrace.bus import BusReader, ensure_topic, producer_config

pytestmark = pytest.mark.integration


def _read(reader: BusReader, start: int, end: int) -> list[tuple[int, bytes]]:
    chunks = reader.read_range(0, start, end, timeout_s=30, chunk=7, read_on=True)
    return [(o, v) for offsets, values in chunks for o, v in zip(offsets, values, strict=True)]


def test_a_kept_reader_reads_on_then_rewinds(kafka_broker: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    topic = f"tailrace.t{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_broker.bootstrap, topic, 1)
    producer = Producer(producer_config(kafka_broker.bootstrap, "test"))

    def write(first: int, last: int) -> None:  # a batch each: the test broker gives a
        for n in range(first, last):  # partition's end as one past its last batch's start
            producer.produce(topic, value=b"%d" % n, partition=0)
            assert producer.flush(10) == 0

    write(0, 50)
    with BusReader(kafka_broker.bootstrap, topic) as reader:
        assigned: list[dict[int, int]] = []
        assign = reader.assign
        monkeypatch.setattr(reader, "assign", lambda starts: (assigned.append(dict(starts)),
                                                              assign(starts)))
        assert _read(reader, 0, 20) == [(n, b"%d" % n) for n in range(20)]
        assert _read(reader, 20, 50) == [(n, b"%d" % n) for n in range(20, 50)]
        write(50, 80)  # after the reader's fetch reached the partition's end
        assert _read(reader, 50, 80) == [(n, b"%d" % n) for n in range(50, 80)]
        assert assigned == [{0: 0}]  # read on each time
        assert _read(reader, 10, 30) == [(n, b"%d" % n) for n in range(10, 30)]
        assert _read(reader, 30, 35) == [(n, b"%d" % n) for n in range(30, 35)]
        assert assigned == [{0: 0}, {0: 10}]
