"""The snapshot signal table: where MySQL/MariaDB snapshot watermarks go through the binlog.

MySQL has no way to write a message into its binlog outside a table (PostgreSQL has
`pg_logical_emit_message`), so a watermark is a row: the snapshot reader INSERTs
`(source_id, content)` in autocommit on its own connection, and the binlog carries that
insert as a transaction of its own, in commit order with everything else. The change feed
(`events.py`) turns such a transaction — a single insert into this table and nothing
else — into a `Watermark`; it never publishes the table's rows, and ignores its deletes
and any other transaction that touches it.

The binlog reader (`reader.py`) sets none of python-mysql-replication's table or schema
filters (`only_tables`, `only_schemas`, `ignored_*`): it receives every table's row events
and selection happens in the feed, so the signal table's inserts arrive although the table
is never captured. A filter added there must let this table through.

The table is named by `spec.source.snapshot.signal_table` (default
`tailrace.snapshot_signal`), is never a captured table whatever the patterns say, and
is created when missing. Old rows are deleted now and then (`SignalTable.prune`), so it
holds a few rows per pipeline.

Privileges: the capture user needs CREATE (once, or create the table yourself with
`SignalTable.ddl`), INSERT and DELETE on the table; a missing one stops the snapshot with
the statements to run. The server must be writable: capturing from a read-only replica can
stream, not snapshot (the error says so).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pymysql

from tailrace.errors import ConfigError
from tailrace.logs import get_logger
from tailrace_services.capture.snapshot import parse_watermark, watermark_content

__all__ = ["DEFAULT_SIGNAL_TABLE", "SignalTable"]

log = get_logger(__name__)

DEFAULT_SIGNAL_TABLE = "tailrace.snapshot_signal"
PRUNE_EVERY = 64  # watermarks between two deletes of old rows
_DENIED = (1044, 1045, 1142, 1143, 1227)  # access denied / no privilege on db, table, column
_READ_ONLY = (1290, 1792, 1836)  # --read-only, a read-only transaction, super_read_only


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class SignalTable:
    database: str
    table: str

    @classmethod
    def parse(cls, name: str | None) -> SignalTable:
        """`db.table` (the setting has been checked by the config loader)."""
        database, _, table = (name or DEFAULT_SIGNAL_TABLE).partition(".")
        return cls(database, table)

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def quoted(self) -> str:
        return f"{_quote(self.database)}.{_quote(self.table)}"

    def is_it(self, database: str, table: str) -> bool:
        return database == self.database and table == self.table

    def ddl(self) -> list[str]:
        return [f"CREATE DATABASE IF NOT EXISTS {_quote(self.database)}",
                f"CREATE TABLE IF NOT EXISTS {self.quoted} ("
                "id bigint unsigned NOT NULL AUTO_INCREMENT PRIMARY KEY, "
                "source_id varchar(255) NOT NULL, content varchar(2048) NOT NULL, "
                "written_at timestamp(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), "
                "KEY source_id (source_id, id)) ENGINE=InnoDB"]

    def _fix(self, user: str) -> str:
        return (f"run as an administrator: {'; '.join(self.ddl())}; GRANT INSERT, DELETE, "
                f"SELECT ON {self.quoted} TO {user}; or name another table in "
                "spec.source.snapshot.signal_table")

    def ensure(self, conn: pymysql.connections.Connection) -> None:
        """Create the table when missing; ConfigError with the statements to run when the
        capture user may not."""
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                        "AND TABLE_NAME = %s", (self.database, self.table))
            row = cur.fetchone()
            if row and row[0]:
                return
            cur.execute("SELECT CURRENT_USER()")
            found = cur.fetchone()
            user = "'" + str(found[0] if found else "capture").replace("@", "'@'") + "'"
            try:
                for statement in self.ddl():
                    cur.execute(statement)
            except pymysql.err.MySQLError as e:
                if e.args and e.args[0] in _DENIED:
                    raise ConfigError(
                        f"spec.source.snapshot.signal_table: the capture user may not create "
                        f"the snapshot signal table {self.name} ({e.args[-1]}); {self._fix(user)}"
                    ) from None
                if e.args and e.args[0] in _READ_ONLY:
                    raise self._read_only(e) from None
                raise
        log.info("snapshot signal table created", table=self.name)

    def write(self, conn: pymysql.connections.Connection, source_id: str, token: str,
              high: bool) -> int:
        """INSERT one watermark in autocommit; returns the row's id."""
        try:
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {self.quoted} (source_id, content) VALUES (%s, %s)",  # noqa: S608 - quoted identifiers
                            (source_id, watermark_content(token, high)))
                return int(cur.lastrowid or 0)
        except pymysql.err.MySQLError as e:
            if e.args and e.args[0] in _DENIED:
                raise ConfigError(f"spec.source.snapshot.signal_table: the capture user may not "
                                  f"write the snapshot signal table {self.name} ({e.args[-1]}); "
                                  f"GRANT INSERT, DELETE, SELECT ON {self.quoted} TO the capture "
                                  "user") from None
            if e.args and e.args[0] in _READ_ONLY:
                raise self._read_only(e) from None
            raise

    def _read_only(self, e: pymysql.err.MySQLError) -> ConfigError:
        return ConfigError(f"spec.source.snapshot.signal_table: the server is read-only "
                           f"({e.args[-1]}), and a snapshot writes its watermarks into "
                           f"{self.name} through the server's binlog; point spec.source.dsn "
                           "at the primary (or a writable server in the replication chain) "
                           "to snapshot")

    def prune(self, conn: pymysql.connections.Connection, source_id: str, below: int) -> None:
        """Delete this source's rows older than id `below` (the feed ignores deletes)."""
        with conn.cursor() as cur:
            cur.execute(f"DELETE FROM {self.quoted} WHERE source_id = %s AND id < %s",  # noqa: S608 - quoted identifiers
                        (source_id, below))

    @staticmethod
    def watermarks(rows: Iterable[dict[str, Any]]) -> list[tuple[str, bool]]:
        """(token, high) of the inserted rows' contents (the binlog's decoded values)."""
        out = []
        for row in rows:
            content = row.get("values", {}).get("content")
            if isinstance(content, bytes):
                content = content.decode("utf-8", "replace")
            parsed = parse_watermark(content.encode()) if isinstance(content, str) else None
            if parsed is not None:
                out.append(parsed)
        return out
