"""What PostgreSQL's errors mean for capture: SQLSTATE tables and the error -> health mapping.

Errors say what the caller should do (`tailrace.errors`):

| from the server | raised as |
|---|---|
| the replication stream broke (connection lost) | `SourceLostError`: reconnect |
| a failed connection, its message in `PERMANENT_CONNECT_ERRORS` (no SQLSTATE then) | `NonRetryableError` |
| any other failed connection, or a command without SQLSTATE | `RetryableError` |
| "invalidated" / "has already been removed" (the slot lost its WAL) | `PositionLostError` |
| 42704 naming a replication slot | `SlotMissingError` (retryable: the position checks decide) |
| class 28 (authentication), 42501 (privilege), 3D000 (no database) | `NonRetryableError` |
| other 42 (bad command, no publication), 55000 (wal_level, a slot of another db) | `NonRetryableError` |
| anything else | `RetryableError` |

Messages are passed through `redact`: no password in them.

`session_errors` is the capture lifecycle's handler for what a session raises beyond
Tailrace's own errors: the stop signal `StreamStopped`, and psycopg's — an
`OperationalError` (connection trouble) reconnects, any other `psycopg.Error` (a
statement the source refused) fails the source.
"""

from __future__ import annotations

import psycopg

from tailrace.errors import (
    FatalError,
    NonRetryableError,
    PositionLostError,
    RetryableError,
    SourceLostError,
    SourceUnreachableError,
    TailraceError,
)
from tailrace.logs import redact
from tailrace_services.capture.lifecycle import ErrorHandler, Fail, Reconnect, Stop

__all__ = ["PERMANENT_CONNECT_ERRORS", "SlotMissingError", "StreamStopped", "command_error",
           "connect_error", "session_errors", "stream_lost"]

# Connection-time failures carry no SQLSTATE in libpq: recognise the permanent ones.
PERMANENT_CONNECT_ERRORS = (
    "authentication failed",  # password, SCRAM, peer, ident, ...
    "no pg_hba.conf entry",
    "no password supplied",
    "pg_hba.conf rejects",
    "does not exist",  # role or database
    "permission denied",
    "must be superuser or replication role",
    "must have replication",
)


class SlotMissingError(RetryableError):
    """The replication slot does not exist (dropped, or never created): create it or resnapshot."""

    def __init__(self, message: str, slot: str) -> None:
        super().__init__(message)
        self.slot = slot


class StreamStopped(Exception):  # noqa: N818 - a signal to unwind, not an error
    """Raised while the publisher waits for the bus, once a stop request has waited too long."""


def connect_error(message: str) -> TailraceError:
    """A replication connection that could not be made."""
    text = redact(f"cannot connect to PostgreSQL for replication: {message}")
    if any(marker in message for marker in PERMANENT_CONNECT_ERRORS):
        return NonRetryableError(text)
    return SourceUnreachableError(text)


def command_error(sqlstate: str, message: str, what: str, slot: str | None) -> TailraceError:
    """A failed replication command, or a stream the server ended (SQLSTATE first)."""
    text = redact(f"{what} failed: {message.strip()}")
    if "invalidated" in message or "has already been removed" in message:
        return PositionLostError(text)  # names the slot and, from the server, the WAL
    if sqlstate == "42704" and "replication slot" in message:
        return SlotMissingError(text, slot or "")
    if sqlstate.startswith("28") or sqlstate in ("42501", "3D000"):
        return NonRetryableError(text)
    if sqlstate.startswith("42") or sqlstate == "55000":
        # bad command, missing publication, wal_level too low, slot of another database
        return NonRetryableError(text)
    return RetryableError(text)


def stream_lost(message: str) -> SourceLostError:
    return SourceLostError(redact(f"replication stream lost: {message.strip()}"))


def session_errors(source_id: str) -> ErrorHandler:
    """The lifecycle's handler of what a capture-postgres session raised."""

    def handle(error: Exception) -> Reconnect | Fail | Stop | None:
        if isinstance(error, StreamStopped):
            return Stop("stopped while waiting for the bus; unacknowledged events will be "
                        "published again from the checkpoint")
        if isinstance(error, psycopg.OperationalError | SourceLostError
                      | SourceUnreachableError):
            return Reconnect("capture interrupted; reconnecting", link="source database")
        if isinstance(error, RetryableError):
            return Reconnect("capture interrupted; reconnecting")
        if isinstance(error, psycopg.Error):  # a statement the source refused: not transient
            reason = f"source {source_id}: {type(error).__name__}: {error}"
            return Fail(reason, FatalError(reason))
        return None

    return handle
