"""PostgreSQL storage: several control replicas may share one database (use it for HA).

Every write is one transaction; compare-and-set is a conditional write judged by its row
count and queues and slots are locked with `SELECT … FOR UPDATE`, so correctness never
depends on there being one writer. Tables are created on first use under an advisory lock,
and the database itself if the server lacks it (a volume made before the control service
used it, say): the DSN's user must then be allowed to create databases.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tailrace.logs import get_logger, redact
from tailrace_services.control.storage._base import StorageUnavailable
from tailrace_services.control.storage._sql import Run, SqlStorage, schema_sql

_SCHEMA_LOCK = 0x7A11_2ACE  # pg_advisory_xact_lock key: one replica creates the tables
log = get_logger(__name__)


def _one_line(error: Exception) -> str:
    return " ".join(redact(str(error)).split())


def _create_database_if_missing(dsn: str) -> None:
    """Create the DSN's database, connecting to the server's `postgres` database to do it,
    when the server says it does not exist; any other failure is left to the first use."""
    try:
        psycopg.connect(dsn, connect_timeout=10).close()
        return
    except psycopg.OperationalError as e:
        if "does not exist" not in str(e):
            return
    name = conninfo_to_dict(dsn).get("dbname")
    if not name:
        return
    try:
        with psycopg.connect(make_conninfo(dsn, dbname="postgres"), autocommit=True,
                             connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(name))))
        log.info("created the control storage database", database=name)
    except psycopg.errors.DuplicateDatabase:
        pass  # another replica made it first
    except psycopg.Error as e:
        raise StorageUnavailable(f"the postgresql storage database {name!r} does not exist and "
                                 f"could not be created: {_one_line(e)}; create it, or give "
                                 "the DSN's user CREATEDB") from None


class PostgresStorage(SqlStorage):
    _lock_clause = " FOR UPDATE"

    def __init__(self, dsn: str, pool_size: int = 4) -> None:
        self._dsn = dsn
        self._idle: list[psycopg.Connection[Any]] = []
        self._slots = threading.BoundedSemaphore(pool_size)
        self._lock = threading.Lock()
        self._closed = False
        _create_database_if_missing(dsn)
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
