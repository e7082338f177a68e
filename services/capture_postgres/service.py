"""The capture-postgres service: wiring of its parts into the shared capture lifecycle.

Each session:

1. reads the resume point (`tailrace_services.capture.resume`: for PostgreSQL, the
   minimum checkpoint of the pipeline's sinks, and the latest recorded epoch);
2. connects for replication, checks the server's settings (`connection.py`), reads
   its identity (IDENTIFY_SYSTEM) and checks it and the position with the control
   service (`identity.py`, `position.py`) — a lost position stops the source for good;
3. selects the tables by pattern and brings the publication up to date (`tables.py`),
   then creates the slot if it is missing and nothing was ever read from one
   (publication first: pgoutput reads it with the catalog as of each change); a
   selected table without a key is named in a warning (`schema.py`);
4. streams: the change feed (`events.py`) through the shared assembler to the bus,
   until stopped or until the connection breaks; with `source.heartbeat_ms`, a heartbeat
   written into the database that often moves the slot while its tables are idle
   (`position.Heartbeat`).

What an error means is `errors.py`; transient failures start a new session after a
backoff with jitter, fatal ones are reported and raised (`lifecycle.py`).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from tailrace.config import PipelineSpec, PostgresSourceSpec
from tailrace.control_client import ControlClient
from tailrace.errors import FatalError
from tailrace.logs import get_logger
from tailrace_services.capture.assembler import Assembler
from tailrace_services.capture.lifecycle import CaptureService
from tailrace_services.capture.publisher import idle_report_s
from tailrace_services.capture.resume import ResumePoint
from tailrace_services.capture.retained import RetainedLog
from tailrace_services.capture.snapshot import SnapshotMerger, SnapshotProgress, SnapshotWorker
from tailrace_services.capture_postgres.connection import (
    ReplicationConnection,
    SystemIdentity,
    check_settings,
    connect,
    lsn_to_str,
)
from tailrace_services.capture_postgres.errors import session_errors
from tailrace_services.capture_postgres.events import READ_TIMEOUT_S, ChangeFeed, EventFactory
from tailrace_services.capture_postgres.identity import Checked, ServerCheck
from tailrace_services.capture_postgres.position import Heartbeat, SlotFeedback, Timelines
from tailrace_services.capture_postgres.schema import (
    KeyCatalog,
    SchemaTracker,
    check_key_columns,
    keyless_fix,
    keyless_tables,
)
from tailrace_services.capture_postgres.snapshot import PostgresChunks
from tailrace_services.capture_postgres.tables import TableWatcher, table_matcher

__all__ = ["PostgresCapture"]

log = get_logger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 10.0
STOP_GRACE_S = 5.0  # how long a stop waits for a slow bus before abandoning what is in flight


class PostgresCapture(CaptureService[PostgresSourceSpec]):
    """Runs one pipeline's PostgreSQL source; `health` and `ready` feed the HTTP side port."""

    source_type = "postgres"
    skip_published = False  # its slot re-sends everything after the checkpoint (resume.py)
    backoff_s = (BACKOFF_BASE_S, BACKOFF_MAX_S)
    session_errors = staticmethod(session_errors)

    def __init__(self, pipeline: PipelineSpec, control: ControlClient) -> None:
        super().__init__(pipeline, control, PostgresSourceSpec)
        source = self.source
        self.dsn = source.dsn.get_secret_value()
        self.slot = source.slot or f"tailrace_{pipeline.name.replace('-', '_').replace('.', '_')}"
        self.publication = source.publication or self.slot
        self.sink_ids = [s.id for s in pipeline.spec.sinks]
        self._registered = False
        self.lifecycle.can_resnapshot = True  # `identity.ServerCheck._accept`

    def _abandon(self) -> bool:
        lifecycle = self.lifecycle
        return lifecycle.stopping and time.monotonic() - lifecycle.stopped_at > STOP_GRACE_S

    def _session(self) -> None:
        """One connection: checks, then stream until stopped."""
        if not self._registered:
            self.control.register_pipeline(self.pipeline)
            self._registered = True
        point = self.resume.read()
        progress = SnapshotProgress(self.control, self.pipeline, self.source_type)
        record = progress.read()  # a resnapshot asked for: take the server as it is now
        accept = (record.resnapshot_reason or "requested") if record.resnapshot_requested else ""
        with ReplicationConnection(self.dsn) as repl:
            system = repl.identify_system()
            with connect(self.dsn) as conn:
                tables, checked = self._prepare(repl, conn, system, point, accept)
            resume = checked.resume
            if self.source.create_slot and not resume.has_position:
                # Never once something was read from the slot: a new one would start
                # later and hide the gap (if the check failed, START says the slot is gone).
                created = repl.create_slot(self.slot)
                if created is not None:
                    log.info("replication slot created", slot=self.slot,
                             consistent_lsn=lsn_to_str(created))
            timelines = Timelines(system.timeline, tuple(repl.timeline_history(system.timeline)),
                                  checked.era)
            keys = KeyCatalog(self.dsn, self.source.snapshot.key_columns)
            merger = SnapshotMerger(self.source.id, self.pipeline.tenant)
            worker = self._snapshot_worker(merger, progress, system.dbname, tables)
            watcher = TableWatcher(self.dsn, self.source.tables, self.publication, tables,
                                   manage=self.source.create_slot,
                                   on_added=lambda new: worker.add_tables(
                                       [f"{s}.{t}" for s, t in new]))
            heartbeat = Heartbeat(self.dsn, self.source.heartbeat_ms / 1000)

            def tick() -> None:
                watcher.poll()
                heartbeat.poll()

            feedback = SlotFeedback(repl, self.control, self.source.id, self.sink_ids,
                                    self.metrics, resume_lsn=resume.lsn,
                                    confirmed_lsn=resume.confirm_lsn, era=checked.era,
                                    abandon=self._abandon, slot=self.slot)
            feed = ChangeFeed(
                repl, EventFactory(self.source.id, self.pipeline.tenant, system.dbname,
                                   timelines, keys.key_of),
                SchemaTracker(self.control, self.source.id, self.pipeline.tenant,
                              system.dbname, self.source.on_schema_drift,
                              keys.committed_fingerprint),
                feedback, self.metrics, resume_lsn=resume.lsn, history=checked.history,
                tick=tick, idle_s=idle_report_s(self.source.epoch_ms, READ_TIMEOUT_S),
                max_in_memory=self.source.max_tx_memory_events)
            retained: RetainedLog | None = None
            try:
                with Assembler(self.pipeline, self.control, self.metrics, self.resume,
                               idle=feedback.keep_alive) as assembler:
                    # before anything of this session is published
                    worker.start(resnapshot=accept,
                                 bus_lost=assembler.publisher.generation_opened)
                    self._take_slot()
                    repl.start(self.slot, self.publication, 0, messages=True,
                               stream_over=self.source.stream_transactions_over)
                    self.lifecycle.streaming()
                    retained = RetainedLog(self.control, self.source.id, self.metrics,
                                           feedback.retained, self.source.max_retained).start()
                    log.info("streaming", slot=self.slot, system_id=system.system_id,
                             timeline=system.timeline, resume_after=lsn_to_str(resume.lsn))
                    assembler.run(merger.items(feed.items()),
                                  stopped=lambda: self.lifecycle.stopping)
            finally:
                if retained is not None:
                    retained.stop()
                worker.stop()
                heartbeat.close()
                watcher.close()
                keys.close()

    def _take_slot(self) -> None:
        """Holding the capture lease (`tailrace.lease`), end a session of another instance still
        streaming from the slot: one that lost the lease (paused, cut off) keeps the slot
        active until the server notices, which would keep this one from starting."""
        if self.lease is None:
            return
        if not self.lease.confirm():
            raise FatalError(self.lease.lost)  # back to standby (CaptureService.run)
        with connect(self.dsn) as conn:
            row = conn.execute("SELECT active_pid FROM pg_replication_slots "
                               "WHERE slot_name = %s AND active", (self.slot,)).fetchone()
            if row is not None:
                log.warning("the slot is streamed by a session of an instance that lost the "
                            "capture lease; ending it", slot=self.slot, pid=row[0])
                conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))

    def _snapshot_worker(self, merger: SnapshotMerger, progress: SnapshotProgress,
                         database: str, tables: list[tuple[str, str]]) -> SnapshotWorker:
        """The session's snapshot reader (`tailrace_services.capture.snapshot`)."""
        snapshot = self.source.snapshot
        readers = [PostgresChunks(self.dsn, self.source.id, self.pipeline.tenant, database,
                                  snapshot.key_columns) for _ in range(snapshot.parallelism)]
        selected = {f"{s}.{t}": readers[0].key_columns(f"{s}.{t}") for s, t in tables}
        return SnapshotWorker(self.pipeline, self.control, readers, merger, progress,
                              selected, self.metrics, on_all_done=self.lifecycle.stop)

    def _prepare(self, repl: ReplicationConnection, conn: psycopg.Connection[Any],
                 system: SystemIdentity, point: ResumePoint, accept: str
                 ) -> tuple[list[tuple[str, str]], Checked]:
        """Server settings, identity and position, then the tables and the publication;
        returns the tables and where to stream from (`identity.Checked`)."""
        check_settings(conn, self.source.id)
        tables = TableWatcher.resolve(conn, table_matcher(self.source.tables))
        checked = ServerCheck(self.control, self.source.id, self.pipeline.tenant, self.slot,
                              self.source.create_slot, self.source.on_schema_drift
                              ).run(repl, conn, system, point, tables, accept)
        TableWatcher.publish(conn, self.publication, tables, self.source.create_slot)
        log.info("tables selected", tables=[f"{s}.{t}" for s, t in tables],
                 publication=self.publication)
        check_key_columns(conn, tables, self.source.snapshot.key_columns)
        for table in keyless_tables(conn, tables):
            if f"{table.schema}.{table.table}" in self.source.snapshot.key_columns:
                continue  # keyed by the spec
            log.warning("selected table has no key: its events will carry no key columns; a "
                        "postgres sink stops at its first update or delete, kafka keeps all "
                        "its messages in one partition",
                        table=f"{table.schema}.{table.table}",
                        replica_identity=table.replica_identity,
                        fix=keyless_fix(table.schema, table.table))
        return tables, checked
