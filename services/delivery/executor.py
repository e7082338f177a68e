"""What runs inside Spark's Python workers: one task delivers one bus partition's slice.

The task is the bus source's `read()` (`source.BusStreamReader`): it reads its range of the
bus, delivers it against what the driver handed to the batch (`handoff.py`) and yields one
row, its outcome, which is the micro-batch's data the driver collects.
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from collections.abc import Generator, Iterable, Iterator

import pyarrow as pa

from tailrace.bus import BusReader
from tailrace.config import PipelineSpec
from tailrace.proto.control_pb2 import Checkpoint
from tailrace_services.delivery.handoff import RESULT_ARROW, BatchHandoff, worker_id
from tailrace_services.delivery.outbox_cleanup import outbox_cleanup
from tailrace_services.delivery.processors import ProcessorChain
from tailrace_services.delivery.runtime import Chunk, deliver_slice
from tailrace_services.delivery.sinks import Sink, build_sink

READ_CHUNK = 4096
# Every this many tasks a worker process's heap is not frozen (`collector_paused`), so the
# collection after that task visits it all: long-lived objects that died in a cycle are
# collected then.
FULL_COLLECTION_EVERY = 100
_tasks = 0  # tasks this worker process ran

# Sinks opened by this worker process, reused across batches (Spark reuses Python workers);
# by pipeline, sink id and the sink's settings: a managed pipeline's new spec version gets
# new sinks, and the sinks it no longer has are closed.
_SINKS: dict[tuple[str, str, str], Sink] = {}
# Processor chains (compiled expressions), built once per worker process and pipeline spec.
_CHAINS: dict[tuple[str, str], ProcessorChain] = {}
# Bus readers of this worker process, one per pipeline and bus partition, kept across tasks
# like its sinks: the next batch's range starts where this one's ended, and the consumer
# has fetched it meanwhile. A reader new to a task pays a connection and a first fetch
# (on the test brokers that fetch grows with the log after the offset: 60-70 ms for a
# batch at the start of a 200,000-record log, 11 ms near its end; docs/performance.md).
# Only a worker that delivered the partition's last batch in this query reads on
# (`BatchHandoff.continues`, as for its sinks); the first batch after a restart or a
# resume is fetched again from the bus, as the driver planned it.
# By the bus (brokers, topic, client settings) and generation: a new generation's
# offsets are other records, never read from an earlier one's fetch. A partition whose last
# batch another worker delivered closes this worker's reader of it. What an idle reader
# holds is bounded: at most KEPT_READERS of them (the least recently used closed), each
# fetching ahead READ_AHEAD_KB plus one fetch (max.partition.fetch.bytes, 16 MB): ~32 MB,
# not librdkafka's 64 MB and more, unless the spec's bus.client_config sets
# queued.max.messages.kbytes (or fetch.wait.max.ms, below). More partitions than
# KEPT_READERS served by one worker take turns: those read as before, a reader each.
_READERS: dict[tuple[str, int], tuple[tuple[str, str, str, int], BusReader]] = {}
KEPT_READERS = 8
READ_AHEAD_KB = 16 * 1024
# How long a kept reader's fetch waits at the partition's end for records. Kafka answers it
# as soon as records arrive; the test broker (Tansu) holds it the whole time, so with
# librdkafka's 500 ms a batch's records waited for it: 5,000 rows/s to Redis p99 258 ms with
# 20 ms, 261 ms with 100, 448 ms with 500 (docs/performance.md). At most 10 empty fetches a
# second from an idle reader.
FETCH_WAIT_MS = 100
BUS_READ_TIMEOUT_S = 60.0


def _sinks(pipeline: PipelineSpec, only: Iterable[str]) -> list[Sink]:
    """The sinks of the batch: those the driver handed a checkpoint for (a detached sink
    gets none)."""
    out = []
    wanted = set(only)
    drift = pipeline.spec.source.on_schema_drift  # a Kafka sink's registry refusals
    current = {(pipeline.name, s.id, f"{s.model_dump_json()} {drift}"): s
               for s in pipeline.spec.sinks}
    for key in [k for k in _SINKS if k[0] == pipeline.name and k not in current]:
        _SINKS.pop(key).close()  # of an earlier version of the spec
    for key, spec in current.items():
        if spec.id not in wanted:
            continue
        if key not in _SINKS:
            _SINKS[key] = build_sink(spec, pipeline=pipeline.name,  # opened by the fan-out
                                     on_schema_drift=drift)
        out.append(_SINKS[key])
    return out


def _start_partition(pipeline: PipelineSpec, partition: int, kept: bool) -> None:
    """Tell this worker's sinks whether what they kept of `partition` is still theirs
    (`Sink.start_partition`)."""
    for (name, _, _), sink in _SINKS.items():
        if name == pipeline.name:
            sink.start_partition(partition, kept)


def _chain(pipeline: PipelineSpec) -> ProcessorChain:
    key = (pipeline.name, "[" + ",".join(p.model_dump_json() for p in pipeline.spec.processors)
           + "]")
    if key not in _CHAINS:
        for old in [k for k in _CHAINS if k[0] == pipeline.name]:
            del _CHAINS[old]
        _CHAINS[key] = ProcessorChain(pipeline.spec.processors)
    return _CHAINS[key]


def close_sinks(pipeline_name: str) -> None:
    for key in [k for k in _SINKS if k[0] == pipeline_name]:
        _SINKS.pop(key).close()


def _bus_reader(pipeline: PipelineSpec, partition: int, generation: int) -> BusReader:
    """This worker's reader of the pipeline's bus partition (`_READERS`)."""
    bus = pipeline.spec.bus
    settings = (bus.brokers, pipeline.bus_topic, json.dumps(bus.client_config, sort_keys=True),
                generation)
    key = (pipeline.name, partition)
    kept = _READERS.get(key)
    if kept is not None and kept[0] == settings:
        _READERS[key] = _READERS.pop(key)  # the most recently used now
        return kept[1]
    _close_bus_reader(pipeline, partition)
    while len(_READERS) >= KEPT_READERS:
        _close_quietly(_READERS.pop(next(iter(_READERS)))[1])
    reader = BusReader(bus.brokers, pipeline.bus_topic,
                       client_id=f"tailrace-delivery-{pipeline.bus_topic}",
                       client_config={"queued.max.messages.kbytes": str(READ_AHEAD_KB),
                                      "fetch.wait.max.ms": str(FETCH_WAIT_MS),
                                      **bus.client_config})
    _READERS[key] = settings, reader
    return reader


def _close_bus_reader(pipeline: PipelineSpec, partition: int) -> None:
    kept = _READERS.pop((pipeline.name, partition), None)
    if kept is not None:
        _close_quietly(kept[1])


def _close_quietly(reader: BusReader) -> None:
    with contextlib.suppress(Exception):  # a client that failed is dropped all the same
        reader.close()


def deliver_range(pipeline: PipelineSpec, handoff: BatchHandoff, partition: int, start: int,
                  end: int, generation: int = 0, epoch_id: int = 0) -> pa.RecordBatch:
    """Read the bus partition's offsets [start, end) here and deliver them against the
    `handoff`'s checkpoints; `generation`:
    the bus generation the offsets are of (`tailrace.bus_generation`), handed back with
    the result for the checkpoint; `epoch_id`: the epoch whose marker the range ends with
    (checked before anything is written: a bus that lost its records holds other ones
    at those offsets). The result also says how long the task took, and its bus read
    (the batch log line: what of a batch is Spark's own)."""
    continues = handoff.continues(partition)
    for other, worker in handoff.last_workers.items():  # readers that cannot read on now
        if worker != worker_id():
            _close_bus_reader(pipeline, other)
    _start_partition(pipeline, partition, kept=continues)
    with collector_paused():
        return _deliver_range(pipeline, handoff.checkpoints, partition, start, end,
                              generation, epoch_id, read_on=continues)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for one task, and what lives at its start frozen.

    A task holds every event of its batch (hundreds of thousands in a large transaction)
    and allocates a few tracked objects per event, each of which a collector pass visits at
    least once: ~9 % of the plain loop's time (docs/performance.md; raising the thresholds
    instead saved nothing, as every object is still visited once). A task is one batch, so
    what it leaves in reference cycles (a sink's retries) is bounded, and collected once the
    collector is back on.

    After every task Spark's Python worker runs a full collection (`pyspark.daemon`), which
    visited every object of the modules the worker imported: ~100 ms of CPU a task here,
    most of delivery's CPU at a thousand rows a second. What lives at a task's start has
    survived the collection after the task before (but for what the task's own start made:
    pyspark's objects for it, the first task's imports), so it is frozen (`gc.freeze`):
    the collection after this task visits what this task made. Every
    FULL_COLLECTION_EVERY-th task the heap is unfrozen instead, so that what died in a
    reference cycle since (a dropped sink's client, the task starts' garbage) is still
    collected: kept at most that many tasks."""
    global _tasks
    _tasks += 1
    if _tasks % FULL_COLLECTION_EVERY:
        gc.freeze()
    else:
        gc.unfreeze()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _deliver_range(pipeline: PipelineSpec, checkpoints: dict[str, Checkpoint | None],
                   partition: int, start: int, end: int, generation: int, epoch_id: int,
                   read_on: bool) -> pa.RecordBatch:
    started = time.monotonic()
    spec = pipeline.spec
    reader = _bus_reader(pipeline, partition, generation)
    read = _TimedRead(reader.read_range(partition, start, end, BUS_READ_TIMEOUT_S, READ_CHUNK,
                                        read_on=read_on))
    try:
        result = deliver_slice(
            partition, read, _sinks(pipeline, checkpoints),
            {k: (cp.position if cp is not None else None) for k, cp in checkpoints.items()},
            pipeline=pipeline.name, source_id=spec.source.id, batch=spec.batch,
            processors=_chain(pipeline), journal=spec.journal.enabled,
            rewinds={k: cp.rewind for k, cp in checkpoints.items() if cp is not None},
            acked={k: cp.sink_stored[partition] for k, cp in checkpoints.items()
                   if cp is not None and partition in cp.sink_stored},
            ends_with_epoch=epoch_id, delivered=outbox_cleanup(pipeline))
    except Exception:
        # before the read's end (the read failed, or making the sinks or processors did)
        # nothing was written: the sinks stay open; after it, they reconnect on the retry
        if read.done:
            close_sinks(pipeline.name)
        _close_bus_reader(pipeline, partition)
        raise
    finally:  # ends the read's generator (the reader itself is kept, or closed above)
        with contextlib.suppress(Exception):
            read.close()
    if any(not o.acked for o in result.outcomes):
        close_sinks(pipeline.name)
    return pa.RecordBatch.from_pylist([{
        "partition": result.partition,
        "generation": generation,
        "end_offset": result.end_offset,
        "epoch_position": (result.epoch_position.SerializeToString()
                           if result.epoch_position is not None else None),
        "events": result.events,
        "read_ms": read.seconds * 1000,
        "task_ms": (time.monotonic() - started) * 1000,
        "outcomes": json.dumps([{k: v for k, v in vars(o).items() if k != "dead_letters"}
                                for o in result.outcomes]),
        "dead_letters": [{"sink_id": s, "event": e.SerializeToString(), "reason": r}
                         for s, e, r in result.dead_letters],
        "worker": worker_id(),
    }], schema=RESULT_ARROW)


class _TimedRead:
    """The slice's records as the bus read gives them, (offsets, values) chunks, and how
    long the task waited for them. Decoded as they come (`runtime.decode_slice` takes them
    all before anything is written): librdkafka fetches the next records meanwhile, where
    the task read them all first (1.3 s, then 1.0 s of decoding, for a transaction of
    200,000 rows)."""

    def __init__(self, chunks: Generator[Chunk, None, None]) -> None:
        self._chunks = chunks
        self.seconds = 0.0
        self.done = False  # every record read

    def __iter__(self) -> Iterator[Chunk]:
        while True:
            began = time.monotonic()
            chunk = next(self._chunks, None)
            self.seconds += time.monotonic() - began
            if chunk is None:
                self.done = True
                return
            yield chunk

    def close(self) -> None:
        """End the bus read now, also when the slice failed before its end."""
        self._chunks.close()
