"""The Spark job: plan batches from epochs, deliver on executors, then commit checkpoints.

At start the job waits until it holds the pipeline's delivery lease (`tailrace.lease`: other
instances are standbys), then claims the pipeline in the control service (the newest claim
owns it; an older instance is fenced and stops). Per micro-batch (`foreachBatch`),
in this order:
0. check this instance still owns the pipeline and it is not paused;
1. read every sink's checkpoint (position + version) from the control service;
2. hand those checkpoints to the batch's tasks (`handoff.handing`) and ONE
   `collect()` of the batch: each task is the bus source's read (source.py), which
   reads its partition's slice, runs the processors, writes it to every sink (skipping
   what a sink already has) and yields each sink's outcome;
3. `BatchCommitter`: dead letters to the DLQ, then the commit policy in the control
   service advances the acknowledged sinks' checkpoints atomically (see committer.py).
A crash anywhere before step 3 re-delivers the batch (at least once; exactly-once
sinks skip it through the checkpoint they store with the data). When a sink did not
acknowledge, the query restarts from the least advanced checkpoint after a backoff,
so a lagging sink catches up while the others skip what they have.

A restart the job asks for (the pipeline paused, a sink behind, the commit policy not
met) is not an error of the query: the batch callback records why and returns, every
later batch of that query returns at once without writing or committing anything, and
the driver stops the query and starts a new one from the control-service checkpoints.
So a pause or a refusing sink costs one log line, not a Spark/py4j traceback. The driver
also asks every PAUSE_CHECK_S whether the pipeline was paused, so a pause stops the query
on an idle source too, before an operator rewinds a sink.

Health (health.py): a non-retryable error of a sink the commit policy waits for makes the
pipeline `failed` at once; restarts in a row without a checkpoint advancing make it
`degraded`; the batch is retried with backoff either way, and a batch that moves a
checkpoint makes it `running` again. Each change goes to the control service.

Fatal, never restarted: a `FatalError` (a fenced producer, a checkpoint moved by someone
else) and a `ConfigError` (the spec asks for something that cannot work: a librdkafka
setting the client refuses, an unreadable TLS file of a sink). Raised on the driver or on
an executor (where it reaches the driver as the text of a Java-wrapped Python traceback,
recognised by the error's class name), it makes the pipeline `failed` with the reason,
says so to the control service, and `run` raises it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tailrace.bus_generation import offsets_done
from tailrace.config import PipelineSpec
from tailrace.control_access import service_client
from tailrace.control_client import ControlClient
from tailrace.errors import ConfigError, FatalError, FencedError, TailraceError
from tailrace.lease import Lease
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace_services.delivery import metrics
from tailrace_services.delivery.buswatch import BusWatch
from tailrace_services.delivery.cluster import class_archive, pid_alive
from tailrace_services.delivery.committer import BatchCommitter, BatchReport
from tailrace_services.delivery.handoff import handing
from tailrace_services.delivery.health import PipelineHealth
from tailrace_services.delivery.source import BusDataSource, bus_options, control_options
from tailrace_services.delivery.sparklog import spark_log4j_config

log = get_logger(__name__)


CHECKPOINT_FILE_MANAGER = ("org.apache.spark.sql.execution.streaming.checkpointing."
                           "FileSystemBasedCheckpointFileManager")
LAG_EVERY_S = 5.0
PAUSE_CHECK_S = 2.0  # how often the driver asks whether an operator paused the pipeline
_NON_RETRYABLE = re.compile(r"\bNonRetryableError\b")
_CONFIG_ERROR = re.compile(r"\bConfigError: ")
_RAISED = re.compile(r"^((?:tailrace|tailrace_services)(?:\.\w+)*)\.(\w+): (.+)$", re.M)


LOOPBACK = "127.0.0.1"

# The driver JVM compiles with C1 only. It plans micro-batches and passes each task's
# one-row result; no event goes through it, and C2's compiler threads mostly compiled
# start-up code: a session start and first jobs took 20.3 s of CPU with C2 and 12.7 s
# without it, 12.2 s against 10.1 s of wall time, on 2 cores (docs/performance.md,
# "2026-12-01 night"). `tailrace-delivery --conf spark.driver.extraJavaOptions=...` comes
# after it: `-XX:TieredStopAtLevel=4` there brings C2 back.
DRIVER_JIT = "-XX:TieredStopAtLevel=1"


def spark_session(app: str, master: str, driver_host: str = LOOPBACK,
                  conf: Mapping[str, str] | None = None) -> Any:
    """`driver_host`: where executors reach the driver (loopback unless they run on other
    hosts); `conf`: more Spark settings (`spark.cores.max`...), applied last."""
    if driver_host == LOOPBACK:
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    log4j = f"-Dlog4j2.configurationFile=file:{spark_log4j_config()}"
    archive = class_archive()  # `tailrace-spark archive`: the JVM starts ~3 s sooner
    conf = dict(conf or {})
    driver_java = " ".join(filter(None, [  # the caller's options added to ours
        log4j, f"-XX:SharedArchiveFile={archive}" if archive else "", DRIVER_JIT,
        conf.pop("spark.driver.extraJavaOptions", "")]))
    builder = (SparkSession.builder.appName(app).master(master)
             .config("spark.driver.extraJavaOptions", driver_java)
             .config("spark.executor.extraJavaOptions",  # the file is on this host only
                     log4j if driver_host == LOOPBACK else "")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.bindAddress", LOOPBACK if driver_host == LOOPBACK
                     else "0.0.0.0")
             .config("spark.driver.host", driver_host)
             .config("spark.python.worker.reuse", "true")
             # A task's Python worker talks to its executor over a Unix socket, not TCP:
             # over loopback TCP the executor's second small write (the task's input after
             # its command) waited for the worker's delayed ACK (Nagle), ~40 ms per task
             # (docs/performance.md, 2026-11-30 day)
             .config("spark.python.unix.domain.socket.enabled", "true")
             .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
             # The query's offset and commit logs are written every micro-batch, yet never
             # read by us: a query starts from the control service's checkpoints, in a new
             # temporary directory. Plain files there (no rename through Hadoop's
             # FileContext, no .crc twin): 2 x ~37 ms -> 2 x ~7 ms a batch (docs/performance.md)
             .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
             .config("spark.hadoop.fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem"))
    if driver_host == LOOPBACK:  # executors on this host: the directory is theirs too
        builder = builder.config("spark.python.unix.domain.socket.dir", _socket_dir())
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _quiet_accumulator_server(spark.sparkContext)
    return spark


_SOCKET_DIR_PREFIX = "tailrace-uds-"


def _socket_dir() -> str:
    """A directory of this process's own (mode 0700) for the sockets between executors and
    their Python workers: with Unix sockets Spark authenticates nothing (a worker trusts
    whoever connects), so the directory's mode keeps other local users out, as the shared
    secret did over TCP. Removed at exit; a killed process's is removed by the next start
    by the same user with the same temporary directory (its pid is in the name). Spark
    limits its path to 61 characters: a short one under the temporary directory."""
    _remove_killed_socket_dirs()
    path = tempfile.mkdtemp(prefix=f"{_SOCKET_DIR_PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _remove_killed_socket_dirs() -> None:
    """The socket directories of this user's delivery processes that are gone (killed)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_SOCKET_DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(_SOCKET_DIR_PREFIX).split("-")[0]
        if not pid.isdecimal():
            continue  # not one of ours
        with contextlib.suppress(OSError):
            if path.is_dir() and path.stat().st_uid == os.getuid() and not pid_alive(pid):
                shutil.rmtree(path)


def _quiet_accumulator_server(context: Any) -> None:
    """PySpark's accumulator server prints a traceback of its own (socketserver's
    `handle_error`, raw on stderr) when the JVM closes its socket first, as it does when a
    stop signal reaches the whole process group. That is the ordinary end of a connection:
    a debug line of ours, in the run's log format, instead."""
    server = getattr(context, "_accumulatorServer", None)
    if server is None:
        return

    def handle_error(request: Any, client_address: Any) -> None:
        log.debug("spark accumulator connection ended", exc_info=True)

    server.handle_error = handle_error


def _start_spark(app: str, master: str, driver_host: str, conf: Mapping[str, str],
                 attempts: int = 3) -> Any:
    """The JVM occasionally fails to come up on a loaded machine ("Java gateway process
    exited before sending its port number"); that is worth another try, not a failure."""
    for attempt in range(1, attempts + 1):
        try:
            return spark_session(app, master, driver_host, conf)
        except Exception as e:
            if attempt == attempts or "JAVA_GATEWAY_EXITED" not in str(e):
                raise
            log.warning("spark did not start; retrying", attempt=attempt, error=str(e))
            time.sleep(2.0 * attempt)
    raise AssertionError("unreachable")


class DeliveryJob:
    def __init__(self, pipeline: PipelineSpec, control: ControlClient,
                 on_batch: Callable[[BatchReport, float], None] | None = None,
                 health: PipelineHealth | None = None) -> None:
        self.pipeline = pipeline
        self.control = control
        self.on_batch = on_batch  # (report, seconds) after every committed batch
        self.health = health or PipelineHealth()
        self.committer = BatchCommitter(pipeline, control)
        self.events_delivered = 0
        self.restart_reason = ""
        self.in_batch = False  # the driver waits for a batch in flight before stopping
        # per bus partition, the Python worker that delivered its last batch in this query
        # (`handoff.BatchHandoff`); a new query starts without
        self.last_workers: dict[int, str] = {}
        self._lag_at = -LAG_EVERY_S

    def process_batch(self, df: Any, batch_id: int) -> None:
        """The `foreachBatch` callback; a restart it asks for is recorded, never raised."""
        self.in_batch = True  # before looking at restart_reason: see run()'s stop condition
        try:
            if self.restart_reason:  # this query is about to be stopped: write nothing more
                return
            self._process(df, batch_id)
        finally:
            self.in_batch = False

    def _process(self, df: Any, batch_id: int) -> None:
        name = self.pipeline.name
        started = time.monotonic()
        info = self.control.get_pipeline(name)
        self.committer.check_owner(info.delivery_owner)
        if info.state == pb.PIPELINE_PAUSED:
            self.restart_reason = "paused"
            return
        before = self.committer.read({s.id for s in info.sinks if s.HasField("detached")})
        last_workers, self.last_workers = self.last_workers, {}  # unknown if collect fails
        with handing(df.sparkSession.sparkContext, batch_id, before, last_workers):
            rows = df.collect()
        # a partition without a task in this batch was touched by no worker
        self.last_workers = {**last_workers, **{row.partition: row.worker for row in rows}}
        delivered_at = time.monotonic()
        report = self.committer.summarize(rows)
        report.dead_letters = self.committer.dead_letter(rows)
        self.committer.commit(before, rows, report)
        committed_at = time.monotonic()
        self.health.sinks_done(report.acked, report.errors)
        for sink, error in report.errors.items():
            log.error("sink did not acknowledge the batch", pipeline=name, sink=sink,
                      required=self.committer.sinks[sink].required, batch=batch_id,
                      error_class=report.error_classes.get(sink, ""), error=error)

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
                 ms=round((committed_at - started) * 1000),
                 deliver_ms=round((delivered_at - started) * 1000),
                 task_ms=round(report.task_ms_max), bus_read_ms=round(report.read_ms_max),
                 commit_ms=round((committed_at - delivered_at) * 1000))
        if self.on_batch is not None:
            self.on_batch(report, committed_at - started)
        if not report.policy_satisfied:
            self._blocked(report)
            return
        self.health.committed(advanced=bool(report.advanced))
        metrics.RESTARTS_WITHOUT_PROGRESS.labels(name).set(self.health.restarts)
        self.publish_health()
        if report.lagging:  # (a pause the driver saw meanwhile is kept)
            self.restart_reason = self.restart_reason or (
                f"sinks {', '.join(report.lagging)} behind: " + "; ".join(report.errors.values()))

    def _blocked(self, report: BatchReport) -> None:
        """No checkpoint moved: say why (failed now if retrying cannot help); the query is
        restarted to retry the batch."""
        policy = self.pipeline.spec.commit_policy
        blocking = self.committer.blocking_failures(report)
        if blocking:
            sinks = f"sink{'s' if len(blocking) > 1 else ''} {', '.join(blocking)}"
            reason = (f"{sinks} failed with a non-retryable error, so no checkpoint can move: "
                      f"{'; '.join(blocking.values())}; the batch is retried with backoff "
                      "until the sink is fixed")
        else:
            reason = f"{report.reason}: " + "; ".join(
                f"sink {s}: {e}" for s, e in report.errors.items())
        self.health.blocked(reason, non_retryable=bool(blocking))
        self.publish_health()  # fail now: before the backoff, not after it
        log.warning("commit policy not met, no checkpoint moved; the batch is retried",
                    policy=str(policy), reason=report.reason)
        self.restart_reason = self.restart_reason or reason

    def check_paused(self) -> None:
        """Between batches too: an operator's pause stops the query even on an idle source
        (a rewind made while paused must not meet a query that still runs)."""
        try:
            if self.control.pipeline_state(self.pipeline.name)[0] == "paused":
                self.restart_reason = self.restart_reason or "paused"
        except TailraceError as e:  # the next check or batch asks again
            log.debug("cannot ask the control service whether the pipeline is paused",
                      error=str(e))

    def publish_health(self) -> None:
        """The pipeline's health to the control service (with its failing sinks), when it
        changed."""
        self.health.publish(lambda now: self.control.report_pipeline_health(
            self.pipeline.name, now.state, now.reason, [
                pb.SinkHealth(sink_id=s.sink_id, last_error=s.error,
                              failing_since_unix_ms=s.since_unix_ms, failed_batches=s.batches)
                for s in now.sinks]))

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
            done = offsets_done(cp, latest)
            lag = sum(max(end - done.get(p, 0), 0) for p, end in latest.end_offsets.items())
            metrics.CHECKPOINT_LAG.labels(self.pipeline.name, sink.id).set(lag)


def run(pipeline: PipelineSpec, master: str = "local[*]", stop_after_s: float | None = None,
        stop_when: Callable[[], bool] | None = None,
        on_batch: Callable[[BatchReport, float], None] | None = None,
        health: PipelineHealth | None = None, lease_ttl_s: float = 0.0,
        take_over: bool = False, driver_host: str = LOOPBACK,
        spark_conf: Mapping[str, str] | None = None) -> None:
    """Run the streaming query until it fails fatally (raises) or the process is stopped.
    `on_batch(report, seconds)` runs on the driver after every batch (benchmarks, embedding);
    `health` is kept up to date for the caller's `/health`. `lease_ttl_s`: wait as a standby
    until this instance holds the pipeline's delivery lease (`tailrace.lease`), or with
    `take_over` take it from the instance that holds it; 0: claim at once (newest wins).
    `driver_host`, `spark_conf`: as `spark_session`."""
    control = service_client(pipeline.spec.control)
    job = DeliveryJob(pipeline, control, on_batch, health)
    health = job.health
    deadline = None if stop_after_s is None else time.monotonic() + stop_after_s
    lease = Lease(control, "delivery", pipeline.name, lease_ttl_s) if lease_ttl_s else None

    def should_stop() -> bool:
        return (stop_when is not None and stop_when()) or (
            deadline is not None and time.monotonic() >= deadline) or (
            lease is not None and bool(lease.lost))

    control.register_pipeline(pipeline)
    if lease is not None:
        if not lease.wait(should_stop, health.standby, take_over=take_over):
            return
        health.standby("")
    claim = control.claim_delivery(pipeline.name, f"{socket.gethostname()}:{os.getpid()}")
    job.committer.generation = claim.owner.generation
    if claim.previous.generation:
        log.warning("took over the pipeline; the previous delivery instance is fenced",
                    generation=claim.owner.generation, fenced=claim.previous.instance)
    else:
        log.info("delivery owns the pipeline", generation=claim.owner.generation)
    job.publish_health()  # the new owner starts running: what an older instance said is past
    spark = _start_spark(f"tailrace-delivery-{pipeline.name}", master, driver_host,
                         spark_conf or {})
    watch = BusWatch(pipeline).start()  # `/ready` names a cut bus (the workers read it)
    try:
        _queries(job, spark, master, should_stop)
    finally:
        watch.stop()
        if lease is not None:
            lease.release()
        control.close()  # a managed delivery runs again with a client of its own
    if lease is not None and lease.lost:
        raise FencedError(f"{lease.lost}; this instance stops (started again, it waits as a "
                          "standby)")


def stop_spark() -> None:
    """Stop this process's Spark session, if one was started: a clean end of the JVM, without
    py4j/accumulator tracebacks when the gateway goes away (the delivery process, at exit)."""
    if "pyspark" not in sys.modules:
        return
    from pyspark.sql import SparkSession

    with contextlib.suppress(Exception):  # the JVM may be gone already (SIGTERM to the group)
        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()


def _queries(job: DeliveryJob, spark: Any, master: str, should_stop: Callable[[], bool]) -> None:
    """Run streaming queries, one after another, until stopped or a fatal error."""
    pipeline, control, health = job.pipeline, job.control, job.health
    bus = pipeline.spec.bus
    trigger_ms = pipeline.spec.batch.max_ms  # at least MIN_BATCH_MS (the loader checks)
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
            spark.dataSource.register(BusDataSource.for_pipeline(pipeline))
            job.last_workers = {}
            stream = (spark.readStream.format("tailrace_bus")
                      .option("brokers", bus.brokers).option("topic", pipeline.bus_topic)
                      .option("partitions", str(bus.partitions))
                      .option("control", pipeline.spec.control.address)
                      .options(**control_options(pipeline.spec.control))
                      .options(**bus_options(bus.client_config))
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
            asked = time.monotonic()
            while query.isActive and not should_stop():
                if job.restart_reason and not job.in_batch:  # a batch in flight ends first
                    break
                if query.awaitTermination(0.5):
                    break
                if time.monotonic() - asked >= PAUSE_CHECK_S:
                    asked = time.monotonic()
                    job.check_paused()
            if query.isActive:
                query.stop()
            if should_stop():
                return
            if not job.restart_reason or query.exception() is not None:
                query.awaitTermination()  # raises the query's error, if it failed by itself
        except Exception as e:  # a failed query is restarted from the control checkpoints
            text = str(e)
            if "FencedError" in text or isinstance(e, FencedError):
                raise FencedError(_first_line(text, "FencedError")) from None  # not a failure
            if _CONFIG_ERROR.search(text) or isinstance(e, ConfigError):
                reason = _first_line(text, "ConfigError")
                health.fatal(f"configuration error: {reason}")
                job.publish_health()
                raise ConfigError(reason) from None
            fatal = _raised(text, FatalError)
            if fatal or "FatalError" in text or isinstance(e, FatalError):
                reason = fatal or _first_line(text, "FatalError")
                health.fatal(reason)
                job.publish_health()
                raise FatalError(reason) from None
            if should_stop() and job.restart_reason != "paused":
                # e.g. SIGTERM reached the planner process first: not a restart
                log.info("delivery stopping", error=_first_line(text, "Error"))
                return
            what = job.restart_reason or _first_line(text, "Error")
            if not job.restart_reason and _NON_RETRYABLE.search(text):  # e.g. a processor
                what = _first_line(text, "NonRetryableError")
                health.blocked(what, non_retryable=True)
            _restart(job, what, should_stop)
        else:  # stopped for a restart the job asked for, or the query ended by itself
            _restart(job, job.restart_reason or "the streaming query ended", should_stop)
        finally:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)


def _restart(job: DeliveryJob, what: str, should_stop: Callable[[], bool]) -> None:
    """After a query stopped: wait for a resume (paused), or count the restart without
    progress, say so to the control service and back off before the next query."""
    if what == "paused":  # the loop waits for the resume; no restart is counted
        log.info("pipeline paused; waiting for resume")
        return
    job.restart_reason = ""
    health = job.health
    health.restarted(what)
    metrics.RESTARTS_WITHOUT_PROGRESS.labels(job.pipeline.name).set(health.restarts)
    job.publish_health()
    delay = health.retry_delay()
    log.warning("restarting from checkpoints", reason=what, retry_in_s=delay,
                restarts_without_progress=health.restarts)
    _sleep(delay, should_stop)


def _sleep(seconds: float, should_stop: Callable[[], bool]) -> None:
    """Wait, but return soon after a stop request (the backoff may be 30 s)."""
    deadline = time.monotonic() + seconds
    while not should_stop() and time.monotonic() < deadline:
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))


def _raised(text: str, base: type[Exception]) -> str | None:
    """The message of the first error of class `base`, or of a subclass, that a Python
    worker's traceback in `text` names by its module path (`tailrace_services.delivery.
    sinks.exactly_once.SinkLostWrites: ...`): Spark hands back only the text."""
    for found in _RAISED.finditer(text):
        module, name, message = found.group(1), found.group(2), found.group(3)
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if isinstance(cls, type) and issubclass(cls, base):
            return message.strip()[:500]
    return None


def _first_line(text: str, marker: str) -> str:
    """The message of the first `...<marker>: message` line of a (Java-wrapped) traceback."""
    found = re.search(rf"\b\w*{marker}\w*: (.+)", text)
    if found:
        return found.group(1).strip()[:500]
    return text.strip().splitlines()[0][:500] if text.strip() else "unknown error"
