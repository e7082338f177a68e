"""What passes between the driver and a micro-batch's tasks, outside the bus.

Down, before the batch's job (`handing`): the checkpoints the driver read for the batch,
which every task delivers against, and per bus partition the Python worker that delivered
its last batch in this query, so that a worker that did keeps what its sinks hold for that
partition (a Kafka transactional producer). They travel as a Spark local property of the
thread that runs the batch: Spark sends a thread's local properties with every task of the
jobs it starts, beside the micro-batch id, which the task checks (`handed_batch`).

Up: each task's outcome, one row per bus partition (`RESULT_SCHEMA`), collected by the
driver, which names the worker (`worker_id`) for the next batch.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from tailrace.proto.control_pb2 import Checkpoint

RESULT_SCHEMA = StructType([  # a task's outcome: one row per bus partition of the batch
    StructField("partition", IntegerType()), StructField("generation", LongType()),
    StructField("end_offset", LongType()), StructField("epoch_position", BinaryType()),
    StructField("events", LongType()), StructField("read_ms", DoubleType()),
    StructField("task_ms", DoubleType()), StructField("outcomes", StringType()),
    StructField("dead_letters", ArrayType(StructType([
        StructField("sink_id", StringType()), StructField("event", BinaryType()),
        StructField("reason", StringType())]))),
    StructField("worker", StringType()),  # the Python worker that delivered it (worker_id)
])
# As Spark converts RESULT_SCHEMA: it refuses a batch whose Arrow schema differs in any way.
RESULT_ARROW = to_arrow_schema(RESULT_SCHEMA, timezone="UTC")
HANDOFF_PROPERTY = "tailrace.batch"
_BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark on every micro-batch's jobs


def worker_id() -> str:
    """This Python worker process, unlike any other of the cluster's, before or after it."""
    global _WORKER
    if _WORKER is None or _WORKER[0] != os.getpid():  # (a fork has a pid of its own)
        _WORKER = os.getpid(), f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
    return _WORKER[1]


_WORKER: tuple[int, str] | None = None


class BatchHandoff(NamedTuple):
    """What a task of a micro-batch was handed: the checkpoints to deliver against, per bus
    partition the worker that delivered its last batch in this query, and which attempt of
    the task this is (Spark runs a failed task again, maybe in another worker)."""

    checkpoints: dict[str, Checkpoint | None]
    last_workers: dict[int, str]
    attempt: int

    def continues(self, partition: int) -> bool:
        """Whether this worker delivered `partition`'s last batch and nothing another worker
        did came in between (a retried task's earlier attempt may have)."""
        return self.attempt == 0 and self.last_workers.get(partition) == worker_id()


@contextlib.contextmanager
def handing(context: Any, batch_id: int, checkpoints: Mapping[str, Checkpoint | None],
            last_workers: Mapping[int, str]) -> Iterator[None]:
    """On the driver, around the batch's job: the hand-off is a local property of this
    thread while the context lasts, and no job started after it carries it."""
    context.setLocalProperty(HANDOFF_PROPERTY, json.dumps({
        "batch": batch_id,
        "sinks": {k: (base64.b64encode(v.SerializeToString()).decode() if v is not None
                      else None) for k, v in checkpoints.items()},
        "workers": {str(p): w for p, w in last_workers.items()}}))
    try:
        yield
    finally:
        context.setLocalProperty(HANDOFF_PROPERTY, None)


def handed_batch() -> BatchHandoff:
    """In a task: what the driver handed to this micro-batch. A task without it, or with
    another batch's, would deliver against checkpoints nobody commits: it fails."""
    from pyspark import TaskContext

    task = TaskContext.get()
    handed = task.getLocalProperty(HANDOFF_PROPERTY) if task is not None else None
    if task is None or handed is None:
        raise RuntimeError(f"a delivery task got no checkpoints from the driver (Spark local "
                           f"property {HANDOFF_PROPERTY} unset); it delivers nothing")
    batch = task.getLocalProperty(_BATCH_ID_PROPERTY)
    decoded = json.loads(handed)
    if str(decoded["batch"]) != batch:
        raise RuntimeError(f"a delivery task of micro-batch {batch} got the checkpoints of "
                           f"batch {decoded['batch']}; it delivers nothing")
    return BatchHandoff(
        {k: (Checkpoint.FromString(base64.b64decode(v)) if v is not None else None)
         for k, v in decoded["sinks"].items()},
        {int(p): w for p, w in decoded["workers"].items()}, task.attemptNumber())
