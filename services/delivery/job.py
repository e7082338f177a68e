"""The Spark job: plan batches from epochs, deliver on executors, then commit checkpoints.

Per micro-batch (`foreachBatch`), in this order:
1. read every sink's checkpoint (position + version) from the control service;
2. ONE `mapInArrow(...).collect()`: each task writes its partition's slice to the
   sinks, skipping what a sink already has, and returns where the slice ended;
3. only after every sink acknowledged, commit each sink's checkpoint
   (compare-and-set on the version read in step 1) to the batch's epoch position.
A crash anywhere before step 3 re-delivers the batch (at least once); a lost
compare-and-set means another delivery process owns the pipeline: stop.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from tailrace.config import PipelineSpec
from tailrace.control_client import ControlClient
from tailrace.errors import FatalError
from tailrace.events import position_key
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import Position
from tailrace_services.delivery.executor import RESULT_SCHEMA, make_deliver_fn
from tailrace_services.delivery.source import BusDataSource

log = get_logger(__name__)


def spark_session(app: str, master: str) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.appName(app).master(master)
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.python.worker.reuse", "true")
             .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
             .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(BusDataSource)
    return spark


class BatchCommitter:
    """Steps 1 and 3 of the docstring above; lives in the driver script."""

    def __init__(self, pipeline: PipelineSpec, control: ControlClient) -> None:
        self.pipeline = pipeline
        self.control = control
        self.source_id = pipeline.spec.source.id
        self.sink_ids = [s.id for s in pipeline.spec.sinks]
        self.events_delivered = 0

    def read(self) -> dict[str, pb.Checkpoint | None]:
        return {s: self.control.get_checkpoint(self.source_id, s) for s in self.sink_ids}

    def commit(self, before: dict[str, pb.Checkpoint | None], rows: list[Any]) -> None:
        for sink_id, old in before.items():
            cp = pb.Checkpoint(pipeline=self.pipeline.name, source_id=self.source_id,
                               sink_id=sink_id)
            if old is not None:
                cp.position.CopyFrom(old.position)
                for p, o in old.bus_offsets.items():
                    cp.bus_offsets[p] = o
            for row in rows:
                if row["end_offset"] >= 0:
                    cp.bus_offsets[row["partition"]] = max(
                        cp.bus_offsets.get(row["partition"], 0), row["end_offset"])
                if row["epoch_position"] is not None:
                    pos = Position.FromString(row["epoch_position"])
                    if position_key(pos) > position_key(cp.position):
                        cp.position.CopyFrom(pos)
            ok, current = self.control.commit_checkpoint(cp, old.version if old else 0)
            if not ok:
                raise FatalError(
                    f"checkpoint of sink {sink_id} was moved by someone else (stored version "
                    f"{current.version}); is a second delivery process running for pipeline "
                    f"{self.pipeline.name}?")


def run(pipeline: PipelineSpec, master: str = "local[*]", stop_after_s: float | None = None,
        stop_when: Callable[[], bool] | None = None) -> None:
    """Run the streaming query until it fails fatally (raises) or the process is stopped."""
    control = ControlClient(pipeline.spec.control.address)
    committer = BatchCommitter(pipeline, control)
    spark = spark_session(f"tailrace-delivery-{pipeline.name}", master)
    bus = pipeline.spec.bus
    trigger_ms = max(pipeline.spec.batch.max_ms, 100)

    def process_batch(df: Any, batch_id: int) -> None:
        started = time.monotonic()
        before = committer.read()
        positions = {k: (v.position.SerializeToString() if v is not None else None)
                     for k, v in before.items()}
        rows = df.mapInArrow(make_deliver_fn(pipeline, positions), RESULT_SCHEMA).collect()
        committer.commit(before, rows)
        events = sum(r["events"] for r in rows)
        committer.events_delivered += events
        delivered = [json.loads(r["delivered"]) for r in rows]
        log.info("batch delivered", batch=batch_id, events=events,
                 per_sink={s: sum(d.get(s, 0) for d in delivered) for s in committer.sink_ids},
                 ms=round((time.monotonic() - started) * 1000))

    delay = 1.0
    deadline = None if stop_after_s is None else time.monotonic() + stop_after_s
    while True:
        checkpoint_dir = tempfile.mkdtemp(prefix="tailrace-spark-")
        try:
            stream = (spark.readStream.format("tailrace_bus")
                      .option("brokers", bus.brokers).option("topic", pipeline.bus_topic)
                      .option("partitions", str(bus.partitions))
                      .option("control", pipeline.spec.control.address)
                      .option("source_id", pipeline.spec.source.id)
                      .option("sink_ids", ",".join(committer.sink_ids))
                      .load())
            query = (stream.writeStream.foreachBatch(process_batch)
                     .option("checkpointLocation", checkpoint_dir)
                     .trigger(processingTime=f"{trigger_ms} milliseconds")
                     .start())
            log.info("delivery running", pipeline=pipeline.name, master=master,
                     sinks=committer.sink_ids)
            while query.isActive:
                if query.awaitTermination(0.5) or (stop_when is not None and stop_when()) or (
                        deadline is not None and time.monotonic() >= deadline):
                    break
            if query.isActive:
                query.stop()
                return
            query.awaitTermination()  # raises the query's error
            delay = 1.0
        except Exception as e:  # a failed query is restarted from the control checkpoints
            text = str(e)
            if "FatalError" in text or isinstance(e, FatalError):
                raise FatalError(_first_line(text, "FatalError")) from None
            log.warning("delivery batch failed; restarting from checkpoints",
                        error=_first_line(text, "Error"), retry_in_s=delay)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
        finally:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)


def _first_line(text: str, marker: str) -> str:
    for line in text.splitlines():
        if marker in line:
            return line.strip()[:500]
    return text.strip().splitlines()[0][:500] if text.strip() else "unknown error"
