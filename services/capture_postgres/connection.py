"""Connecting to PostgreSQL: logical streaming replication over libpq, server settings and facts.

psycopg's high-level `Connection` has no COPY_BOTH support, so `ReplicationConnection`
talks to `psycopg.pq.PGconn` directly: replication commands through `exec_`, then
`START_REPLICATION ... LOGICAL` turns the connection into a COPY_BOTH stream of
CopyData messages: 'w' (XLogData, carrying one pgoutput message, `reader.py`) and 'k'
(primary keepalive) from the server, 'r' (standby status update) from us.

The session pins the settings that change how values are printed (TimeZone=UTC,
DateStyle=ISO, bytea_output=hex, extra_float_digits=3, client_encoding=UTF8),
because pgoutput sends text produced with the walsender's own settings.

Besides the stream, what one (re)connect learns about the server: `check_settings`
(wal_level, not a standby) and `read_facts` (the slot's state and the timeline
history), from which `position.py` decides whether our position is still there.
Errors are classified in `errors.py`.
"""

from __future__ import annotations

import math
import re
import selectors
import struct
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn, Self

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq.abc import PGconn, PGresult

from tailrace.errors import ConfigError, RetryableError, SourceConfigurationError
from tailrace.logs import redact
from tailrace_services.capture_postgres.errors import command_error, connect_error, stream_lost
from tailrace_services.capture_postgres.reader import PG_EPOCH_US

__all__ = [
    "ReplicationConnection",
    "ServerFacts",
    "SlotState",
    "SystemIdentity",
    "XLogData",
    "check_settings",
    "connect",
    "lsn_to_str",
    "read_facts",
    "read_slot",
    "str_to_lsn",
]

_SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO -c bytea_output=hex"
    " -c extra_float_digits=3 -c IntervalStyle=postgres"
)
_XLOG_HEADER = struct.Struct(">QQq")  # after 'w': data start, wal end, send time
_KEEPALIVE = struct.Struct(">Qq?")  # after 'k': wal end, send time, reply requested
_STATUS = struct.Struct(">cQQQq?")  # 'r', written, flushed, applied, client time, reply
_RESEND_AFTER_S = 1.0  # an unchanged status is sent again at most this often
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")

@dataclass(frozen=True, slots=True)
class SystemIdentity:
    """IDENTIFY_SYSTEM: the cluster (`system_id`), its timeline and the current WAL end."""

    system_id: str
    timeline: int
    xlogpos: int
    dbname: str


@dataclass(slots=True)
class XLogData:
    """One 'w' message; `send_time_us` is the server's clock in Unix microseconds. (Not
    frozen: one is made per WAL message, and a frozen dataclass's __init__ costs ~3x.)"""

    data_start: int
    wal_end: int
    send_time_us: int
    payload: bytes


def lsn_to_str(lsn: int) -> str:
    """64-bit LSN -> PostgreSQL's `X/Y` text form (e.g. `0/16B3748`)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def str_to_lsn(text: str) -> int:
    """`X/Y` -> 64-bit LSN; ValueError names the value when it is not an LSN."""
    high, sep, low = text.strip().partition("/")
    try:
        if not sep or not high or not low or len(high) > 8 or len(low) > 8:
            raise ValueError
        return (int(high, 16) << 32) | int(low, 16)
    except ValueError:
        raise ValueError(f"invalid LSN {text!r}: expected hex X/Y like 0/16B3748") from None


def _pinned_conninfo(dsn: str, connect_timeout: float) -> dict[str, Any]:
    """The DSN's parameters with our session settings (values printed as we parse them)."""
    try:
        params = conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg.ProgrammingError: libpq could not parse it
        raise ConfigError(redact(f"invalid PostgreSQL DSN: {exc}")) from None
    user_options = str(params.get("options") or "")
    params["options"] = f"{_SESSION_OPTIONS} {user_options}".strip()
    params["client_encoding"] = "UTF8"
    params["connect_timeout"] = max(2, math.ceil(connect_timeout))
    params.setdefault("application_name", "tailrace-capture")
    return params


def _replication_conninfo(dsn: str, connect_timeout: float) -> str:
    """The DSN (URI or key=value) with replication=database and our session settings."""
    params = _pinned_conninfo(dsn, connect_timeout)
    params["replication"] = "database"
    return make_conninfo("", **params)


class ReplicationConnection:
    """One walsender connection (replication=database): commands, then one logical stream.

    `read()` hands out XLogData and answers keepalives itself; the caller reports
    progress with `send_status()`, which only confirms what it is told (never the
    server's wal_end), so the slot keeps every change not yet flushed downstream.

    A keepalive that asks for a reply is answered with write = the server's WAL end
    and no flush position (0, which the server ignores for the slot). The server
    asks when it shuts down: its walsender waits until the client reports everything
    sent as replicated — flush if given, else write. A flush that lags on purpose
    (our sinks' checkpoint) would hold a fast shutdown forever; this answer lets it
    finish without confirming anything to the slot. (It also asks after
    wal_sender_timeout/2 without replies, which the same answer satisfies.)
    """

    def __init__(self, dsn: str, connect_timeout: float = 10) -> None:
        conninfo = _replication_conninfo(dsn, connect_timeout)
        pgconn = pq.PGconn.connect(conninfo.encode())
        if pgconn.status != pq.ConnStatus.OK:
            message = _text(pgconn.error_message).strip() or "unknown error"
            pgconn.finish()
            raise connect_error(message)
        self._pgconn: PGconn | None = pgconn
        self._selector: selectors.BaseSelector | None = None
        self._streaming = False
        self._written = 0
        self._flushed = 0
        self._sent: tuple[int, int] = (-1, -1)
        self._sent_at = 0.0
        self.server_wal_end = 0
        """Latest WAL end the server reported (XLogData or keepalive); 0 before any."""

    # -- commands ------------------------------------------------------------------

    def identify_system(self) -> SystemIdentity:
        result = self._command(b"IDENTIFY_SYSTEM", pq.ExecStatus.TUPLES_OK, "IDENTIFY_SYSTEM")
        system_id, timeline, xlogpos, dbname = (result.get_value(0, i) for i in range(4))
        return SystemIdentity(
            system_id=_text(system_id),
            timeline=int(_text(timeline)),
            xlogpos=str_to_lsn(_text(xlogpos)),
            dbname=_text(dbname),
        )

    def timeline_history(self, timeline: int) -> list[tuple[int, int]]:
        """TIMELINE_HISTORY: (ancestor timeline, LSN where it ended) for each ancestor of `timeline`.

        Timeline 1 has no history file: the answer is []. A promoted standby's new
        timeline lists the one it came from with the switch point, past which the
        old primary's WAL never reached this server.
        """
        if timeline <= 1:
            return []
        result = self._command(f"TIMELINE_HISTORY {int(timeline)}".encode(),
                               pq.ExecStatus.TUPLES_OK, "TIMELINE_HISTORY")
        content = result.get_value(0, 1) or b""
        history: list[tuple[int, int]] = []
        for line in _text(content).splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0].isdigit():  # comments and blank lines are skipped
                history.append((int(fields[0]), str_to_lsn(fields[1])))
        return history

    def create_slot(self, slot: str) -> int | None:
        """Create a logical slot with pgoutput; its consistent LSN, or None if it exists."""
        _check_slot_name(slot)
        command = f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput NOEXPORT_SNAPSHOT"
        result = self._exec(command.encode())
        if result.status == pq.ExecStatus.FATAL_ERROR and _sqlstate(result) == "42710":
            return None  # duplicate_object
        if result.status != pq.ExecStatus.TUPLES_OK:
            self._raise(result, f"creating replication slot {slot}", slot)
        return str_to_lsn(_text(result.get_value(0, 1)))

    def start(self, slot: str, publication: str, start_lsn: int = 0, *,
              messages: bool = False, stream_over: int | None = None) -> None:
        """START_REPLICATION of `slot` for `publication` (pgoutput): enter COPY_BOTH.

        The server resumes at the slot's confirmed_flush_lsn or `start_lsn`,
        whichever is later. `messages`: also send `pg_logical_emit_message` output
        (PostgreSQL 14+), which carries the snapshot watermarks. `stream_over` (bytes):
        send a transaction still open once the changes the server holds pass it (proto 2,
        `streaming 'on'`, this session's logical_decoding_work_mem; `reader.py`); None:
        proto 1, every transaction whole after its commit.
        """
        _check_slot_name(slot)
        if self._streaming:
            raise RuntimeError("the stream is already started: one per connection")
        publications = '"' + publication.replace('"', '""') + '"'
        publications = publications.replace("'", "''")
        options = f"proto_version '1', publication_names '{publications}'"
        if stream_over is not None:
            self._command(f"SET logical_decoding_work_mem = '{int(stream_over) // 1024}kB'"
                          .encode(), pq.ExecStatus.COMMAND_OK, "SET logical_decoding_work_mem")
            options = f"proto_version '2', streaming 'on', publication_names '{publications}'"
        if messages:
            options += ", messages 'true'"
        command = f"START_REPLICATION SLOT {slot} LOGICAL {lsn_to_str(start_lsn)} ({options})"
        result = self._exec(command.encode())
        if result.status != pq.ExecStatus.COPY_BOTH:
            self._raise(result, f"starting replication from slot {slot}", slot)
        self._streaming = True
        self._written = self._flushed = start_lsn
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._conn().socket, selectors.EVENT_READ)

    # -- the stream ----------------------------------------------------------------

    def read(self, timeout: float) -> XLogData | None:
        """The next XLogData, or None when none arrived within `timeout` seconds.

        Keepalives are consumed here; one that asks for a reply is answered at once
        with the positions last given to `send_status`.
        """
        pgconn = self._stream_conn()
        deadline = time.monotonic() + timeout
        while True:
            try:
                size, data = pgconn.get_copy_data(1)
            except Exception as exc:  # OperationalError: the stream broke
                self._raise_lost(str(exc))
            if size > 0:
                kind = data[0]
                if kind == 0x77:  # 'w'
                    start, wal_end, sent = _XLOG_HEADER.unpack_from(data, 1)
                    self.server_wal_end = max(self.server_wal_end, wal_end)
                    return XLogData(start, wal_end, sent + PG_EPOCH_US, bytes(data[25:]))
                if kind == 0x6B:  # 'k'
                    wal_end, _, reply = _KEEPALIVE.unpack_from(data, 1)
                    self.server_wal_end = max(self.server_wal_end, wal_end)
                    if reply:
                        self._answer_keepalive()
                continue
            if size == -1:  # the server ended the COPY: fetch its reason
                self._streaming = False
                self._raise(pgconn.get_result(), "streaming", None)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            assert self._selector is not None
            if not self._selector.select(remaining):
                return None
            try:
                pgconn.consume_input()
            except Exception as exc:  # OperationalError: connection lost
                self._raise_lost(str(exc))

    def send_status(self, written_lsn: int, flushed_lsn: int, reply: bool = False) -> None:
        """Standby status update: write=`written_lsn`, flush=apply=`flushed_lsn`.

        Cheap enough to call on every message: positions only move forward, and an
        update equal to the last one sent is skipped unless a second has passed or
        `reply` asks the server to answer with a keepalive.
        """
        self._stream_conn()
        self._written = max(self._written, written_lsn, flushed_lsn)
        self._flushed = max(self._flushed, flushed_lsn)
        if (
            not reply
            and self._sent == (self._written, self._flushed)
            and time.monotonic() - self._sent_at < _RESEND_AFTER_S
        ):
            return
        self._send_status_now(reply)

    def _send_status_now(self, reply: bool) -> None:
        self._put_status(self._written, self._flushed, reply)
        self._sent = (self._written, self._flushed)
        self._sent_at = time.monotonic()

    def _answer_keepalive(self) -> None:
        """write = everything the server sent, flush = 0 (invalid: the slot is left alone)."""
        self._put_status(max(self._written, self.server_wal_end), 0, False)

    def _put_status(self, written: int, flushed: int, reply: bool) -> None:
        pgconn = self._stream_conn()
        now_us = time.time_ns() // 1000 - PG_EPOCH_US
        message = _STATUS.pack(b"r", written, flushed, flushed, now_us, reply)
        try:
            pgconn.put_copy_data(message)
            pgconn.flush()
        except Exception as exc:  # OperationalError: connection lost
            self._raise_lost(str(exc))

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        if self._pgconn is not None:
            self._pgconn.finish()
            self._pgconn = None
        self._streaming = False

    @property
    def closed(self) -> bool:
        return self._pgconn is None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------------

    def _conn(self) -> PGconn:
        if self._pgconn is None:
            raise RuntimeError("the replication connection is closed")
        return self._pgconn

    def _stream_conn(self) -> PGconn:
        if not self._streaming:
            raise RuntimeError("no stream: call start() first (or the stream ended)")
        return self._conn()

    def _exec(self, command: bytes) -> PGresult:
        if self._streaming:
            raise RuntimeError("replication commands cannot run while streaming")
        # A lost connection gives a FATAL_ERROR result without SQLSTATE: retryable.
        return self._conn().exec_(command)

    def _command(self, command: bytes, expected: pq.ExecStatus, what: str) -> PGresult:
        result = self._exec(command)
        if result.status != expected:
            self._raise(result, what, None)
        return result

    def _raise(self, result: PGresult | None, what: str, slot: str | None) -> NoReturn:
        """A failed command or a stream the server ended, classified (`errors.py`)."""
        sqlstate = _sqlstate(result) if result is not None else ""
        message = _text(result.error_message) if result is not None else ""
        if not message:
            message = _text(self._conn().error_message) or "the server closed the stream"
        raise command_error(sqlstate, message, what, slot)

    def _raise_lost(self, message: str) -> NoReturn:
        self._streaming = False
        raise stream_lost(message)


def _check_slot_name(slot: str) -> None:
    if not _SLOT_NAME.fullmatch(slot):
        raise ConfigError(
            f"invalid replication slot name {slot!r}: use 1-63 lowercase letters, digits and _"
        )


def _sqlstate(result: PGresult) -> str:
    return _text(result.error_field(pq.DiagnosticField.SQLSTATE))


def _text(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


# -- facts about the server, read on every (re)connect ------------------------------------

def connect(dsn: str, timeout: float = 10, *, pinned: bool = False) -> psycopg.Connection[Any]:
    """An ordinary autocommit connection (catalog queries, the publication); `pinned`:
    with the replication session's settings, so values read as text are printed as
    pgoutput prints them (a snapshot's rows: a server whose DateStyle is not ISO would
    otherwise give keys that differ from the streamed ones)."""
    if pinned:
        return psycopg.connect(make_conninfo("", **_pinned_conninfo(dsn, timeout)),
                               autocommit=True)
    return psycopg.connect(dsn, autocommit=True, connect_timeout=int(timeout))


def check_settings(conn: psycopg.Connection[Any], source_id: str) -> None:
    """Refuse a server whose WAL cannot be decoded; wait for a standby to be promoted."""
    row = conn.execute("SHOW wal_level").fetchone()
    wal_level = row[0] if row else "unknown"
    if wal_level != "logical":
        raise SourceConfigurationError(
            f"source {source_id}: wal_level is {wal_level!r}; set wal_level = logical "
            "in postgresql.conf and restart PostgreSQL")
    if conn.info.server_version < 140000:
        raise SourceConfigurationError(
            f"source {source_id}: PostgreSQL {conn.info.server_version // 10000} is too old; "
            "Tailrace needs PostgreSQL 14 or later (its snapshots write watermarks as "
            "logical decoding messages, which pgoutput sends from 14 on)")
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    if row and row[0]:
        raise RetryableError(
            f"source {source_id}: the server is a standby (in recovery), where "
            "PostgreSQL 15 cannot decode; waiting for it to be promoted, or point "
            "spec.source.dsn at the primary")


@dataclass(frozen=True, slots=True)
class SlotState:
    exists: bool
    wal_status: str = ""
    confirmed_flush_lsn: int = 0
    current_wal_lsn: int = 0
    restart_lsn: int = 0  # 0: NULL (an invalidated slot)
    slot_type: str = "logical"
    plugin: str = "pgoutput"
    database: str = ""


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the position checks read from the server: its slot and its timeline history."""

    slot: SlotState
    history: tuple[tuple[int, int], ...] = ()


def read_slot(conn: psycopg.Connection[Any], slot: str) -> SlotState:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    if row is None:
        raise psycopg.DataError("pg_current_wal_lsn() returned no row")
    current = str_to_lsn(row[0])
    found = conn.execute(
        "SELECT coalesce(wal_status, ''), coalesce(confirmed_flush_lsn::text, ''),"
        " coalesce(restart_lsn::text, ''), slot_type, coalesce(plugin, ''),"
        " coalesce(database::text, '') FROM pg_replication_slots WHERE slot_name = %s",
        (slot,)).fetchone()
    if found is None:
        return SlotState(exists=False, current_wal_lsn=current)
    status, confirmed, restart, slot_type, plugin, database = found
    return SlotState(True, status, str_to_lsn(confirmed) if confirmed else 0, current,
                     str_to_lsn(restart) if restart else 0, slot_type, plugin, database)


def read_facts(repl: ReplicationConnection, conn: psycopg.Connection[Any], slot: str,
               system: SystemIdentity) -> ServerFacts:
    return ServerFacts(read_slot(conn, slot), tuple(repl.timeline_history(system.timeline)))

