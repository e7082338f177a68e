"""The capture-mysql service: wiring of its parts into the shared capture lifecycle.

Each session:

1. connects, checks the binlog settings and reads the facts about the server
   (`connection.py`), and selects the tables by pattern (`tables.py`); a table
   `snapshot.key_columns` names must be fit to be keyed by them (`schema.check_key_columns`,
   else capture refuses to start), another selected table without a primary key is named in
   a warning;
2. reads the resume point (`tailrace_services.capture.resume`: the furthest of the
   sinks' minimum checkpoint and what the bus provably holds, or what this process
   published before a lost binlog connection) and turns it into GTID positions
   (`position.resume_from`);
3. compares the server's identity with the stored one and checks the checkpoint
   (and a start past it) is reachable, or reconciles (`identity.py`, `position.py`);
   with a resnapshot asked for in the snapshot record (an operator's `tailrace
   resnapshot`, or `snapshot.mode: when_needed` after a lost position, `lifecycle.py`),
   it takes the server as it is now instead: streaming starts at its current GTID state,
   numbered above everything published, and every table is read again, each after a
   TRUNCATE event;
4. streams: the binlog by GTID (`reader.py`), turned into events (`events.py`),
   through the snapshot merger and the shared assembler to the bus, until stopped or
   the connection breaks; beside it, the snapshot reader (`snapshot.py`, the shared
   `tailrace_services.capture.snapshot`) reads the tables the snapshot record asks for,
   writing its watermarks to the signal table (`signal_table.py`).

What an error means is `errors.py`; transient failures start a new session after a
backoff with jitter, fatal ones are reported and raised (`lifecycle.py`). A lost
position raises `PositionLostError` ("position lost: <reason>. Re-snapshot
required."), reported to the control service as `position_lost`.
"""

from __future__ import annotations

import zlib

import pymysql

from tailrace.config import MysqlSourceSpec, PipelineSpec
from tailrace.control_client import ControlClient
from tailrace.errors import ConfigError
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace_services.capture.assembler import Assembler
from tailrace_services.capture.lifecycle import CaptureService
from tailrace_services.capture.publisher import idle_report_s
from tailrace_services.capture.retained import RetainedLog
from tailrace_services.capture.snapshot import SnapshotMerger, SnapshotProgress, SnapshotWorker
from tailrace_services.capture_mysql.connection import (
    ConnectionSettings,
    ServerFacts,
    binlog_bytes_from,
    connect,
    read_facts,
)
from tailrace_services.capture_mysql.errors import session_errors
from tailrace_services.capture_mysql.events import ChangeFeed, EventFactory
from tailrace_services.capture_mysql.identity import (
    ServerCheck,
    identity_attributes,
    identity_fingerprint,
)
from tailrace_services.capture_mysql.position import CapturePosition, accepts
from tailrace_services.capture_mysql.reader import HEARTBEAT_S, BinlogStream
from tailrace_services.capture_mysql.schema import SchemaTracker, check_key_columns
from tailrace_services.capture_mysql.signal_table import SignalTable
from tailrace_services.capture_mysql.snapshot import MysqlChunks
from tailrace_services.capture_mysql.tables import TableFilter

__all__ = ["MysqlCapture", "default_replica_server_id"]

log = get_logger(__name__)


def default_replica_server_id(pipeline: str, source_id: str) -> int:
    """A stable server_id per pipeline and source, away from the small ids servers use."""
    return 1_000_000 + zlib.crc32(f"{pipeline}/{source_id}".encode()) % 2_000_000_000


class MysqlCapture(CaptureService[MysqlSourceSpec]):
    """Runs one pipeline's MySQL/MariaDB source; `health` and `ready` feed the HTTP side port."""

    source_type = "mysql"
    skip_published = True  # a session continues after what the bus already holds (resume.py)
    session_errors = staticmethod(session_errors)

    def __init__(self, pipeline: PipelineSpec, control: ControlClient) -> None:
        super().__init__(pipeline, control, MysqlSourceSpec)
        source = self.source
        self.settings = ConnectionSettings.from_dsn(source.dsn.get_secret_value())
        self.replica_server_id = source.server_id or default_replica_server_id(
            pipeline.name, source.id)
        self.signal = SignalTable.parse(source.snapshot.signal_table)
        self.filter = TableFilter(source.tables,
                                  exclude=[(self.signal.database, self.signal.table)])
        self._registered = False
        # the server's heartbeat in a quiet binlog is the feed's IDLE
        self.heartbeat_s = idle_report_s(source.epoch_ms, HEARTBEAT_S)
        self.read_timeout_s = 10.0
        self.lifecycle.can_resnapshot = True  # `identity.ServerCheck._accept`

    def _selected_tables(self, conn: pymysql.connections.Connection) -> list[tuple[str, str]]:
        with conn.cursor() as cur:
            cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                        "WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY 1, 2")
            return [(str(d), str(t)) for d, t in cur.fetchall() if self.filter.matches(d, t)]

    def _prepare(self, accept: str) -> tuple[ServerFacts, CapturePosition, list[tuple[str, str]]]:
        conn = connect(self.settings)
        try:
            facts = read_facts(conn, self.settings, self.replica_server_id, self.source.id)
            tables = self._selected_tables(conn)
            point = self.resume.read(accepts(facts.flavor))
            check = ServerCheck(self.control, self.source.id, self.pipeline.tenant,
                                self.replica_server_id, self.source.on_schema_drift)
            start = check.run(conn, self.settings.kwargs(), facts, point, tables,
                              from_now=not accept and self._snapshot_covers_the_past(),
                              accept=accept,
                              highest=lambda: self.resume.highest_published(point))
            log.info("tables selected", tables=[f"{d}.{t}" for d, t in tables])
            check_key_columns(conn, tables, self.source.snapshot.key_columns)
            self._warn_keyless(conn, [(d, t) for d, t in tables
                                      if f"{d}.{t}" not in self.source.snapshot.key_columns])
            return facts, start, tables
        finally:
            conn.close()

    def _snapshot_covers_the_past(self) -> bool:
        """A new pipeline that snapshots its tables first may stream from the server's current
        position (`position.resume_from`): only while no table's snapshot got anywhere — a
        table done, failed or cancelled, or read in part, relies on the stream from where it
        started, so a later session (with nothing on the bus: killed before its first
        publish, or a bus that lost its data) starts at the oldest binlog instead."""
        if self.source.snapshot.mode == "never":
            return False
        state = self.control.snapshot_state(self.pipeline.name)
        return all(t.state == pb.SNAPSHOT_PENDING or
                   (t.state == pb.SNAPSHOT_RUNNING and not t.chunks_done and not t.cursor
                    and not t.inflight)
                   for t in state.tables)

    @staticmethod
    def _warn_keyless(conn: pymysql.connections.Connection,
                      tables: list[tuple[str, str]]) -> None:
        with conn.cursor() as cur:
            cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLE_CONSTRAINTS "
                        "WHERE CONSTRAINT_TYPE = 'PRIMARY KEY'")
            keyed = {(str(d), str(t)) for d, t in cur.fetchall()}
        for db, table in tables:
            if (db, table) not in keyed:
                log.warning("selected table has no primary key: its events will carry no key "
                            "columns; a postgres sink stops at its first update or delete, "
                            "kafka keeps all its messages in one partition",
                            table=f"{db}.{table}", fix=f"add a primary key to {db}.{table}")

    def _session(self) -> None:
        """One connection: checks, then stream until stopped."""
        if not self._registered:  # the snapshot record belongs to a registered pipeline
            self.control.register_pipeline(self.pipeline)
            self._registered = True
        progress = SnapshotProgress(self.control, self.pipeline, self.source_type)
        record = progress.read()  # a resnapshot asked for: take the server as it is now
        accept = (record.resnapshot_reason or "requested") if record.resnapshot_requested else ""
        facts, start, tables = self._prepare(accept)
        stream = BinlogStream(
            self.settings.kwargs(), replica_server_id=self.replica_server_id,
            start=start.state(),
            first_file=facts.oldest_binlog if facts.flavor == "mysql" and not start.gtid_set
            else None, heartbeat_s=self.heartbeat_s, read_timeout_s=self.read_timeout_s)
        feed = ChangeFeed(
            stream, EventFactory(self.source.id, self.pipeline.tenant),
            SchemaTracker(self.control, self.pipeline.tenant, self.settings, facts.flavor,
                          self.source.snapshot.key_columns),
            self.filter, self.settings, self.metrics, start=start, server_id=facts.server_id,
            identity=identity_fingerprint(facts.flavor, identity_attributes(facts)),
            signal=self.signal, heartbeats=self.source.heartbeat_ms > 0)
        merger = SnapshotMerger(self.source.id, self.pipeline.tenant)
        worker = self._snapshot_worker(merger, progress, facts, tables)
        feed.on_table = lambda table: worker.add_tables([table])
        retained: RetainedLog | None = None
        try:
            with Assembler(self.pipeline, self.control, self.metrics, self.resume) as assembler:
                worker.start(resnapshot=accept,  # before anything of this session is published
                             bus_lost=assembler.publisher.generation_opened)
                self.lifecycle.streaming()
                retained = RetainedLog(self.control, self.source.id, self.metrics,
                                       self._binlogs_kept, self.source.max_retained).start()
                log.info("streaming", flavor=facts.flavor, server_id=facts.server_id,
                         resume_after=start.describe(),
                         replica_server_id=self.replica_server_id)
                assembler.run(merger.items(feed.items()),
                              stopped=lambda: self.lifecycle.stopping)
        finally:
            if retained is not None:
                retained.stop()
            worker.stop()
            stream.close()

    def _binlogs_kept(self) -> tuple[int, str] | None:
        """The binlog bytes from the sinks' minimum checkpoint on (`RetainedLog`); None
        before the first checkpoint."""
        checkpoint = self.control.minimum_checkpoint(
            self.source.id, [s.id for s in self.pipeline.spec.sinks])
        if checkpoint is None or not checkpoint.position.mysql.file:
            return None
        at = checkpoint.position.mysql
        return binlog_bytes_from(self.settings, at.file, at.offset)

    def _snapshot_worker(self, merger: SnapshotMerger, progress: SnapshotProgress,
                         facts: ServerFacts, tables: list[tuple[str, str]]) -> SnapshotWorker:
        """The session's snapshot reader (`tailrace_services.capture.snapshot`)."""
        readers = [MysqlChunks(self.settings, self.source.id, self.pipeline.tenant,
                               facts.flavor, self.signal, self.control,
                               self.source.snapshot.key_columns)
                   for _ in range(self.source.snapshot.parallelism)]
        selected = {}
        for database, table in tables:
            name = f"{database}.{table}"
            try:
                selected[name] = readers[0].key_columns(name)
            except ConfigError as e:  # dropped since it was selected
                log.info("selected table is gone", table=name, reason=str(e))
        return SnapshotWorker(self.pipeline, self.control, readers, merger, progress,
                              selected, self.metrics, on_all_done=self.lifecycle.stop)
