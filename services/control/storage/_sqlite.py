"""SQLite storage (the default): WAL mode with synchronous=NORMAL survives kill -9 of the service.

One connection per storage object, used by one thread at a time; writers take the database
lock up front (`BEGIN IMMEDIATE`), so two processes on one file stay correct too.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tailrace_services.control.storage._base import StorageUnavailable
from tailrace_services.control.storage._sql import Run, SqlStorage, schema_sql


@contextmanager
def _unavailable_when_busy(path: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as e:
        if any(word in str(e) for word in ("locked", "busy", "I/O")):
            raise StorageUnavailable(f"sqlite storage {path}: {e}; another process holds the "
                                     "database or the disk failed") from None
        raise


class SqliteStorage(SqlStorage):
    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                   timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._lock = threading.Lock()
        self._sql: dict[str, str] = {}
        with self._transaction(write=True) as run:
            for statement in schema_sql("BLOB", "INTEGER", "TEXT"):
                run(statement)
            self._migrate(run)

    @staticmethod
    def _migrate(run: Run) -> None:
        """State written before the primitives had their own tables lived in `kv`."""
        if run("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'kv'").fetchone():
            run("INSERT OR IGNORE INTO tailrace_kv (key, value, version) "
                "SELECT key, value, version FROM kv")
            run("ALTER TABLE kv RENAME TO kv_migrated")

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Run]:
        def run(sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
            text = self._sql.get(sql)
            if text is None:
                text = self._sql[sql] = self._q(sql).replace("%s", "?")
            return self._db.execute(text, params)

        with self._lock, _unavailable_when_busy(self.path):
            self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield run
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()
