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

    found = BusScan(pipeline).find(entry, TablePlan("public.t", ("id",)), epoch=None)
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
