"""The bus as a Spark streaming source (Python Data Source API).

`initialOffset`, `latestOffset`, `partitions` and `commit` run in Spark's
long-lived planner process: they share nothing with the driver script and
ask the control service. The start is the least advanced sink checkpoint;
the end of each batch is the latest epoch, a cut that never splits a
transaction. `read` runs in executor workers: one bus partition = one Spark
partition = one task, read with a confluent-kafka consumer, yielded as Arrow.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

SCHEMA = StructType([
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("value", BinaryType(), False),
])
ARROW_SCHEMA = pa.schema([
    pa.field("partition", pa.int32(), False),
    pa.field("offset", pa.int64(), False),
    pa.field("value", pa.binary(), False),
])
ARROW_CHUNK = 4096


class BusPartition(InputPartition):
    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__(partition)
        self.partition, self.start, self.end = partition, start, end


class BusDataSource(DataSource):
    """Options: brokers, topic, partitions, control, source_id, sink_ids (comma separated)."""

    @classmethod
    def name(cls) -> str:
        return "tailrace_bus"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return BusStreamReader(self.options)


def _offsets(d: dict[str, Any]) -> dict[int, int]:
    return {int(k): int(v) for k, v in d.items()}


class BusStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.brokers = options["brokers"]
        self.topic = options["topic"]
        self.num_partitions = int(options.get("partitions", "1"))
        self.control_address = options["control"]
        self.source_id = options["source_id"]
        self.sink_ids = [s for s in options.get("sink_ids", "").split(",") if s]
        self.max_events = int(options.get("max_events", "0")) or None
        self._control: Any = None
        self._cursor = 0  # an epoch id at or before the planned start

    def _client(self) -> Any:
        if self._control is None:
            from tailrace.control_client import ControlClient

            self._control = ControlClient(self.control_address)
        return self._control

    def initialOffset(self) -> dict:
        cp = self._client().minimum_checkpoint(self.source_id, self.sink_ids)
        start = {p: 0 for p in range(self.num_partitions)}
        if cp is not None:
            start.update(_offsets(dict(cp.bus_offsets)))
        return {str(p): o for p, o in start.items()}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """The furthest epoch past `start` that keeps the batch within `max_events`
        (at least one epoch, however large: a transaction is never split)."""
        begin = _offsets(start) if start else _offsets(self.initialOffset())
        end = self._plan(begin)
        # Never behind the start: an epoch older than a sink checkpoint plans nothing.
        return {str(p): max(end.get(p, 0), begin.get(p, 0)) for p in range(self.num_partitions)}

    def _plan(self, begin: dict[int, int]) -> dict[int, int]:
        client = self._client()
        if self.max_events is None:
            latest = client.latest_epoch(self.source_id)
            return _offsets(dict(latest.end_offsets)) if latest is not None else begin
        chosen: dict[int, int] | None = None
        after = self._cursor
        while True:
            page = client.epoch_range(self.source_id, after, 0, 1000)
            for epoch in page:
                end = _offsets(dict(epoch.end_offsets))
                if all(end.get(p, 0) <= o for p, o in begin.items()):
                    self._cursor = epoch.epoch_id  # at or before the start
                    continue
                size = sum(max(end.get(p, 0) - begin.get(p, 0), 0) for p in begin)
                if chosen is not None and size > self.max_events:
                    return chosen
                chosen = end
            if len(page) < 1000:
                return chosen if chosen is not None else begin
            after = page[-1].epoch_id

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        s, e = _offsets(start), _offsets(end)
        return [BusPartition(p, s.get(p, 0), e.get(p, 0)) for p in range(self.num_partitions)
                if e.get(p, 0) > s.get(p, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, BusPartition)
        yield from read_bus_range(self.brokers, self.topic, partition.partition,
                                  partition.start, partition.end)

    def commit(self, end: dict) -> None:
        """Nothing to do: sink checkpoints are committed by the job after the sinks acked."""


def read_bus_range(brokers: str, topic: str, partition: int, start: int, end: int,
                   timeout_s: float = 60.0) -> Iterator[pa.RecordBatch]:
    """Offsets [start, end) of one partition as Arrow batches, in offset order."""
    import time

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from tailrace.bus import consumer_config

    consumer = Consumer(consumer_config(brokers, f"tailrace-delivery-{topic}"))
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        offsets: list[int] = []
        values: list[bytes] = []
        next_offset = start
        deadline = time.monotonic() + timeout_s
        while next_offset < end:
            msgs = consumer.consume(num_messages=min(10_000, end - next_offset), timeout=1.0)
            if not msgs and time.monotonic() > deadline:
                raise TimeoutError(f"bus {topic}[{partition}]: offsets {next_offset}..{end} "
                                   f"not readable within {timeout_s:.0f} s")
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"bus {topic}[{partition}]: {err.str()}")
                off = msg.offset()
                if off < next_offset or off >= end:
                    continue
                offsets.append(off)
                values.append(msg.value())
                next_offset = off + 1
                if len(offsets) >= ARROW_CHUNK:
                    yield _batch(partition, offsets, values)
                    offsets, values = [], []
            if msgs:
                deadline = time.monotonic() + timeout_s
        if offsets:
            yield _batch(partition, offsets, values)
    finally:
        consumer.close()


def _batch(partition: int, offsets: list[int], values: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([partition] * len(offsets), pa.int32()), pa.array(offsets, pa.int64()),
         pa.array(values, pa.binary())], schema=ARROW_SCHEMA)


def options_json(options: dict[str, str]) -> str:
    return json.dumps(options)
