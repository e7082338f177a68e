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
import random
import time
from typing import Any

import psycopg

from tailrace.bus import ensure_topic
from tailrace.config import PipelineSpec, PostgresSourceSpec
from tailrace.control_client import ControlClient
from tailrace.errors import (
    ConfigError,
    FatalError,
    NonRetryableError,
    PositionLostError,
    RetryableError,
    SourceConfigurationError,
)
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


class PostgresCapture:
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
        self.health: tuple[bool, str] = (True, "starting")
        self.ready = False
        self._stop = False
        self._stop_at = 0.0
        self._registered = False

    def stop(self) -> None:
        if not self._stop:
            self._stop, self._stop_at = True, time.monotonic()

    def _abandon(self) -> bool:
        return self._stop and time.monotonic() - self._stop_at > STOP_GRACE_S

    def run(self) -> None:
        """Run until stopped; transient failures reconnect with backoff, fatal ones raise."""
        bus = self.pipeline.spec.bus
        failures = 0
        while not self._stop:
            try:
                ensure_topic(bus.brokers, self.pipeline.bus_topic, bus.partitions)
                self._session()
                return
            except PositionLostError as e:
                self._fail("position_lost", str(e))
                raise
            except FatalError as e:
                self._fail("failed", str(e))
                raise
            except NonRetryableError as e:
                self._fail("failed", str(e))
                raise FatalError(str(e)) from e
            except ConfigError as e:  # the spec or the source's settings: the operator's fix
                self._fail("failed", str(e))
                raise
            except StreamStopped:
                log.warning("stopped while waiting for the bus; unacknowledged events will be "
                            "published again from the checkpoint")
                return
            except (RetryableError, psycopg.OperationalError) as e:
                failures = 1 if self.ready else failures + 1  # streaming had started: reset
                self.ready = False
                delay = random.uniform(BACKOFF_BASE_S / 2,
                                       min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (failures - 1)))
                self.health = (True, f"reconnecting: {e}")
                metrics.RECONNECTS.labels(self.source.id).inc()
                log.warning("capture interrupted; reconnecting", error=str(e),
                            retry_in_s=round(delay, 2))
                self._sleep(delay)
            except psycopg.Error as e:  # a statement the source refused: not transient
                reason = f"source {self.source.id}: {type(e).__name__}: {e}"
                self._fail("failed", reason)
                raise FatalError(reason) from e

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop and time.monotonic() < deadline:
            time.sleep(min(0.1, deadline - time.monotonic()))

    def _fail(self, state: str, reason: str) -> None:
        self.health = (False, reason)
        self.ready = False
        log.error("capture stopped", state=state, reason=reason)
        try:
            self.control.report_health(self.source.id, state, reason)
        except (RetryableError, NonRetryableError) as e:
            log.warning("cannot report health to the control service", error=str(e))

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
            self.health = (True, "streaming")
            self.ready = True
            self.control.report_health(self.source.id, "running", "")
            log.info("streaming", slot=self.slot, system_id=system.system_id,
                     timeline=system.timeline, resume_after=lsn_to_str(resume.lsn))
            watcher = TableWatcher(self.dsn, self.source.tables, self.publication, tables,
                                   manage=self.source.create_slot)
            try:
                stream.run(publisher, stopped=lambda: self._stop, tick=watcher.poll)
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
