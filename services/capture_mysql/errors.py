"""What MySQL/MariaDB errors mean for capture: errno tables and the error -> health mapping.

Errors say what the caller should do (`tailrace.errors`):

| from the server | raised as |
|---|---|
| connecting: 1044/1045 (access denied), 1049 (unknown database), 1251 (auth plugin) | `NonRetryableError` |
| connecting: anything else (refused, timeout, too many connections) | `RetryableError` |
| reading the binlog: 1236 (cannot send from our position: purged, never had it) | `PositionLostError` |
| reading the binlog: 1044/1045/1227/1142 (a missing grant), 1049 | `NonRetryableError`, naming the grants |
| reading the binlog: anything else, or the socket failing | `StreamLostError` (reconnect) |

Messages are passed through `redact`: no password in them.

`session_errors` is the capture lifecycle's handler for what a session raises beyond
Tailrace's own errors: a lost binlog connection reconnects and continues after what
this process published (the assembler finished publishing it); PyMySQL's errors and
socket errors reconnect too, after which the resume rule asks the bus again.
"""

from __future__ import annotations

import pymysql

from tailrace.errors import (
    NonRetryableError,
    PositionLostError,
    RetryableError,
    SourceLostError,
    SourceUnreachableError,
    TailraceError,
)
from tailrace.logs import redact
from tailrace_services.capture.lifecycle import ErrorHandler, Fail, Reconnect, Stop

__all__ = ["PERMANENT_CONNECT", "PERMANENT_READ", "POSITION_LOST", "StreamLostError",
           "connect_error", "read_error", "session_errors"]

PERMANENT_CONNECT = (1044, 1045, 1049, 1251)  # access denied, unknown database, auth plugin
POSITION_LOST = 1236  # ER_MASTER_FATAL_ERROR_READING_BINLOG
PERMANENT_READ = (1045, 1044, 1227, 1142, 1049)  # access denied, no privilege, unknown db


class StreamLostError(SourceLostError):
    """The binlog connection ended; reconnect from our own position (never the library's)."""


def _code(exc: pymysql.err.MySQLError) -> int:
    return exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0


def connect_error(exc: pymysql.err.MySQLError, server: str) -> TailraceError:
    """A connection to `server` (user@host:port) that could not be made."""
    text = redact(f"cannot connect to {server}: {exc.args[-1] if exc.args else exc}")
    if _code(exc) in PERMANENT_CONNECT:
        return NonRetryableError(text)
    return SourceUnreachableError(text)


def read_error(exc: pymysql.err.MySQLError, what: str) -> TailraceError:
    """A failed binlog read (`what` says which)."""
    code = _code(exc)
    text = redact(f"{what}: {exc.args[1] if len(exc.args) > 1 else exc}")
    if code == POSITION_LOST:
        return PositionLostError(f"the server cannot send the binlog from our position ({text})")
    if code in PERMANENT_READ:
        return NonRetryableError(f"{text}; grant the capture user REPLICATION SLAVE, "
                                 "REPLICATION CLIENT and SELECT")
    return StreamLostError(text)


def session_errors(source_id: str) -> ErrorHandler:
    """The lifecycle's handler of what a capture-mysql session raised."""

    def handle(error: Exception) -> Reconnect | Fail | Stop | None:
        if isinstance(error, StreamLostError):
            return Reconnect("binlog connection lost; reconnecting", link="source database")
        if isinstance(error, SourceLostError | SourceUnreachableError | pymysql.err.MySQLError) \
                or (isinstance(error, OSError) and not isinstance(error, TimeoutError)):
            return Reconnect("capture interrupted; reconnecting", link="source database")
        if isinstance(error, RetryableError | TimeoutError):  # e.g. the bus, read in time
            return Reconnect("capture interrupted; reconnecting")
        return None

    return handle
