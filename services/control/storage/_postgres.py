"""PostgreSQL storage: several control replicas may share one database (use it for HA).

Every write is one transaction; compare-and-set is a conditional write judged by its row
count and queues and slots are locked with `SELECT … FOR UPDATE`, so correctness never
depends on there being one writer. Tables are created on first use under an advisory lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from tailrace.logs import redact
from tailrace_services.control.storage._base import StorageUnavailable
from tailrace_services.control.storage._sql import Run, SqlStorage, schema_sql

_SCHEMA_LOCK = 0x7A11_2ACE  # pg_advisory_xact_lock key: one replica creates the tables


def _one_line(error: Exception) -> str:
    return " ".join(redact(str(error)).split())


class PostgresStorage(SqlStorage):
    _lock_clause = " FOR UPDATE"

    def __init__(self, dsn: str, pool_size: int = 4) -> None:
        self._dsn = dsn
        self._idle: list[psycopg.Connection[Any]] = []
        self._slots = threading.BoundedSemaphore(pool_size)
        self._lock = threading.Lock()
        self._closed = False
        with self._transaction(write=True) as run:
            run("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for statement in schema_sql("BYTEA", "BIGINT", 'TEXT COLLATE "C"'):
                run(statement)

    def _connect(self) -> psycopg.Connection[Any]:
        with self._lock:
            if self._closed:
                raise StorageUnavailable("postgresql storage is closed")
            if self._idle:
                return self._idle.pop()
        try:
            return psycopg.connect(self._dsn, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as e:
            raise StorageUnavailable(f"cannot connect to the postgresql storage: {_one_line(e)}"
                                     ) from None

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Run]:
        with self._slots:
            conn = self._connect()
            try:
                with conn.transaction():
                    yield conn.execute
            except psycopg.OperationalError as e:
                conn.close()
                raise StorageUnavailable(f"postgresql storage: {_one_line(e)}") from None
            except BaseException:
                if conn.broken or conn.closed:
                    conn.close()
                else:
                    self._release(conn)
                raise
            self._release(conn)

    def _release(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            if self._closed:
                conn.close()
            else:
                self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
