"""The capture-mysql lifecycle: connect -> settings -> identity and position -> stream -> publish.

On every (re)connect: the binlog settings are checked (connection.py), the
server's identity is compared with the stored one and the position is
checked or reconciled (identity.py, position.py). Streaming then starts by
GTID from the furthest of: the minimum position every sink checkpointed, and
what the bus provably holds already (resume.py) — or, after a lost binlog
connection, from the last transaction this process published.

One transaction at a time (GTID .. XID/COMMIT) is buffered whole, spilling to
disk past `max_tx_memory_events`, stamped (`tx_index/tx_size/tx_end`,
deterministic ids, idempotency keys) and handed to `BusPublisher`, which
blocks when the bus is slow (backpressure; nothing is dropped) and closes an
epoch after it. DDL invalidates the table's schema, registers the new
fingerprint and is emitted as a `ddl` event; TRUNCATE as a `truncate` event.

A lost position raises `PositionLostError` ("position lost: <reason>.
Re-snapshot required."), reported to the control service as
`position_lost`; the process exits non-zero.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import pymysql
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from tailrace.config import PipelineSpec
from tailrace.config._model import MysqlSourceSpec
from tailrace.control_client import ControlClient
from tailrace.errors import ConfigError, PositionLostError, RetryableError
from tailrace.events import ChangeEvent, Op, Position
from tailrace.lifecycle import Backoff, CaptureLifecycle, CaptureService, Reconnect
from tailrace.logs import get_logger
from tailrace.proto.event_pb2 import MysqlPosition
from tailrace.publisher import BusPublisher
from tailrace.txbuffer import TransactionBuffer
from tailrace_services.capture_mysql import metrics
from tailrace_services.capture_mysql.connection import (
    ConnectionSettings,
    ServerFacts,
    connect,
    read_facts,
)
from tailrace_services.capture_mysql.events import EventFactory
from tailrace_services.capture_mysql.gtid import MariadbGtidPosition
from tailrace_services.capture_mysql.identity import (
    ServerCheck,
    identity_attributes,
    identity_fingerprint,
)
from tailrace_services.capture_mysql.position import CapturePosition
from tailrace_services.capture_mysql.resume import published_tail
from tailrace_services.capture_mysql.schema import SchemaTracker
from tailrace_services.capture_mysql.stream import (
    BinlogStream,
    Idle,
    RowChange,
    Statement,
    StreamLostError,
    TxBegin,
    TxCommit,
)
from tailrace_services.capture_mysql.tables import TableFilter, ddl_targets

__all__ = ["MysqlCapture", "default_replica_server_id"]

log = get_logger(__name__)


def default_replica_server_id(pipeline: str, source_id: str) -> int:
    """A stable server_id per pipeline and source, away from the small ids servers use."""
    return 1_000_000 + zlib.crc32(f"{pipeline}/{source_id}".encode()) % 2_000_000_000


class MysqlCapture(CaptureService):
    def __init__(self, pipeline: PipelineSpec, control: ControlClient) -> None:
        source = pipeline.spec.source
        if not isinstance(source, MysqlSourceSpec):
            raise ConfigError(f"spec.source.type is {source.type!r}; MysqlCapture needs mysql")
        self.pipeline = pipeline
        self.source = source
        self.control = control
        self.settings = ConnectionSettings.from_dsn(source.dsn.get_secret_value())
        self.replica_server_id = source.server_id or default_replica_server_id(
            pipeline.name, source.id)
        self.filter = TableFilter(source.tables)
        self.sink_ids = [s.id for s in pipeline.spec.sinks]
        self.heartbeat_s = 0.5
        self.read_timeout_s = 10.0
        self.published: CapturePosition | None = None  # last transaction handed to the bus
        # A fixed doubling, never reset; /ready stays up once streaming has started.
        self.lifecycle = CaptureLifecycle(pipeline, control, self._on_error, Backoff(0.5, 10.0))

    # -- lifecycle ---------------------------------------------------------------------

    def _on_error(self, error: Exception) -> Reconnect | None:
        if isinstance(error, StreamLostError):
            # The bus is fine: continue after what this process published.
            metrics.RECONNECTS.labels(self.source.id).inc()
            return Reconnect("binlog connection lost; reconnecting")
        if isinstance(error, RetryableError | pymysql.err.MySQLError | OSError):
            # The bus may have lost what it did not acknowledge: recompute from it.
            self.published = None
            metrics.RECONNECTS.labels(self.source.id).inc()
            return Reconnect("capture interrupted; reconnecting")
        return None

    def _selected_tables(self, conn: pymysql.connections.Connection) -> list[tuple[str, str]]:
        with conn.cursor() as cur:
            cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                        "WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY 1, 2")
            return [(str(d), str(t)) for d, t in cur.fetchall() if self.filter.matches(d, t)]

    def _prepare(self) -> tuple[ServerFacts, CapturePosition, list[tuple[str, str]]]:
        conn = connect(self.settings)
        try:
            facts = read_facts(conn, self.settings, self.replica_server_id, self.source.id)
            tables = self._selected_tables(conn)
            checkpoint = self._checkpoint(facts)
            start = self._start(facts, checkpoint)
            check = ServerCheck(self.control, self.source.id, self.replica_server_id,
                                self.source.on_schema_drift)
            # The checkpoint decides the reconcile; with none yet, where we start does.
            check.run(conn, self.settings.kwargs(), facts,
                      checkpoint or (start if start.tx_seq else None), tables)
            if checkpoint is not None and start is not checkpoint and start.tx_seq:
                check.position(conn, self.settings.kwargs(), facts, start)
            log.info("tables selected", tables=[f"{d}.{t}" for d, t in tables])
            return facts, start, tables
        finally:
            conn.close()

    def _checkpoint(self, facts: ServerFacts) -> CapturePosition | None:
        cp = self.control.minimum_checkpoint(self.source.id, self.sink_ids)
        if cp is None or not cp.position.HasField("mysql"):
            return None
        try:
            return CapturePosition.from_proto(cp.position, facts.flavor)
        except ValueError as e:
            raise PositionLostError(f"the sinks' checkpoint cannot be used with this "
                                    f"{facts.flavor} server: {e}") from None

    def _start(self, facts: ServerFacts, checkpoint: CapturePosition | None) -> CapturePosition:
        """The furthest known-safe position: in-process, the bus's tail, or the checkpoint."""
        candidates = [p for p in (checkpoint, self.published) if p is not None]
        if self.published is None:
            bus = self.pipeline.spec.bus
            tail = published_tail(bus.brokers, self.pipeline.bus_topic, bus.partitions,
                                  self.source.id, self.control.latest_epoch(self.source.id))
            if tail is not None and tail.HasField("mysql"):
                try:
                    candidates.append(CapturePosition.from_proto(tail, facts.flavor))
                except ValueError as e:
                    log.warning("the bus tail holds an unusable position", error=str(e))
        if candidates:
            return max(candidates, key=lambda p: p.tx_seq)
        if facts.flavor == "mariadb":
            first = facts.first_binlog
            state = first.gtid_list if first and first.gtid_list else MariadbGtidPosition()
            return CapturePosition("mariadb", gtid_set=str(state))
        return CapturePosition("mysql", gtid_set=str(facts.gtid_purged))

    def _session(self) -> None:
        """One connection: checks, then stream until stopped."""
        facts, start, tables = self._prepare()
        bus = self.pipeline.spec.bus
        publisher = BusPublisher(bus.brokers, self.pipeline.bus_topic, bus.partitions,
                                 self.source.id, self.control, self.source.epoch_ms)
        stream = BinlogStream(
            self.settings.kwargs(), replica_server_id=self.replica_server_id,
            start=start.state(), schemas=self.filter.databases(),
            first_file=facts.oldest_binlog if facts.flavor == "mysql" and not start.gtid_set
            else None, heartbeat_s=self.heartbeat_s, read_timeout_s=self.read_timeout_s)
        self.lifecycle.streaming()
        log.info("streaming", flavor=facts.flavor, server_id=facts.server_id,
                 resume_after=start.describe(), replica_server_id=self.replica_server_id)
        try:
            self._stream(stream, publisher, facts, start, tables)
        finally:
            stream.close()
            publisher.close()

    # -- the stream --------------------------------------------------------------------

    def _stream(self, stream: BinlogStream, publisher: BusPublisher, facts: ServerFacts,
                start: CapturePosition, tables: list[tuple[str, str]]) -> None:
        sid = self.source.id
        factory = EventFactory(sid, self.pipeline.tenant)
        schemas = SchemaTracker(self.control, self.pipeline.tenant, self.settings, facts.flavor)
        check = ServerCheck(self.control, sid, self.replica_server_id,
                            self.source.on_schema_drift)
        buffer = TransactionBuffer(self.source.max_tx_memory_events)
        identity = identity_fingerprint(facts.flavor, identity_attributes(facts))
        position = start
        begin: TxBegin | None = None
        ddl_seen = False
        for item in stream.items():
            if isinstance(item, Idle):
                publisher.tick()
            elif isinstance(item, TxBegin):
                begin, ddl_seen = item, False
                buffer.clear()
            elif isinstance(item, RowChange):
                self._rows(item, schemas, factory, buffer, self._next(position, item, begin))
            elif isinstance(item, Statement):
                ddl_seen |= self._statement(item, schemas, factory, buffer,
                                            self._next(position, item, begin))
            elif isinstance(item, TxCommit):
                position = position.after(
                    gtid=item.gtid, gtid_set=item.gtid_set, file=item.file, offset=item.offset,
                    file_created_unix=item.file_created_unix, server_id=facts.server_id,
                    identity=identity)
                if len(buffer):
                    self._publish(publisher, factory, buffer, position, item.timestamp)
                else:
                    publisher.tick()
                self.published = position
                metrics.LAG_SECONDS.labels(sid).set(max(time.time() - item.timestamp, 0))
                if ddl_seen:
                    self._refresh_identity(check, facts)
                buffer.clear()
                begin = None
            if self.lifecycle.stopping:
                return

    @staticmethod
    def _next(position: CapturePosition, item: object, begin: TxBegin | None) -> Position:
        """The position the open transaction will get (for schema registration)."""
        gtid = begin.gtid if begin is not None else ""
        return Position(tx_seq=position.tx_seq + 1, mysql=MysqlPosition(gtid=gtid))

    def _rows(self, item: RowChange, schemas: SchemaTracker, factory: EventFactory,
              buffer: TransactionBuffer, position: Position) -> None:
        event = item.event
        if not self.filter.matches(event.schema, event.table):
            return
        shape, decoder, sequence = schemas.for_rows(event.schema, event.table, event.columns,
                                                    position)
        rows = event.rows
        metrics.ROWS_DECODED.labels(self.source.id).inc(len(rows))
        if isinstance(event, WriteRowsEvent):
            for r in rows:
                buffer.append(factory.change(shape, sequence, Op.OP_INSERT, decoder.row(None),
                                             decoder.row(r["values"], r["none_sources"])))
        elif isinstance(event, UpdateRowsEvent):
            for r in rows:
                buffer.append(factory.change(
                    shape, sequence, Op.OP_UPDATE,
                    decoder.row(r["before_values"], r["before_none_sources"]),
                    decoder.row(r["after_values"], r["after_none_sources"])))
        elif isinstance(event, DeleteRowsEvent):
            for r in rows:
                buffer.append(factory.change(shape, sequence, Op.OP_DELETE,
                                             decoder.row(r["values"], r["none_sources"]),
                                             decoder.row(None)))

    def _statement(self, item: Statement, schemas: SchemaTracker, factory: EventFactory,
                   buffer: TransactionBuffer, position: Position) -> bool:
        """DDL and TRUNCATE on selected tables become events; True when schemas changed."""
        changed = False
        for target in ddl_targets(item.query, item.schema):
            if not self.filter.matches(target.database, target.table):
                continue
            if target.kind == "truncate":
                shape = schemas.latest.get((target.database, target.table))
                seq = schemas.register(shape, position) if shape is not None else 0
                buffer.append(factory.truncate(target.database, target.table, shape, seq))
                continue
            shape, seq = schemas.after_ddl(target.database, target.table,
                                           position.mysql.gtid, position)
            buffer.append(factory.ddl(target.database, target.table, item.query, shape, seq))
            changed = True
            log.info("ddl", table=f"{target.database}.{target.table}", kind=target.kind)
        return changed

    def _publish(self, publisher: BusPublisher, factory: EventFactory,
                 buffer: TransactionBuffer, position: CapturePosition, commit_ts: int) -> None:
        sid = self.source.id
        size = len(buffer)
        metrics.SPILL_BYTES.labels(sid).set(buffer.spilled_bytes)
        nbytes = 0
        native = position.to_proto()
        captured_us = int(time.time() * 1_000_000)

        def stamped() -> Any:
            nonlocal nbytes
            for i, ev in enumerate(buffer):
                out: ChangeEvent = factory.stamp(ev, position, index=i, size=size,
                                                 commit_ts=commit_ts, native=native,
                                                 captured_us=captured_us)
                nbytes += out.ByteSize()
                yield out

        publisher.publish_transaction(stamped())
        metrics.EVENTS.labels(sid).inc(size)
        metrics.TRANSACTIONS.labels(sid).inc()
        metrics.BYTES.labels(sid).inc(nbytes)

    def _refresh_identity(self, check: ServerCheck, facts: ServerFacts) -> None:
        try:
            conn = connect(self.settings)
        except RetryableError as e:
            log.warning("cannot refresh the stored identity after DDL", error=str(e))
            return
        try:
            check.refresh(conn, facts, self._selected_tables(conn))
        finally:
            conn.close()
