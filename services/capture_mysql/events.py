"""Decoded binlog changes -> `Change`s, transaction by transaction, for the assembler.

`ChangeFeed` reads one binlog session (`reader.py`) and yields what the shared
assembler (`tailrace_services.capture.assembler`) buffers and publishes: BEGIN, the
events of each row event of a selected table, a Commit that stamps them with the
position after the transaction, IDLE on a server heartbeat. MySQL's own rules happen
here:

- DDL on a selected table registers its new structure and becomes a `ddl` event;
  TRUNCATE a `truncate` event (`schema.SchemaTracker.after_ddl`, `tables.ddl_targets`);
- rows a STATEMENT or MIXED session changed arrive as statement text, which capture
  cannot turn into row changes: on a selected table (or one whose triggers may write
  one, or when the statement does not tell) that is a loud stop before the
  transaction is published, never a skip;
- a transaction that is one insert into the snapshot signal table and nothing else
  (`signal_table.py`) is a snapshot watermark: the feed yields a `Watermark` at the
  transaction's position (its own GTID and the next tx_seq, like any transaction). A
  read transaction the merger places there takes that position and replaces the
  (empty) commit; otherwise the empty commit follows as usual. So tx_seq still counts
  every binlog transaction once: no gap, no number used twice, and a restart after a
  read transaction resumes after the watermark's GTID. Other rows of the signal table
  (deletes, other transactions) are never events;
- a selected table that appears (CREATE TABLE, RENAME into the patterns) is named to the
  snapshot reader (`on_table`), which under `initial` reads its rows (a renamed table's
  rows were never in the stream under its new name);
- with `source.heartbeat_ms`, a transaction of other tables `advances` the position
  (`assembler.Commit.advances`): an epoch closes there, at most that often, and the sinks'
  checkpoints follow the binlog while the captured tables are idle, so a restart does not
  ask for binlogs the server purged meanwhile.

An event's id is `event_id(source_id, gtid, index, commit_ms)`: the same
transaction re-read after a restart, a reconnect or a failover to a replica
(GTIDs are global) gets the same ids and idempotency keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from tailrace.errors import PositionLostError
from tailrace.events import ChangeEvent, EventIds, Op, Position, idempotency_key
from tailrace.events import event_id as make_event_id
from tailrace.logs import get_logger
from tailrace.proto.event_pb2 import MysqlPosition
from tailrace_services.capture.assembler import BEGIN, IDLE, Commit, FeedItem
from tailrace_services.capture.changes import Change, ChangeStamp, ChangeTemplate
from tailrace_services.capture.metrics import CaptureMetrics
from tailrace_services.capture.snapshot import Watermark
from tailrace_services.capture_mysql.connection import ConnectionSettings, connect
from tailrace_services.capture_mysql.position import CapturePosition
from tailrace_services.capture_mysql.reader import (
    BinlogStream,
    Idle,
    RowChange,
    Statement,
    TxBegin,
    TxCommit,
    row_images,
)
from tailrace_services.capture_mysql.schema import SchemaTracker, TableShape
from tailrace_services.capture_mysql.signal_table import SignalTable
from tailrace_services.capture_mysql.tables import TableFilter, ddl_targets, written_tables

__all__ = ["ChangeFeed", "EventFactory"]

log = get_logger(__name__)


class EventFactory:
    """Builds the events of one transaction; ids and positions stamped when it committed."""

    def __init__(self, source_id: str, tenant: str) -> None:
        self.source_id = source_id
        self.tenant = tenant
        # per (table shape, schema sequence, op): what its changes share
        self._templates: dict[tuple[int, int, int], tuple[TableShape, ChangeTemplate]] = {}

    def template(self, shape: TableShape, sequence: int, op: Op) -> ChangeTemplate:
        """What the changes of one table shape, schema sequence and op share: its `change`
        makes one from its rows' bytes (`RowDecoder.images`; b"": an empty row), kept as
        bytes until its commit (`capture/changes.py`). A rows event's rows take it once."""
        cached = self._templates.get((id(shape), sequence, op))
        if cached is None or cached[0] is not shape:
            if len(self._templates) > 10_000:
                self._templates.clear()
            template = ChangeTemplate.of(ChangeEvent(
                source_id=self.source_id, tenant=self.tenant, database=shape.database,
                table=shape.table, op=op, key_columns=shape.key_columns,
                schema_version=shape.fingerprint, schema_sequence=sequence))
            cached = self._templates[(id(shape), sequence, op)] = (shape, template)
        return cached[1]

    def ddl(self, database: str, table: str, query: str, shape: TableShape | None,
            sequence: int) -> ChangeEvent:
        return ChangeEvent(
            source_id=self.source_id, tenant=self.tenant, database=database, table=table,
            op=Op.OP_DDL, ddl=query, schema_version=shape.fingerprint if shape else "",
            schema_sequence=sequence)

    def truncate(self, database: str, table: str, shape: TableShape | None, sequence: int
                 ) -> ChangeEvent:
        return ChangeEvent(
            source_id=self.source_id, tenant=self.tenant, database=database, table=table,
            op=Op.OP_TRUNCATE, key_columns=shape.key_columns if shape else [],
            schema_version=shape.fingerprint if shape else "", schema_sequence=sequence)

    def stamp(self, event: ChangeEvent, position: CapturePosition, *, index: int, size: int,
              commit_ts: int, native: Position | None = None, captured_us: int = 0,
              ids: EventIds | None = None) -> ChangeEvent:
        """Fill the transaction fields once the commit is known.

        `native` (the position's proto) and `captured_us` may be made once per
        transaction by the caller; the event's own index is set here.
        """
        event.tx_id = position.gtid
        event.tx_index = index
        event.tx_size = size
        event.tx_end = index == size - 1
        event.position.CopyFrom(native if native is not None else position.to_proto())
        event.position.event_index = index
        event.ts_source_micros = commit_ts * 1_000_000
        event.ts_captured_micros = captured_us or int(time.time() * 1_000_000)
        event.id = ids(index) if ids is not None else \
            make_event_id(self.source_id, position.gtid, index, commit_ts * 1000)
        event.idempotency_key = idempotency_key(self.tenant, event.database, event.table,
                                                event.tx_id, event.id)
        return event


def _excerpt(query: str, limit: int = 120) -> str:
    text = " ".join(query.split())
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass
class ChangeFeed:
    """One binlog session's transactions as the assembler's feed, from `start`;
    `server_id` and `identity` (of the server read) are recorded in every position."""

    stream: BinlogStream
    factory: EventFactory
    schemas: SchemaTracker
    tables: TableFilter
    settings: ConnectionSettings  # for catalog queries (triggers)
    metrics: CaptureMetrics
    start: CapturePosition
    server_id: int
    identity: str
    signal: SignalTable | None = None  # the snapshot signal table (watermarks)
    # a selected table appeared (CREATE, RENAME): the snapshot reader is told its name
    on_table: Callable[[str], None] | None = None
    heartbeats: bool = False  # `source.heartbeat_ms` > 0 (module docstring)

    def items(self) -> Iterator[FeedItem | Watermark]:
        position = self.start
        begin: TxBegin | None = None
        signal = self.signal
        marks: list[tuple[str, bool]] = []  # the open transaction's signal inserts
        other = False  # it holds anything else (rows of other tables, statements)
        for item in self.stream.items():
            if isinstance(item, RowChange):
                event = item.event
                if signal is not None and signal.is_it(event.schema, event.table):
                    if isinstance(event, WriteRowsEvent):
                        marks.extend(signal.watermarks(event.rows))
                    else:
                        other = True
                    continue
                other = True
                events = self._rows(item, position, begin)
                if events:
                    yield events
            elif isinstance(item, TxBegin):
                begin, marks, other = item, [], False
                yield BEGIN
            elif isinstance(item, TxCommit):
                position = position.after(
                    gtid=item.gtid, gtid_set=item.gtid_set, file=item.file, offset=item.offset,
                    file_created_unix=item.file_created_unix, server_id=self.server_id,
                    identity=self.identity, prev_gtid=item.prev_gtid, tx_digest=item.digest)
                if len(marks) == 1 and not other:
                    mark = Watermark(marks[0][0], marks[0][1], position.to_proto())
                    yield mark
                    if mark.published:  # a read transaction took this position
                        begin = None
                        continue
                yield self._commit(position, item.timestamp)
                begin = None
            elif isinstance(item, Statement):
                other = True
                yield from self._statement(item, self._next(position, begin))
            elif isinstance(item, Idle):
                yield IDLE

    def _commit(self, position: CapturePosition, commit_ts: int) -> Commit:
        factory, native = self.factory, position.to_proto()
        captured_us = int(time.time() * 1_000_000)

        ids: list[EventIds] = []  # made at the first event, when the size is known

        def stamp(event: ChangeEvent, index: int, size: int) -> ChangeEvent:
            if not ids:
                ids.append(EventIds(factory.source_id, position.gtid, commit_ts * 1000, size))
            return factory.stamp(event, position, index=index, size=size, commit_ts=commit_ts,
                                 native=native, captured_us=captured_us, ids=ids[0])

        records = ChangeStamp(factory.source_id, position.gtid, native, position.gtid,
                              commit_ts * 1_000_000, captured_us)
        return Commit(stamp, native, commit_ts * 1_000_000, position.gtid,
                      native if self.heartbeats else None,  # used if it has no event
                      records)

    @staticmethod
    def _next(position: CapturePosition, begin: TxBegin | None) -> Position:
        """The position the open transaction will get (for schema registration)."""
        gtid = begin.gtid if begin is not None else ""
        return Position(tx_seq=position.tx_seq + 1, mysql=MysqlPosition(gtid=gtid))

    def _rows(self, item: RowChange, position: CapturePosition, begin: TxBegin | None
              ) -> list[Change]:
        event = item.event
        self.metrics.log_bytes.inc(event.event_size)
        if not self.tables.matches(event.schema, event.table):
            return []
        shape, decoder, sequence = self.schemas.for_rows(
            event.schema, event.table, event.columns, self._next(position, begin))
        where = row_images(event)
        images = decoder.images(*where) if where is not None else None
        if images is None:  # a table or value C does not read: the library's values
            images = decoder.library_images(event)
        empty, template = b"", self.factory.template
        if isinstance(event, WriteRowsEvent):
            made = template(shape, sequence, Op.OP_INSERT).change
            changes = [made(empty, empty, after) for after in images]
        elif isinstance(event, UpdateRowsEvent):
            made = template(shape, sequence, Op.OP_UPDATE).change
            changes = [made(empty, images[i], images[i + 1]) for i in range(0, len(images), 2)]
        elif isinstance(event, DeleteRowsEvent):
            made = template(shape, sequence, Op.OP_DELETE).change
            changes = [made(empty, before, empty) for before in images]
        else:
            return []
        self.metrics.rows.inc(len(changes))
        return changes

    def _statement(self, item: Statement, position: Position) -> Iterator[ChangeEvent]:
        """DDL and TRUNCATE on selected tables become events; statement-based rows stop."""
        self.metrics.log_bytes.inc(len(item.query))
        self._refuse_statement_rows(item, position.mysql.gtid)
        schemas, factory = self.schemas, self.factory
        for target in ddl_targets(item.query, item.schema):
            if not self.tables.matches(target.database, target.table):
                continue
            if target.kind == "truncate":
                shape = schemas.latest.get((target.database, target.table))
                seq = schemas.register(shape, position) if shape is not None else 0
                yield factory.truncate(target.database, target.table, shape, seq)
                continue
            if target.kind in ("create", "rename") and self.on_table is not None:
                self.on_table(f"{target.database}.{target.table}")
            shape, seq = schemas.after_ddl(target.database, target.table,
                                           position.mysql.gtid, position)
            log.info("ddl", table=f"{target.database}.{target.table}", kind=target.kind)
            yield factory.ddl(target.database, target.table, item.query, shape, seq)

    def _refuse_statement_rows(self, item: Statement, gtid: str) -> None:
        written = written_tables(item.query, item.schema)
        if written == []:
            return
        selected = [f"{d}.{t}" for d, t in written or [] if self.tables.matches(d, t)]
        triggered = self._with_triggers(written) if written and not selected else []
        if written is not None and not selected and not triggered:
            log.debug("statement-based change to tables not captured; skipped",
                      tables=[f"{d}.{t}" for d, t in written], gtid=gtid, at=item.at)
            return
        what = (f"captured table {', '.join(selected)}" if selected else
                f"table {', '.join(triggered)}, whose triggers may write captured tables"
                if triggered else
                "tables that cannot be told from the statement (a function or procedure "
                "call may write captured tables)")
        raise PositionLostError(
            f"transaction {gtid} ({item.at}) changed {what} with a statement, not row events: "
            f"the writing session used binlog_format STATEMENT or MIXED "
            f"({_excerpt(item.query)!r}), and capture cannot turn a statement into row changes. "
            "Make every session write binlog_format=ROW (a session may override the global "
            "setting: revoke SUPER/BINLOG ADMIN from application users), then re-snapshot "
            "the affected tables; the checkpoint stays before this transaction")

    def _with_triggers(self, tables: list[tuple[str, str]]) -> list[str]:
        """Of `tables`, those with triggers: a replayed statement fires them, capture cannot."""
        conn = connect(self.settings)
        try:
            with conn.cursor() as cur:
                found = []
                for db, table in tables:
                    cur.execute("SELECT 1 FROM information_schema.TRIGGERS WHERE "
                                "EVENT_OBJECT_SCHEMA = %s AND EVENT_OBJECT_TABLE = %s LIMIT 1",
                                (db, table))
                    if cur.fetchone():
                        found.append(f"{db}.{table}")
                return found
        finally:
            conn.close()
