"""SQLite storage: WAL mode with synchronous=NORMAL survives kill -9 of the service."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from tailrace_services.control.storage._base import CasConflict, Storage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key     TEXT PRIMARY KEY,
    value   BLOB NOT NULL,
    version INTEGER NOT NULL
);
"""


class SqliteStorage(Storage):
    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def kv_get(self, key: str) -> tuple[bytes, int] | None:
        with self._lock:
            row = self._db.execute("SELECT value, version FROM kv WHERE key = ?", (key,)).fetchone()
        return (bytes(row[0]), row[1]) if row else None

    def kv_cas(self, items: list[tuple[str, bytes, int]]) -> list[int]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                versions = []
                for key, value, expected in items:
                    row = self._db.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
                    actual = row[0] if row else 0
                    if actual != expected:
                        raise CasConflict(key, expected, actual)
                    self._db.execute(
                        "INSERT INTO kv (key, value, version) VALUES (?, ?, ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                        "version = excluded.version",
                        (key, value, expected + 1),
                    )
                    versions.append(expected + 1)
                self._db.execute("COMMIT")
                return versions
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def kv_put(self, key: str, value: bytes) -> int:
        with self._lock:
            row = self._db.execute(
                "INSERT INTO kv (key, value, version) VALUES (?, ?, 1) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value, version = kv.version + 1 "
                "RETURNING version",
                (key, value),
            ).fetchone()
        return int(row[0])

    def kv_scan(self, prefix: str) -> Iterator[tuple[str, bytes, int]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT key, value, version FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                (prefix, prefix + "\U0010ffff"),
            ).fetchall()
        for key, value, version in rows:
            yield key, bytes(value), version

    def close(self) -> None:
        with self._lock:
            self._db.close()
