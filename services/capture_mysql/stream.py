"""The binlog stream: `mysql-replication`'s reader with its measured faults fixed, as transactions.

`BinlogStream` connects once, by GTID, from a given state, and yields the
binlog as `TxBegin`, `RowChange`/`Statement`, `TxCommit` (and `Idle` when a
server heartbeat arrives). It hides the flavours' differences: MariaDB opens
a transaction with its GTID event (a *standalone* flag marks DDL, whose one
statement is the whole transaction); MySQL sends a GTID event then `BEGIN`,
or a GTID event and one DDL statement. A transaction ends at XID, or at a
`COMMIT` query (non-transactional engines).

Library faults, each worked around here (tests/integration/test_mysql_stream.py):

1. MariaDB GTID dump request length. `BinLogStreamReader` builds the
   COM_BINLOG_DUMP packet for MariaDB declaring 14 payload bytes but sending
   15 (the command byte is not counted), leaving one stray byte in the
   server's input. `_Reader` recomputes the length from the bytes it sends.
2. Its own reconnect. On a lost connection (2006/2013) the library silently
   reconnects from the position it was *created* with, so everything since
   is read again: duplicates. `_Reader` refuses a second connect
   (`StreamLostError`); the capture service reconnects from its own
   position, after the identity and reachability checks, and this stream
   skips any GTID already contained in the state it was started from.
3. Column names. `use_column_name_cache=True` (and, with it off, a lookup in
   information_schema when a table map carries no names) gives rows written
   before a DDL the names of after it. We never enable it; the names come
   from the table-map metadata (`binlog_row_metadata=FULL`, checked before
   streaming), and a table map without names stops the stream.

Heartbeats: the server is asked to send one every `heartbeat_s` when idle,
well below `read_timeout_s`, so a quiet source is not a dead connection.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    MariadbGtidListEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    RowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from tailrace.errors import FatalError, NonRetryableError, PositionLostError, RetryableError
from tailrace.logs import get_logger, redact
from tailrace_services.capture_mysql.gtid import GtidState, MariadbGtidPosition

__all__ = [
    "BinlogHeader",
    "BinlogStream",
    "Idle",
    "RowChange",
    "Statement",
    "StreamItem",
    "StreamLostError",
    "TxBegin",
    "TxCommit",
    "read_binlog_header",
]

log = get_logger(__name__)

_FL_STANDALONE = 0x01  # MariaDB GTID event flag: the transaction is one statement (DDL)
_LOST_CONNECTION = (2006, 2013)
_POSITION_LOST = 1236  # ER_MASTER_FATAL_ERROR_READING_BINLOG
_PERMANENT = (1045, 1044, 1227, 1142, 1049)  # access denied, no privilege, unknown db


class StreamLostError(RetryableError):
    """The binlog connection ended; reconnect from our own position (never the library's)."""


class _Reader(BinLogStreamReader):  # type: ignore[misc]
    """The library's reader with the dump-request length fixed and its self-reconnect refused."""

    _tailrace_connected = False

    def _BinLogStreamReader__set_mariadb_settings(self) -> bytes:  # noqa: N802 - overrides
        prelude: bytes = super()._BinLogStreamReader__set_mariadb_settings()
        # The first 4 bytes are the packet header (3-byte length + sequence id 0); the
        # length must count every byte after it, the command byte included.
        return struct.pack("<i", len(prelude) - 4) + prelude[4:]

    def _BinLogStreamReader__connect_to_stream(self) -> None:  # noqa: N802 - overrides
        if self._tailrace_connected:
            raise StreamLostError("binlog connection lost")
        self._tailrace_connected = True
        super()._BinLogStreamReader__connect_to_stream()


# -- what the stream yields --------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TxBegin:
    gtid: str
    timestamp: int  # seconds, the source's commit time as written in the binlog


@dataclass(frozen=True, slots=True)
class RowChange:
    event: RowsEvent  # WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent, rows decoded lazily


@dataclass(frozen=True, slots=True)
class Statement:
    query: str
    schema: str  # the statement's default database


@dataclass(frozen=True, slots=True)
class TxCommit:
    gtid: str
    gtid_set: str  # the state with this transaction applied
    file: str
    offset: int  # end of the transaction in `file`
    file_created_unix: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class Idle:
    """A server heartbeat: nothing new; a chance to close epochs and report lag."""


StreamItem = TxBegin | RowChange | Statement | TxCommit | Idle

_ROW_EVENTS = (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)
_EVENTS = [RotateEvent, FormatDescriptionEvent, MariadbGtidEvent, GtidEvent, XidEvent, QueryEvent,
           HeartbeatLogEvent, MariadbGtidListEvent, XAPrepareEvent, *_ROW_EVENTS]


def _classify(exc: pymysql.err.MySQLError, what: str) -> Exception:
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    text = redact(f"{what}: {exc.args[1] if len(exc.args) > 1 else exc}")
    if code == _POSITION_LOST:
        return PositionLostError(f"the server cannot send the binlog from our position ({text})")
    if code in _PERMANENT:
        return NonRetryableError(f"{text}; grant the capture user REPLICATION SLAVE, "
                                 "REPLICATION CLIENT and SELECT")
    return StreamLostError(text)


class BinlogStream:
    """One binlog connection from `start` (a GTID state), yielding transactions in order.

    Transactions whose GTID `start` already contains are skipped; the state
    advances as each `TxCommit` is taken, so `state` is always the position
    after the last transaction handed out.
    """

    def __init__(self, connect_kwargs: dict[str, Any], *, replica_server_id: int,
                 start: GtidState, schemas: set[str] | None = None,
                 first_file: str | None = None,
                 heartbeat_s: float = 0.5, read_timeout_s: float = 10.0) -> None:
        """`first_file`: MySQL with an empty `start` reads from this file's start by file/offset
        (the library cannot send an empty GTID set); MariaDB's empty state already means
        "from the oldest binlog"."""
        if heartbeat_s >= read_timeout_s:
            raise ValueError(f"heartbeat ({heartbeat_s} s) must be below the read timeout "
                             f"({read_timeout_s} s)")
        self.state = start.copy()
        self.flavor = start.flavor
        self.file = ""
        self.file_created = 0
        settings = dict(connect_kwargs, read_timeout=read_timeout_s, connect_timeout=10)
        self._reader = _Reader(
            connection_settings=settings,
            server_id=replica_server_id,
            blocking=True,
            resume_stream=True,
            is_mariadb=self.flavor == "mariadb",
            auto_position=str(self.state) if self.flavor == "mariadb" else str(self.state) or None,
            log_file=first_file, log_pos=4 if first_file else None,
            only_events=_EVENTS,
            only_schemas=sorted(schemas) if schemas else None,
            slave_heartbeat=heartbeat_s,
            use_column_name_cache=False,
            freeze_schema=False,
            enable_logging=False,
        )

    def close(self) -> None:
        self._reader.close()

    def _next(self) -> Any:
        try:
            event = self._reader.fetchone()
        except pymysql.err.MySQLError as exc:
            raise _classify(exc, "reading the binlog") from None
        except (OSError, struct.error) as exc:
            raise StreamLostError(f"reading the binlog: {exc}") from None
        if event is None:
            raise StreamLostError("the server ended the binlog stream")
        return event

    def items(self) -> Iterator[StreamItem]:
        gtid = ""
        ts = 0
        open_tx = False  # rows may follow
        standalone = False  # the next statement is the whole transaction
        mysql_wait_begin = False
        skipping = False
        while True:
            event = self._next()
            if isinstance(event, RotateEvent):
                self.file = event.next_binlog
                continue
            if isinstance(event, FormatDescriptionEvent):
                if event.timestamp:
                    self.file_created = event.timestamp
                continue
            if isinstance(event, HeartbeatLogEvent):
                if not open_tx:
                    yield Idle()
                continue
            if isinstance(event, MariadbGtidListEvent):
                continue
            if isinstance(event, MariadbGtidEvent | GtidEvent):
                if open_tx and not skipping:
                    raise FatalError(f"binlog transaction {gtid} has no commit before {event.gtid}"
                                     f" ({self.file}:{event.packet.log_pos})")
                gtid, ts = event.gtid, event.timestamp
                skipping = self.state.contains(gtid)
                if skipping:
                    log.debug("skipping a transaction already done", gtid=gtid)
                open_tx = True
                if isinstance(event, MariadbGtidEvent):
                    standalone = bool(event.flags & _FL_STANDALONE)
                    mysql_wait_begin = False
                else:
                    standalone = False
                    mysql_wait_begin = True
                if not skipping:
                    yield TxBegin(gtid, ts)
                continue
            if not open_tx:
                continue  # before the first GTID of this connection
            if isinstance(event, XAPrepareEvent):
                raise FatalError(f"XA transaction {gtid} found ({self.file}:"
                                 f"{event.packet.log_pos}): XA is not supported by Tailrace")
            if isinstance(event, _ROW_EVENTS):
                mysql_wait_begin = False
                if not skipping:
                    yield RowChange(event)
                continue
            if isinstance(event, QueryEvent):
                query = event.query.strip()
                word = query.split(None, 1)[0].upper() if query else ""
                if mysql_wait_begin and word == "BEGIN":
                    mysql_wait_begin = False
                    continue
                if word in ("COMMIT", "ROLLBACK") and not mysql_wait_begin and not standalone:
                    end = True
                elif word in ("SAVEPOINT", "RELEASE") or query.upper().startswith("ROLLBACK TO"):
                    continue
                else:
                    schema = event.schema.decode() if isinstance(event.schema, bytes) \
                        else str(event.schema or "")
                    if not skipping:
                        yield Statement(query, schema)
                    end = standalone or mysql_wait_begin
                if not end:
                    continue
            elif not isinstance(event, XidEvent):
                continue
            open_tx = standalone = mysql_wait_begin = False
            if skipping:
                skipping = False
                continue
            self.state.add(gtid)
            yield TxCommit(gtid=gtid, gtid_set=str(self.state), file=self.file,
                           offset=event.packet.log_pos, file_created_unix=self.file_created,
                           timestamp=ts)


# -- one-off reads ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BinlogHeader:
    """A binlog file's start: its creation time and (MariaDB) the GTID state before it."""

    file: str
    created_unix: int
    gtid_list: MariadbGtidPosition | None


def read_binlog_header(connect_kwargs: dict[str, Any], replica_server_id: int, file: str,
                       timeout_s: float = 10.0) -> BinlogHeader:
    """Read the first events of `file` (file/offset dump, non-blocking) and close."""
    reader = _Reader(
        connection_settings=dict(connect_kwargs, read_timeout=timeout_s, connect_timeout=10),
        server_id=replica_server_id, blocking=False, resume_stream=True, is_mariadb=False,
        log_file=file, log_pos=4,
        only_events=[RotateEvent, FormatDescriptionEvent, MariadbGtidListEvent, GtidEvent,
                     MariadbGtidEvent],
        enable_logging=False)
    created = 0
    try:
        while True:
            try:
                event = reader.fetchone()
            except pymysql.err.MySQLError as exc:
                raise _classify(exc, f"reading the header of binlog {file}") from None
            if event is None:
                return BinlogHeader(file, created, None)
            if isinstance(event, FormatDescriptionEvent):
                created = event.timestamp
            elif isinstance(event, MariadbGtidListEvent):
                gtids = MariadbGtidPosition.parse(",".join(g.gtid for g in event.gtid_list))
                return BinlogHeader(file, created, gtids)
            elif isinstance(event, GtidEvent | MariadbGtidEvent):
                return BinlogHeader(file, created, None)  # MySQL: no Gtid_list event
    finally:
        reader.close()

