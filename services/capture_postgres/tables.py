"""Table selection by pattern, and the publication that covers the selected tables.

For PostgreSQL a pattern is `schema.table` (the database is the DSN's) or
`database.schema.table`; `*` and `%` are wildcards, so `public.*`,
`public.order_%` and `%.orders` all work.
"""

from __future__ import annotations

import fnmatch

import psycopg
from psycopg import sql

from tailrace.errors import ConfigError


def _glob(pattern: str) -> str:
    return pattern.replace("%", "*")


def matches(patterns: list[str], database: str, schema: str, table: str) -> bool:
    for pattern in patterns:
        parts = pattern.split(".")
        if len(parts) == 3:
            db_p, schema_p, table_p = parts
            if not fnmatch.fnmatchcase(database, _glob(db_p)):
                continue
        else:
            schema_p, table_p = parts
        if fnmatch.fnmatchcase(schema, _glob(schema_p)) and fnmatch.fnmatchcase(
                table, _glob(table_p)):
            return True
    return False


def resolve_tables(conn: psycopg.Connection, patterns: list[str]) -> list[tuple[str, str]]:
    """The ordinary tables the patterns select, as (schema, table)."""
    database = conn.info.dbname
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        " AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1, 2").fetchall()
    return [(s, t) for s, t in rows if matches(patterns, database, s, t)]


def ensure_publication(conn: psycopg.Connection, name: str, tables: list[tuple[str, str]],
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
    if exists:
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(
            sql.Identifier(name), table_list))
    else:
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(name), table_list))
