"""The Spark job: plan batches from epochs, deliver on executors, then commit checkpoints.

At start the job claims the pipeline in the control service (the newest delivery
instance owns it; an older one is fenced and stops). Per micro-batch (`foreachBatch`),
in this order:
0. check this instance still owns the pipeline and it is not paused;
1. read every sink's checkpoint (position + version) from the control service;
2. ONE `mapInArrow(...).collect()`: each task runs the processors and writes its
   partition's slice to every sink (skipping what a sink already has) and returns
   each sink's outcome;
3. `BatchCommitter`: dead letters to the DLQ, then the commit policy in the control
   service advances the acknowledged sinks' checkpoints atomically (see committer.py).
A crash anywhere before step 3 re-delivers the batch (at least once; exactly-once
sinks skip it through the checkpoint they store with the data). When a sink did not
acknowledge, the query restarts from the least advanced checkpoint after a backoff,
so a lagging sink catches up while the others skip what they have.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from tailrace.config import PipelineSpec
from tailrace.control_client import ControlClient
from tailrace.errors import FatalError, FencedError, RetryableError
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace_services.delivery import metrics
from tailrace_services.delivery.committer import BatchCommitter, BatchReport
from tailrace_services.delivery.executor import RESULT_SCHEMA, make_deliver_fn
from tailrace_services.delivery.source import BusDataSource

log = get_logger(__name__)


LAG_EVERY_S = 5.0


class _Restart(Exception):
    """Stop this query and start a new one from the control-service checkpoints."""


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
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(BusDataSource)
    return spark


def _start_spark(app: str, master: str, attempts: int = 3) -> Any:
    """The JVM occasionally fails to come up on a loaded machine ("Java gateway process
    exited before sending its port number"); that is worth another try, not a failure."""
    for attempt in range(1, attempts + 1):
        try:
            return spark_session(app, master)
        except Exception as e:
            if attempt == attempts or "JAVA_GATEWAY_EXITED" not in str(e):
                raise
            log.warning("spark did not start; retrying", attempt=attempt, error=str(e))
            time.sleep(2.0 * attempt)
    raise AssertionError("unreachable")


class DeliveryJob:
    def __init__(self, pipeline: PipelineSpec, control: ControlClient,
                 on_batch: Callable[[BatchReport, float], None] | None = None) -> None:
        self.pipeline = pipeline
        self.control = control
        self.on_batch = on_batch  # (report, seconds) after every committed batch
        self.committer = BatchCommitter(pipeline, control)
        self.events_delivered = 0
        self.restart_reason = ""
        self._lag_at = -LAG_EVERY_S

    def process_batch(self, df: Any, batch_id: int) -> None:
        name = self.pipeline.name
        started = time.monotonic()
        info = self.control.get_pipeline(name)
        self.committer.check_owner(info.delivery_owner)
        if info.state == pb.PIPELINE_PAUSED:
            self.restart_reason = "paused"
            raise _Restart("pipeline paused")
        before = self.committer.read()
        positions = {k: (v.position.SerializeToString() if v is not None else None)
                     for k, v in before.items()}
        rows = df.mapInArrow(make_deliver_fn(self.pipeline, positions), RESULT_SCHEMA).collect()
        delivered_at = time.monotonic()
        report = self.committer.summarize(rows)
        report.dead_letters = self.committer.dead_letter(rows)
        self.committer.commit(before, rows, report)
        committed_at = time.monotonic()

        metrics.BATCH_EVENTS.labels(name).observe(report.events)
        metrics.BATCH_SECONDS.labels(name, "deliver").observe(delivered_at - started)
        metrics.BATCH_SECONDS.labels(name, "commit").observe(committed_at - delivered_at)
        if report.e2e_ms_max:
            metrics.E2E_SECONDS.labels(name).observe(report.e2e_ms_max / 1000)
        metrics.DLQ_EVENTS.labels(name).inc(report.dead_letters)
        for sink, n in report.delivered.items():
            metrics.EVENTS.labels(name, sink).inc(n)
            metrics.SINK_SECONDS.labels(name, sink).observe(report.write_s.get(sink, 0.0))
        for sink, err in report.errors.items():
            metrics.SINK_ERRORS.labels(name, sink, err.split(":")[0]).inc()
        self._record_lag()
        self.events_delivered += report.events
        log.info("batch delivered", batch=batch_id, events=report.events,
                 per_sink=report.delivered, lagging=report.lagging or None,
                 dead_letters=report.dead_letters or None,
                 ms=round((committed_at - started) * 1000))
        if self.on_batch is not None:
            self.on_batch(report, committed_at - started)
        if not report.policy_satisfied:
            raise RetryableError(f"commit policy {self.pipeline.spec.commit_policy!r} not met, "
                                 f"no checkpoint moved: {report.reason}; the batch is retried")
        if report.lagging:
            self.restart_reason = f"sinks {', '.join(report.lagging)} behind: " + "; ".join(
                report.errors.values())
            raise _Restart(self.restart_reason)


    def _record_lag(self) -> None:
        """Checkpoint lag per sink: bus offsets between the latest epoch and the checkpoint.
        At most every LAG_EVERY_S: it costs a control call, and a gauge needs no more."""
        now = time.monotonic()
        if now - self._lag_at < LAG_EVERY_S:
            return
        self._lag_at = now
        latest = self.control.latest_epoch(self.pipeline.spec.source.id)
        if latest is None:
            return
        for sink in self.pipeline.spec.sinks:
            cp = self.committer.last_committed.get(sink.id)
            done = dict(cp.bus_offsets) if cp is not None else {}
            lag = sum(max(end - done.get(p, 0), 0) for p, end in latest.end_offsets.items())
            metrics.CHECKPOINT_LAG.labels(self.pipeline.name, sink.id).set(lag)


def run(pipeline: PipelineSpec, master: str = "local[*]", stop_after_s: float | None = None,
        stop_when: Callable[[], bool] | None = None,
        on_batch: Callable[[BatchReport, float], None] | None = None) -> None:
    """Run the streaming query until it fails fatally (raises) or the process is stopped.
    `on_batch(report, seconds)` runs on the driver after every batch (benchmarks, embedding)."""
    control = ControlClient(pipeline.spec.control.address)
    job = DeliveryJob(pipeline, control, on_batch)
    control.register_pipeline(pipeline)
    claim = control.claim_delivery(pipeline.name, f"{socket.gethostname()}:{os.getpid()}")
    job.committer.generation = claim.owner.generation
    if claim.previous.generation:
        log.warning("took over the pipeline; the previous delivery instance is fenced",
                    generation=claim.owner.generation, fenced=claim.previous.instance)
    else:
        log.info("delivery owns the pipeline", generation=claim.owner.generation)
    spark = _start_spark(f"tailrace-delivery-{pipeline.name}", master)
    bus = pipeline.spec.bus
    trigger_ms = max(pipeline.spec.batch.max_ms, 100)
    delay = 1.0
    deadline = None if stop_after_s is None else time.monotonic() + stop_after_s

    def should_stop() -> bool:
        return (stop_when is not None and stop_when()) or (
            deadline is not None and time.monotonic() >= deadline)

    while not should_stop():
        if job.restart_reason == "paused":
            if control.pipeline_state(pipeline.name)[0] == "paused":
                time.sleep(1.0)
                continue
            job.restart_reason = ""
            job.committer.forget_versions()  # an operator may have rewound a sink while paused
            log.info("pipeline resumed")
        checkpoint_dir = tempfile.mkdtemp(prefix="tailrace-spark-")
        try:
            stream = (spark.readStream.format("tailrace_bus")
                      .option("brokers", bus.brokers).option("topic", pipeline.bus_topic)
                      .option("partitions", str(bus.partitions))
                      .option("control", pipeline.spec.control.address)
                      .option("source_id", pipeline.spec.source.id)
                      .option("sink_ids", ",".join(s.id for s in pipeline.spec.sinks))
                      .option("max_events", str(pipeline.spec.batch.max_events))
                      .load())
            query = (stream.writeStream.foreachBatch(job.process_batch)
                     .option("checkpointLocation", checkpoint_dir)
                     .trigger(processingTime=f"{trigger_ms} milliseconds")
                     .start())
            log.info("delivery running", pipeline=pipeline.name, master=master,
                     sinks=[s.id for s in pipeline.spec.sinks])
            while query.isActive and not should_stop():
                if query.awaitTermination(0.5):
                    break
            if query.isActive:
                query.stop()
                return
            query.awaitTermination()  # raises the query's error
            delay = 1.0
        except Exception as e:  # a failed query is restarted from the control checkpoints
            text = str(e)
            if "FencedError" in text or isinstance(e, FencedError):
                raise FencedError(_first_line(text, "FencedError")) from None  # not a failure
            if "FatalError" in text or isinstance(e, FatalError):
                reason = _first_line(text, "FatalError")
                control.report_health(pipeline.name, "failed", reason)
                raise FatalError(reason) from None
            if job.restart_reason == "paused":
                log.info("pipeline paused; waiting for resume")
                continue
            what = job.restart_reason or _first_line(text, "Error")
            job.restart_reason = ""
            log.warning("restarting from checkpoints", reason=what, retry_in_s=delay)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
        finally:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)


def _first_line(text: str, marker: str) -> str:
    """The message of the first `...<marker>: message` line of a (Java-wrapped) traceback."""
    found = re.search(rf"\b\w*{marker}\w*: (.+)", text)
    if found:
        return found.group(1).strip()[:500]
    return text.strip().splitlines()[0][:500] if text.strip() else "unknown error"
