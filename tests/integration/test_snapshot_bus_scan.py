"""After a kill -9 during a reset read on a bus of two partitions: the restart's scan
(`recovery.BusScan`) finds the chunk's read transaction whole on one partition, and
finds, or misses, its TRUNCATE on the other; `settle` counts the chunk done only with
both. The bus holds what a killed capture would have left (records written here with
the product's encoders), so the loss is exact rather than timed."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from tailrace.bus import ensure_topic
from tailrace.config import parse_pipeline
from tailrace.events import bus_key, encode_event
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import ChangeEvent, Column, Op, Position, Row, Value
from tailrace_services.capture.snapshot import TablePlan
from tailrace_services.capture.snapshot.recovery import BusScan, settle

pytestmark = pytest.mark.integration

SPEC = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  source: {{type: postgres, id: {name}, dsn: "postgresql://u@127.0.0.1/db", tables: [public.t]}}
  sinks: [{{id: r1, type: redis, url: "redis://127.0.0.1:6379/0"}}]
  bus: {{brokers: "{brokers}", partitions: 2}}
"""


def _event(op: int, tx_seq: int, index: int, size: int, key: int | None) -> ChangeEvent:
    event = ChangeEvent(source_id="s", database="db", schema="public", table="t", op=op,
                        key_columns=["id"], position=Position(tx_seq=tx_seq, event_index=index),
                        tx_size=size, tx_index=index)
    if key is not None:
        event.after.CopyFrom(Row(columns=[Column(name="id", value=Value(int_value=key))]))
        event.snapshot.request_id = 7
    return event


def _publish(brokers: str, topic: str, events: list[tuple[int, ChangeEvent]]) -> None:
    producer = Producer({"bootstrap.servers": brokers})
    for partition, event in events:
        producer.produce(topic, encode_event(event), key=bus_key(event), partition=partition)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("truncate_landed", [False, True])
def test_a_reset_chunk_is_done_only_with_its_truncate_on_the_bus(
        kafka_broker: Any, truncate_landed: bool) -> None:
    name = f"scan{uuid.uuid4().hex[:8]}"
    pipeline = parse_pipeline(SPEC.format(name=name, brokers=kafka_broker.bootstrap))
    ensure_topic(kafka_broker.bootstrap, pipeline.bus_topic, 2)
    truncate = (0, _event(Op.OP_TRUNCATE, 11, 0, 1, None))
    reads = [(1, _event(Op.OP_SNAPSHOT_READ, 12, i, 3, key)) for i, key in enumerate((1, 2, 3))]
    _publish(kafka_broker.bootstrap, pipeline.bus_topic,
             ([truncate] if truncate_landed else []) + reads)
    entry = pb.SnapshotTable(table="public.t", request_id=7, reset=True, inflight=[
        pb.SnapshotChunk(chunk=1, tx_seq=12, rows=3, last=True, cleared_tx_seq=11)])

    found = BusScan(pipeline, None).find(entry, TablePlan("public.t", ("id",)), epoch=None)  # type: ignore[arg-type]
    settled = settle(entry, covered=0, found=found)

    print(f"\nread transaction: {len(found.reads[12].keys)} of 3 rows on partition "
          f"{sorted(found.reads[12].ranges)}; TRUNCATE found: {sorted(found.truncates)}; "
          f"chunks done: {[c.chunk for c in settled.done]}")
    assert found.reads[12].whole
    if truncate_landed:
        assert found.truncates == {11}
        assert [c.chunk for c in settled.done] == [1]
    else:
        assert found.truncates == set()
        assert settled.done == [], "the rows deleted during the loss would stay in the sinks"
        assert settled.exclude == set()


def _publish_at(brokers: str, topic: str, events: list[tuple[int, ChangeEvent]]
                ) -> dict[int, int]:
    """Publish; where each partition ends after them (the next offset)."""
    ends: dict[int, int] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        ends[message.partition()] = max(ends.get(message.partition(), 0), message.offset() + 1)

    producer = Producer({"bootstrap.servers": brokers})
    for partition, event in events:
        producer.produce(topic, encode_event(event), key=bus_key(event), partition=partition,
                         on_delivery=delivered)
    assert producer.flush(30) == 0
    return ends


def test_a_chunk_an_epoch_covers_past_a_chunk_not_done_is_found_for_its_keys(
        kafka_broker: Any, control: Any) -> None:
    """Ranges read on two connections: chunk 3's read transaction reached the bus, and an
    epoch covers it, while chunk 2 (read on the other connection) never got there; then
    capture was killed. The cursor must stay before chunk 2, and chunk 3's keys, which the
    epoch rule alone would not name, are found on the bus between the epochs around it."""
    name = f"scan{uuid.uuid4().hex[:8]}"
    pipeline = parse_pipeline(SPEC.format(name=name, brokers=kafka_broker.bootstrap))
    ensure_topic(kafka_broker.bootstrap, pipeline.bus_topic, 2)
    client = control.client

    def epoch(epoch_id: int, tx_seq: int, ends: dict[int, int]) -> pb.Epoch:
        recorded = pb.Epoch(source_id=name, epoch_id=epoch_id, position=Position(tx_seq=tx_seq),
                            end_offsets={p: ends.get(p, 0) for p in (0, 1)})
        client.record_epoch(recorded)
        return recorded

    ends = _publish_at(kafka_broker.bootstrap, pipeline.bus_topic,
                       [(0, _event(Op.OP_INSERT, 5, 0, 1, 100))])
    epoch(1, 5, ends)
    reads = [(i % 2, _event(Op.OP_SNAPSHOT_READ, 12, i, 3, key))
             for i, key in enumerate((7, 8, 9))]
    ends = {**ends, **_publish_at(kafka_broker.bootstrap, pipeline.bus_topic,
                                  [*reads, (0, _event(Op.OP_INSERT, 13, 0, 1, 101))])}
    latest = epoch(2, 13, ends)
    entry = pb.SnapshotTable(table="public.t", request_id=7, chunks_done=1, cursor='["3"]',
                             inflight=[pb.SnapshotChunk(chunk=3, tx_seq=12, rows=3,
                                                        cursor='["9"]')])

    found = BusScan(pipeline, client).find(entry, TablePlan("public.t", ("id",)), latest)
    settled = settle(entry, covered=13, found=found)

    assert settled.done == [], "chunk 2 is not done: the cursor may not pass it"
    assert settled.exclude == {(Value(int_value=k).SerializeToString(),) for k in (7, 8, 9)}
    assert [c.chunk for c in settled.partial] == [3]
    print(f"\nchunk 3 found between epochs 1 and 2: {len(found.reads[12].keys)} keys on "
          f"partitions {sorted(found.reads[12].ranges)}")
