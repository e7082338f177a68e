"""The capture-postgres lifecycle: connect -> identity and position -> slot -> stream -> publish.

Each session:

1. reads the resume position: the minimum checkpoint of the pipeline's sinks;
2. connects for replication, reads the server's identity (IDENTIFY_SYSTEM) and
   checks it and the position with the control service (`identity.py`,
   `position.py`) — a lost position stops the source for good;
3. selects the tables by pattern and brings the publication up to date, then
   creates the slot if it is missing (publication first: pgoutput reads it
   with the catalog as of each change);
4. streams (`stream.py`) until stopped or until the connection breaks.

Transient failures (connection lost, server restarting, bus or control service
unreachable) start a new session after a backoff with jitter; the new session
resumes from the minimum checkpoint, so nothing is lost. Fatal ones (a lost
position, halted schema drift, authentication) are reported to the control
service and `health` turns unhealthy, then `run()` raises.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg

from tailrace.config import PipelineSpec, PostgresSourceSpec
from tailrace.control_client import ControlClient
from tailrace.errors import FatalError, RetryableError, SourceConfigurationError
from tailrace.lifecycle import Backoff, CaptureLifecycle, CaptureService, Fail, Reconnect, Stop
from tailrace.logs import get_logger
from tailrace.publisher import BusPublisher
from tailrace_services.capture_postgres import metrics
from tailrace_services.capture_postgres.events import EventFactory
from tailrace_services.capture_postgres.identity import ServerCheck
from tailrace_services.capture_postgres.position import Resume, Timelines
from tailrace_services.capture_postgres.replication import (
    ReplicationConnection,
    SystemIdentity,
    lsn_to_str,
)
from tailrace_services.capture_postgres.schema import SchemaTracker
from tailrace_services.capture_postgres.stream import ChangeStream, StreamStopped
from tailrace_services.capture_postgres.tables import TableWatcher

__all__ = ["PostgresCapture"]

log = get_logger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 10.0
STOP_GRACE_S = 5.0  # how long a stop waits for a slow bus before abandoning what is in flight


class PostgresCapture(CaptureService):
    """Runs one pipeline's PostgreSQL source; `health` and `ready` feed the HTTP side port."""

    def __init__(self, pipeline: PipelineSpec, control: ControlClient) -> None:
        source = pipeline.spec.source
        if not isinstance(source, PostgresSourceSpec):
            raise TypeError(f"PostgresCapture needs a postgres source, got {source.type!r}")
        self.pipeline = pipeline
        self.source = source
        self.control = control
        self.dsn = source.dsn.get_secret_value()
        self.slot = source.slot or f"tailrace_{pipeline.name.replace('-', '_').replace('.', '_')}"
        self.publication = source.publication or self.slot
        self.sink_ids = [s.id for s in pipeline.spec.sinks]
        self._registered = False
        self.lifecycle = CaptureLifecycle(pipeline, control, self._on_error,
                                          Backoff(BACKOFF_BASE_S, BACKOFF_MAX_S))

    def _abandon(self) -> bool:
        lifecycle = self.lifecycle
        return lifecycle.stopping and time.monotonic() - lifecycle.stopped_at > STOP_GRACE_S

    def _on_error(self, error: Exception) -> Reconnect | Fail | Stop | None:
        if isinstance(error, StreamStopped):
            return Stop("stopped while waiting for the bus; unacknowledged events will be "
                        "published again from the checkpoint")
        if isinstance(error, RetryableError | psycopg.OperationalError):
            metrics.RECONNECTS.labels(self.source.id).inc()
            return Reconnect("capture interrupted; reconnecting")
        if isinstance(error, psycopg.Error):  # a statement the source refused: not transient
            reason = f"source {self.source.id}: {type(error).__name__}: {error}"
            return Fail(reason, FatalError(reason))
        return None

    def _session(self) -> None:
        """One connection: checks, then stream until stopped."""
        if not self._registered:
            self.control.register_pipeline(self.pipeline)
            self._registered = True
        resume = Resume.of(self.control.minimum_checkpoint(self.source.id, self.sink_ids),
                           self.control.latest_epoch(self.source.id))
        with ReplicationConnection(self.dsn) as repl:
            system = repl.identify_system()
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                tables = self._prepare(repl, conn, system, resume)
            if self.source.create_slot:
                created = repl.create_slot(self.slot)
                if created is not None:
                    log.info("replication slot created", slot=self.slot,
                             consistent_lsn=lsn_to_str(created))
            database = system.dbname
            timelines = Timelines(system.timeline,
                                  tuple(repl.timeline_history(system.timeline)))
            stream = ChangeStream(
                repl, self.control, source_id=self.source.id, sink_ids=self.sink_ids,
                factory=EventFactory(self.source.id, self.pipeline.tenant, database, timelines),
                schemas=SchemaTracker(self.control, self.source.id, self.pipeline.tenant,
                                      database, self.source.on_schema_drift),
                max_tx_memory_events=self.source.max_tx_memory_events, resume_lsn=resume.lsn,
                abandon=self._abandon)
            bus = self.pipeline.spec.bus
            publisher = BusPublisher(bus.brokers, self.pipeline.bus_topic, bus.partitions,
                                     self.source.id, self.control, self.source.epoch_ms,
                                     idle=stream.keep_alive)
            repl.start(self.slot, self.publication, 0)
            self.lifecycle.streaming()
            log.info("streaming", slot=self.slot, system_id=system.system_id,
                     timeline=system.timeline, resume_after=lsn_to_str(resume.lsn))
            watcher = TableWatcher(self.dsn, self.source.tables, self.publication, tables,
                                   manage=self.source.create_slot)
            try:
                stream.run(publisher, stopped=lambda: self.lifecycle.stopping, tick=watcher.poll)
            except BaseException:
                # The next session publishes again from the checkpoint; never hide the error.
                with contextlib.suppress(Exception):
                    publisher.abort()
                raise
            finally:
                watcher.close()
            publisher.close()

    def _prepare(self, repl: ReplicationConnection, conn: psycopg.Connection[Any],
                 system: SystemIdentity, resume: Resume) -> list[tuple[str, str]]:
        """Server settings, identity and position, then the tables and the publication."""
        row = conn.execute("SHOW wal_level").fetchone()
        wal_level = row[0] if row else "unknown"
        if wal_level != "logical":
            raise SourceConfigurationError(
                f"source {self.source.id}: wal_level is {wal_level!r}; set wal_level = logical "
                "in postgresql.conf and restart PostgreSQL")
        row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        if row and row[0]:
            raise RetryableError(
                f"source {self.source.id}: the server is a standby (in recovery), where "
                "PostgreSQL 15 cannot decode; waiting for it to be promoted, or point "
                "spec.source.dsn at the primary")
        tables = TableWatcher.resolve(conn, self.source.tables)
        ServerCheck(self.control, self.source.id, self.pipeline.tenant, self.slot,
                    self.source.create_slot, self.source.on_schema_drift
                    ).run(repl, conn, system, resume, tables)
        TableWatcher.publish(conn, self.publication, tables, self.source.create_slot)
        log.info("tables selected", tables=[f"{s}.{t}" for s, t in tables],
                 publication=self.publication)
        return tables
