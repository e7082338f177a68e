"""Table selection by pattern, and the publication that covers the selected tables.

For PostgreSQL a pattern is `schema.table` (the database is the DSN's) or
`database.schema.table`; `*` and `%` are wildcards, so `public.*`,
`public.order_%` and `%.orders` all work (`tailrace.tables`, the matcher delivery's
filters use too). System schemas (`pg_catalog`, `information_schema`, `pg_toast*`)
are never selected.

Patterns are resolved at start and again every `REFRESH_S` seconds while
streaming (`TableWatcher`): a new matching table is added to the publication,
and its changes are captured from the first transaction that commits after
that. Rows written to it before are not, unless `snapshot.mode` is `initial` (its
snapshot is then taken, `on_added`) or an operator asks for one (`tailrace snapshot`).
In read-only mode (`create_slot: false`) the publication is the operator's:
a new table that it does not cover is only logged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg import sql

from tailrace.errors import ConfigError, NonRetryableError
from tailrace.logs import get_logger
from tailrace.tables import TableMatcher
from tailrace_services.capture_postgres.connection import connect

__all__ = ["TableWatcher", "ensure_publication", "resolve_tables", "table_matcher"]

log = get_logger(__name__)

REFRESH_S = 5.0


def table_matcher(patterns: Iterable[str]) -> TableMatcher:
    """The spec's patterns, matched against (database, schema, table)."""
    return TableMatcher(patterns, levels=(2, 3))


def resolve_tables(conn: psycopg.Connection[Any], matcher: TableMatcher
                   ) -> list[tuple[str, str]]:
    """The ordinary tables the patterns select, as (schema, table)."""
    database = conn.info.dbname
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        " AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1, 2").fetchall()
    return [(s, t) for s, t in rows if matcher.matches(database, s, t)]


def ensure_publication(conn: psycopg.Connection[Any], name: str, tables: list[tuple[str, str]],
                       create: bool) -> None:
    """Create the publication, or bring its table list up to date; read-only mode only checks."""
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    if not create:
        if not exists:
            raise ConfigError(f"spec.source.publication: publication {name!r} does not exist and "
                              "spec.source.create_slot is false; create it or allow creation")
        return
    if not tables:
        raise ConfigError("spec.source.tables: the patterns select no table in this database")
    table_list = sql.SQL(", ").join(sql.Identifier(s, t) for s, t in tables)
    statement = "ALTER PUBLICATION {} SET TABLE {}" if exists else \
        "CREATE PUBLICATION {} FOR TABLE {}"
    try:
        conn.execute(sql.SQL(statement).format(sql.Identifier(name), table_list))
    except psycopg.errors.InsufficientPrivilege as e:
        raise NonRetryableError(
            f"cannot {'alter' if exists else 'create'} publication {name!r}: {e}; run tailrace "
            "as the tables' owner with CREATE on the database, or create the publication and "
            "the slot yourself and set spec.source.create_slot: false") from e


class TableWatcher:
    """Re-resolves the patterns while streaming and adds new tables to the publication."""

    resolve = staticmethod(resolve_tables)
    publish = staticmethod(ensure_publication)

    def __init__(self, dsn: str, patterns: list[str], publication: str,
                 tables: list[tuple[str, str]], manage: bool, every_s: float = REFRESH_S,
                 on_added: Callable[[list[tuple[str, str]]], None] | None = None) -> None:
        """`on_added` is told the tables added to the publication (their snapshot)."""
        self._dsn = dsn
        self._matcher = table_matcher(patterns)
        self._publication = publication
        self._known = set(tables)
        self._manage = manage
        self._every_s = every_s
        self._next = time.monotonic() + every_s
        self._conn: psycopg.Connection[Any] | None = None
        self._on_added = on_added

    def poll(self) -> None:
        """Cheap unless a refresh is due; a failed refresh is retried at the next one."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every_s
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self._dsn, timeout=5)
            tables = resolve_tables(self._conn, self._matcher)
            new = [t for t in tables if t not in self._known]
            if not new:
                return
            names = [f"{s}.{t}" for s, t in new]
            if not self._manage:
                log.warning("new tables match spec.source.tables but the publication is not "
                            "managed by tailrace (create_slot: false): add them to it",
                            tables=names, publication=self._publication)
            else:
                ensure_publication(self._conn, self._publication, tables, create=True)
                log.info("tables added to the publication", tables=names,
                         publication=self._publication)
                if self._on_added is not None:
                    self._on_added(new)
            self._known.update(new)
        except psycopg.Error as e:
            log.warning("cannot refresh the table selection; retrying later", error=str(e))
            self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
