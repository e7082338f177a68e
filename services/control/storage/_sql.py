"""The primitives in SQL that SQLite and PostgreSQL both run.

Correct across processes without relying on one writer: a compare-and-set is a conditional
`UPDATE … WHERE version = expected` or an `INSERT … ON CONFLICT DO NOTHING`, judged by
the row count; counters are bumped with `INSERT … ON CONFLICT DO UPDATE … RETURNING`; a
queue or slot is locked with `SELECT … FOR UPDATE` on PostgreSQL (SQLite's
`BEGIN IMMEDIATE` already serializes writers). Keys of a multi-key write are locked in
key order so two writers cannot deadlock.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from tailrace_services.control.storage._base import (
    CasConflict,
    QueueEntry,
    QueuePush,
    QueueStats,
    SlotLease,
    Storage,
    plan_push,
)


class Cursor(Protocol):
    """What `run` answers: a sqlite3 or psycopg cursor (rows as tuples)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


Run = Callable[..., Cursor]  # run(sql, params=()) -> cursor


def schema_sql(blob: str, integer: str, text: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS tailrace_kv (
            key {text} PRIMARY KEY, value {blob} NOT NULL, version {integer} NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS tailrace_log_meta (
            name {text} PRIMARY KEY, last_seq {integer} NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS tailrace_log (
            name {text} NOT NULL, seq {integer} NOT NULL, value {blob} NOT NULL,
            PRIMARY KEY (name, seq))""",
        f"""CREATE TABLE IF NOT EXISTS tailrace_slot (
            name {text} PRIMARY KEY, owner {text} NOT NULL, generation {integer} NOT NULL,
            expires_ms {integer} NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS tailrace_queue_meta (
            name {text} PRIMARY KEY, last_seq {integer} NOT NULL, dropped {integer} NOT NULL,
            expired {integer} NOT NULL, rejected {integer} NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS tailrace_queue (
            name {text} NOT NULL, seq {integer} NOT NULL, value {blob} NOT NULL,
            created_ms {integer} NOT NULL, expires_ms {integer} NOT NULL,
            PRIMARY KEY (name, seq))""",
    ]


class SqlStorage(Storage):
    """Subclasses give `_transaction(write)`, which yields `run(sql, params)`; SQL is written
    with `%s` placeholders and `{lock}` where PostgreSQL needs `FOR UPDATE`."""

    _lock_clause = ""

    @abstractmethod
    def _transaction(self, write: bool) -> AbstractContextManager[Run]:
        """Commit on success, roll back on an exception."""

    def _q(self, sql: str) -> str:
        return sql.replace("{lock}", self._lock_clause)

    # KV -----------------------------------------------------------------------------------
    def kv_get(self, key: str) -> tuple[bytes, int] | None:
        with self._transaction(write=False) as run:
            row = run("SELECT value, version FROM tailrace_kv WHERE key = %s", (key,)).fetchone()
        return (bytes(row[0]), int(row[1])) if row else None

    def kv_cas(self, items: list[tuple[str, bytes, int]]) -> list[int]:
        if len({k for k, _, _ in items}) != len(items):
            raise ValueError("kv_cas: each key may appear once")
        order = sorted(range(len(items)), key=lambda i: items[i][0])
        with self._transaction(write=True) as run:
            for i in order:
                key, value, expected = items[i]
                if expected == 0:
                    cur = run("INSERT INTO tailrace_kv (key, value, version) VALUES (%s, %s, 1) "
                              "ON CONFLICT (key) DO NOTHING", (key, value))
                else:
                    cur = run("UPDATE tailrace_kv SET value = %s, version = version + 1 "
                              "WHERE key = %s AND version = %s", (value, key, expected))
                if cur.rowcount != 1:
                    row = run("SELECT version FROM tailrace_kv WHERE key = %s", (key,)).fetchone()
                    raise CasConflict(key, expected, int(row[0]) if row else 0)
        return [expected + 1 for _, _, expected in items]

    def kv_put(self, key: str, value: bytes) -> int:
        with self._transaction(write=True) as run:
            row = run("INSERT INTO tailrace_kv (key, value, version) VALUES (%s, %s, 1) "
                      "ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                      "version = tailrace_kv.version + 1 RETURNING version", (key, value)).fetchone()
        return int(row[0])

    def kv_scan(self, prefix: str) -> Iterator[tuple[str, bytes, int]]:
        with self._transaction(write=False) as run:
            rows = run("SELECT key, value, version FROM tailrace_kv WHERE key >= %s AND key < %s "
                       "ORDER BY key", (prefix, prefix + "\U0010ffff")).fetchall()
        for key, value, version in rows:
            yield key, bytes(value), int(version)

    # Log ----------------------------------------------------------------------------------
    def log_append(self, name: str, value: bytes) -> int:
        with self._transaction(write=True) as run:
            seq = int(run("INSERT INTO tailrace_log_meta (name, last_seq) VALUES (%s, 1) "
                          "ON CONFLICT (name) DO UPDATE SET last_seq = tailrace_log_meta.last_seq + 1 "
                          "RETURNING last_seq", (name,)).fetchone()[0])
            run("INSERT INTO tailrace_log (name, seq, value) VALUES (%s, %s, %s)", (name, seq, value))
        return seq

    def log_read(self, name: str, after: int = 0, limit: int = 1000) -> list[tuple[int, bytes]]:
        with self._transaction(write=False) as run:
            rows = run("SELECT seq, value FROM tailrace_log WHERE name = %s AND seq > %s "
                       "ORDER BY seq LIMIT %s", (name, after, limit)).fetchall()
        return [(int(s), bytes(v)) for s, v in rows]

    def log_truncate(self, name: str, up_to: int) -> int:
        with self._transaction(write=True) as run:
            return int(run("DELETE FROM tailrace_log WHERE name = %s AND seq <= %s",
                           (name, up_to)).rowcount)

    # Slot ---------------------------------------------------------------------------------
    def slot_acquire(self, name: str, owner: str, ttl_s: float) -> SlotLease:
        if not owner:
            raise ValueError("slot owner must not be empty")
        with self._transaction(write=True) as run:
            run("INSERT INTO tailrace_slot (name, owner, generation, expires_ms) "
                "VALUES (%s, '', 0, 0) ON CONFLICT (name) DO NOTHING", (name,))
            held_by, generation, expires_ms = run(self._q(
                "SELECT owner, generation, expires_ms FROM tailrace_slot WHERE name = %s{lock}"),
                (name,)).fetchone()
            now = self.now_ms()
            if held_by != owner:
                if held_by and expires_ms > now:
                    return SlotLease(name, held_by, int(generation), int(expires_ms))
                generation += 1
            expires = now + int(ttl_s * 1000)
            run("UPDATE tailrace_slot SET owner = %s, generation = %s, expires_ms = %s "
                "WHERE name = %s", (owner, generation, expires, name))
        return SlotLease(name, owner, int(generation), expires, acquired=True)

    def slot_release(self, name: str, owner: str) -> bool:
        with self._transaction(write=True) as run:
            return run("UPDATE tailrace_slot SET owner = '', expires_ms = 0 "
                       "WHERE name = %s AND owner = %s AND owner != ''",
                       (name, owner)).rowcount == 1

    def slot_get(self, name: str) -> SlotLease | None:
        with self._transaction(write=False) as run:
            row = run("SELECT owner, generation, expires_ms FROM tailrace_slot WHERE name = %s",
                      (name,)).fetchone()
        if row is None or not row[0] or row[2] <= self.now_ms():
            return None
        return SlotLease(name, row[0], int(row[1]), int(row[2]))

    # Queue --------------------------------------------------------------------------------
    def _lock_queue(self, run: Run, name: str) -> tuple[int, int]:
        """Lock the queue's meta row; returns (last_seq, expired now)."""
        run("INSERT INTO tailrace_queue_meta (name, last_seq, dropped, expired, rejected) "
            "VALUES (%s, 0, 0, 0, 0) ON CONFLICT (name) DO NOTHING", (name,))
        (last_seq,) = run(self._q("SELECT last_seq FROM tailrace_queue_meta WHERE name = %s{lock}"),
                          (name,)).fetchone()
        return int(last_seq), self._expire(run, name)

    def _expire(self, run: Run, name: str) -> int:
        n = int(run("DELETE FROM tailrace_queue WHERE name = %s AND expires_ms > 0 "
                    "AND expires_ms <= %s", (name, self.now_ms())).rowcount)
        if n:
            run("UPDATE tailrace_queue_meta SET expired = expired + %s WHERE name = %s", (n, name))
        return n

    def queue_push(self, name: str, values: list[bytes], max_entries: int, overflow: str,
                   ttl_s: float = 0) -> QueuePush:
        with self._transaction(write=True) as run:
            last_seq, expired = self._lock_queue(run, name)
            (count,) = run("SELECT count(*) FROM tailrace_queue WHERE name = %s", (name,)).fetchone()
            plan = plan_push(int(count), max_entries, len(values), overflow)
            now = self.now_ms()
            expires = now + int(ttl_s * 1000) if ttl_s > 0 else 0
            for i, value in enumerate(values[:plan.append], start=1):
                run("INSERT INTO tailrace_queue (name, seq, value, created_ms, expires_ms) "
                    "VALUES (%s, %s, %s, %s, %s)", (name, last_seq + i, value, now, expires))
            if plan.drop:
                run("DELETE FROM tailrace_queue WHERE name = %s AND seq IN (SELECT seq FROM "
                    "tailrace_queue WHERE name = %s ORDER BY seq LIMIT %s)", (name, name, plan.drop))
            run("UPDATE tailrace_queue_meta SET last_seq = %s, dropped = dropped + %s, "
                "rejected = rejected + %s WHERE name = %s",
                (last_seq + plan.append, plan.drop, plan.rejected, name))
        return QueuePush(appended=plan.append, dropped=plan.drop, rejected=plan.rejected,
                         blocked=plan.blocked, expired=expired,
                         first_seq=last_seq + 1 if plan.append else 0)

    def queue_list(self, name: str, after: int = 0, limit: int = 100) -> list[QueueEntry]:
        self.queue_expire(name)
        with self._transaction(write=False) as run:
            rows = run("SELECT seq, value, created_ms, expires_ms FROM tailrace_queue "
                       "WHERE name = %s AND seq > %s ORDER BY seq LIMIT %s",
                       (name, after, limit)).fetchall()
        return [QueueEntry(int(s), bytes(v), int(c), int(e)) for s, v, c, e in rows]

    def queue_ack(self, name: str, up_to: int) -> int:
        with self._transaction(write=True) as run:
            return int(run("DELETE FROM tailrace_queue WHERE name = %s AND seq <= %s",
                           (name, up_to)).rowcount)

    def queue_purge(self, name: str) -> int:
        with self._transaction(write=True) as run:
            return int(run("DELETE FROM tailrace_queue WHERE name = %s", (name,)).rowcount)

    def queue_expire(self, name: str) -> int:
        with self._transaction(write=True) as run:
            return self._lock_queue(run, name)[1]

    def queue_stats(self, name: str) -> QueueStats:
        with self._transaction(write=True) as run:
            last_seq, _ = self._lock_queue(run, name)
            (count,) = run("SELECT count(*) FROM tailrace_queue WHERE name = %s", (name,)).fetchone()
            dropped, expired, rejected = run(
                "SELECT dropped, expired, rejected FROM tailrace_queue_meta WHERE name = %s",
                (name,)).fetchone()
        return QueueStats(count=int(count), last_seq=last_seq, dropped=int(dropped),
                          expired=int(expired), rejected=int(rejected))
