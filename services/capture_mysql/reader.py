"""The binlog protocol: `mysql-replication`'s reader with its measured faults fixed, as transactions.

`BinlogStream` connects once, by GTID, from a given state, and yields the
binlog as `TxBegin`, `RowChange`/`Statement`, `TxCommit` (and `Idle` when a
server heartbeat arrives). It hides the flavours' differences: MariaDB opens
a transaction with its GTID event (a *standalone* flag marks DDL, whose one
statement is the whole transaction); MySQL sends a GTID event then `BEGIN`,
or a GTID event and one DDL statement. A transaction ends at XID, or at a
`COMMIT` query (non-transactional engines).

Library faults, each worked around here (tests: `tests/unit/test_mysql_reader.py` without a
server, `tests/integration/test_mysql_binlog.py` and `test_mysql_capture.py` with MariaDB):

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

4. latin1 text. The library decodes MySQL's latin1 with Python's cp1252, which has no
   character for five bytes the server stores and converts (0x81, 0x8D, 0x8F, 0x90, 0x9D,
   C1 controls to MySQL): such a row stopped capture. Its codec lookup is pointed at
   `values.MYSQL_LATIN1`, MySQL's own table.

Heartbeats: the server is asked to send one every `heartbeat_s` when idle,
well below `read_timeout_s`, so a quiet source is not a dead connection. Each is an
`Idle`, when capture records and closes epochs between transactions: capture asks for a
few per epoch (`publisher.idle_report_s`), HEARTBEAT_S at most.

Every transaction gets a digest of what the binlog holds of it (the GTID
event's time, every row image of every table, statement texts) and the GTID
before it in its domain. Both go into the checkpoint, so that after a
reconnect `read_transaction` can fetch that very transaction again, by GTID,
from whatever server now answers, and the digest tells whether it is the same
transaction or another one that merely got the same number. Row images are
taken from all tables, not only the captured ones, so the digest does not
change when the spec's table patterns do.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    BeginLoadQueryEvent,
    ExecuteLoadQueryEvent,
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

from tailrace.errors import FatalError
from tailrace.logs import get_logger
from tailrace_services.capture_mysql.errors import StreamLostError, read_error
from tailrace_services.capture_mysql.gtid import GtidState, MariadbGtid, MariadbGtidPosition
from tailrace_services.capture_mysql.values import mysql_encoding

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
    "read_transaction",
    "row_images",
]

log = get_logger(__name__)

HEARTBEAT_S = 0.5  # the longest the server stays quiet in an idle binlog (then: Idle)

_FL_STANDALONE = 0x01  # MariaDB GTID event flag: the transaction is one statement (DDL)
_HEADER = 20  # a binlog packet's OK byte and event header, before the event's own bytes


_library_encoding = RowsEvent.charset_to_encoding


def _charset_to_encoding(name: str) -> str:
    return mysql_encoding(_library_encoding(name))


RowsEvent.charset_to_encoding = staticmethod(_charset_to_encoding)  # fault 4 above


class _Reader(BinLogStreamReader):  # type: ignore[misc]  # pymysqlreplication is untyped (Any)
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
    """A statement in the binlog: DDL, or DML a STATEMENT/MIXED session logged as text."""

    query: str
    schema: str  # the statement's default database
    at: str = ""  # file:offset of the event, for messages


@dataclass(frozen=True, slots=True)
class TxCommit:
    gtid: str
    gtid_set: str  # the state with this transaction applied
    file: str
    offset: int  # end of the transaction in `file`
    file_created_unix: int
    timestamp: int
    prev_gtid: str = ""  # MariaDB: the state's GTID in this domain before it ("" if none)
    digest: int = 0  # of the transaction's binlog contents, see the module docstring


@dataclass(frozen=True, slots=True)
class Idle:
    """A server heartbeat: nothing new; a chance to close epochs and report lag."""


StreamItem = TxBegin | RowChange | Statement | TxCommit | Idle

_ROW_EVENTS = (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)
_ROW_KIND = {WriteRowsEvent: b"W", UpdateRowsEvent: b"U", DeleteRowsEvent: b"D"}
_ROWS_V2 = (30, 31, 32)  # WRITE/UPDATE/DELETE_ROWS_EVENT v2 (MySQL): extra data after flags
_EVENTS = [RotateEvent, FormatDescriptionEvent, MariadbGtidEvent, GtidEvent, XidEvent, QueryEvent,
           HeartbeatLogEvent, MariadbGtidListEvent, XAPrepareEvent, BeginLoadQueryEvent,
           ExecuteLoadQueryEvent, *_ROW_EVENTS]
_EXECUTE_LOAD_POST_HEADER = 26  # Query_log_event's 13 bytes + file_id, start/end pos, dup flag


class _Digest:
    """A transaction's contents as the binlog holds them, identical on every server that
    holds the transaction (a replica logs the same row images under the same GTID and time);
    table ids, file names and offsets, which differ per server, are left out."""

    def __init__(self, gtid: str, timestamp: int) -> None:
        self._hash = hashlib.blake2b(f"{gtid}@{timestamp}".encode(), digest_size=8)

    def rows(self, event: RowsEvent) -> None:
        body = event.packet.packet.get_all_data()[_HEADER:_HEADER + event.event_size]
        start = 8  # table id (6) and flags (2)
        if event.event_type in _ROWS_V2:
            start += struct.unpack_from("<H", body, 8)[0]
        self._hash.update(_ROW_KIND[type(event)] + f"{event.schema}.{event.table}".encode())
        self._hash.update(body[start:])

    def statement(self, query: str) -> None:
        self._hash.update(b"Q" + query.encode())

    def value(self) -> int:
        return int.from_bytes(self._hash.digest(), "little")


class BinlogStream:
    """One binlog connection from `start` (a GTID state), yielding transactions in order.

    Transactions whose GTID `start` already contains are skipped; the state
    advances as each `TxCommit` is taken, so `state` is always the position
    after the last transaction handed out.
    """

    def __init__(self, connect_kwargs: dict[str, Any], *, replica_server_id: int,
                 start: GtidState, first_file: str | None = None,
                 heartbeat_s: float = HEARTBEAT_S, read_timeout_s: float = 10.0,
                 blocking: bool = True) -> None:
        """`first_file`: MySQL with an empty `start` reads from this file's start by file/offset
        (the library cannot send an empty GTID set); MariaDB's empty state already means
        "from the oldest binlog". Not `blocking`: the stream ends at the binlog's end."""
        if heartbeat_s >= read_timeout_s:
            raise ValueError(f"heartbeat ({heartbeat_s} s) must be below the read timeout "
                             f"({read_timeout_s} s)")
        self.state = start.copy()
        self.flavor = start.flavor
        self._blocking = blocking
        self.file = ""
        self.file_created = 0
        settings = dict(connect_kwargs, read_timeout=read_timeout_s, connect_timeout=10)
        self._reader = _Reader(
            connection_settings=settings,
            server_id=replica_server_id,
            blocking=blocking,
            resume_stream=True,
            is_mariadb=self.flavor == "mariadb",
            auto_position=str(self.state) if self.flavor == "mariadb" else str(self.state) or None,
            log_file=first_file, log_pos=4 if first_file else None,
            only_events=_EVENTS,
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
            raise read_error(exc, "reading the binlog") from None
        except (OSError, struct.error) as exc:
            raise StreamLostError(f"reading the binlog: {exc}") from None
        return event

    def items(self) -> Iterator[StreamItem]:
        """Transactions until stopped; a blocking stream that ends raises StreamLostError."""
        gtid = ""
        ts = 0
        digest = _Digest("", 0)
        open_tx = False  # rows may follow
        standalone = False  # the next statement is the whole transaction
        mysql_wait_begin = False
        skipping = False
        while True:
            event = self._next()
            if event is None:
                if self._blocking:
                    raise StreamLostError("the server ended the binlog stream")
                return
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
                digest = _Digest(gtid, ts)
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
                    digest.rows(event)
                    yield RowChange(event)
                continue
            if isinstance(event, BeginLoadQueryEvent):
                continue  # the file's data; its Execute_load_query event names the table
            if isinstance(event, ExecuteLoadQueryEvent):
                if not skipping:  # a statement-based LOAD DATA: the service decides
                    load = _load_statement(event, f"{self.file}:{event.packet.log_pos}")
                    digest.statement(load.query)
                    yield load
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
                        digest.statement(query)
                        yield Statement(query, schema, f"{self.file}:{event.packet.log_pos}")
                    end = standalone or mysql_wait_begin
                if not end:
                    continue
            elif not isinstance(event, XidEvent):
                continue
            open_tx = standalone = mysql_wait_begin = False
            if skipping:
                skipping = False
                continue
            prev = self._prev_in_domain(gtid)
            self.state.add(gtid)
            yield TxCommit(gtid=gtid, gtid_set=str(self.state), file=self.file,
                           offset=event.packet.log_pos, file_created_unix=self.file_created,
                           timestamp=ts, prev_gtid=prev, digest=digest.value())

    def _prev_in_domain(self, gtid: str) -> str:
        if not isinstance(self.state, MariadbGtidPosition):
            return ""
        prev = self.state.get(MariadbGtid.parse(gtid).domain)
        return str(prev) if prev is not None else ""


def row_images(event: RowsEvent) -> tuple[bytes, int, int, int] | None:
    """Where a rows event's row images lie in its packet: (packet bytes, start, end, images
    per row), for `values.RowDecoder.images`; None unless every column of every image is
    present (`binlog_row_image=FULL`, which `connection.check_settings` requires)."""
    if event.number_of_columns != len(event.columns):
        return None
    every = (1 << event.number_of_columns) - 1
    present = [event.columns_present_bitmap]
    if isinstance(event, UpdateRowsEvent):
        present.append(event.columns_present_bitmap2)
    if any(int.from_bytes(bitmap, "little") & every != every for bitmap in present):
        return None
    packet = event.packet
    return (packet.packet.get_all_data(), _HEADER + packet.read_bytes,
            _HEADER + event.event_size, len(present))


def _load_statement(event: ExecuteLoadQueryEvent, at: str) -> Statement:
    """The LOAD DATA text of an Execute_load_query event (the library stops before it)."""
    packet = event.packet
    packet.read(event.status_vars_length)
    schema = packet.read(event.schema_length).decode(errors="replace")
    packet.advance(1)
    size = (event.event_size - _EXECUTE_LOAD_POST_HEADER - event.status_vars_length
            - event.schema_length - 1)
    return Statement(packet.read(size).decode(errors="replace"), schema, at)


# -- one-off reads ---------------------------------------------------------------------

def read_transaction(connect_kwargs: dict[str, Any], replica_server_id: int,
                     before: MariadbGtidPosition, gtid: str, timeout_s: float = 30.0
                     ) -> TxCommit | None:
    """MariaDB: the transaction this server holds after `before` in `gtid`'s domain.

    That is `gtid` itself on any server whose history holds it, and some other
    transaction (or None, at the binlog's end) on one that does not. A server that
    cannot send from `before` (error 1236: purged, or never had it) raises
    PositionLostError with its message."""
    want = MariadbGtid.parse(gtid)
    stream = BinlogStream(connect_kwargs, replica_server_id=replica_server_id, start=before,
                          heartbeat_s=min(1.0, timeout_s / 2), read_timeout_s=timeout_s,
                          blocking=False)
    try:
        for item in stream.items():
            if isinstance(item, TxCommit):
                got = MariadbGtid.parse(item.gtid)
                if got.domain == want.domain and got.seq >= want.seq:
                    return item
        return None
    finally:
        stream.close()


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
                raise read_error(exc, f"reading the header of binlog {file}") from None
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

