"""Target tables of the PostgreSQL sink: column types, creation, added columns, parameters.

A table missing in the target is created from the first full row that reaches it,
with the event's key columns as primary key. Column types: a PostgreSQL source's
built-in types are kept as they are (arrays become jsonb); MySQL/MariaDB types are
mapped to their PostgreSQL counterparts; anything else is chosen from the value
(text when nothing is known).
"""

from __future__ import annotations

import re
from typing import Any, Final

from psycopg import Connection, sql
from psycopg.types.json import Jsonb

from tailrace.events import ChangeEvent, Column, Value, python_of
from tailrace.events._values import json_of

_PG_BUILTIN: Final = re.compile(
    r"^(smallint|integer|bigint|numeric(\(\d+(,\d+)?\))?|real|double precision|boolean|text"
    r"|character varying(\(\d+\))?|character(\(\d+\))?|bytea|date|interval.*"
    r"|time(\(\d\))? with(out)? time zone|timestamp(\(\d\))? with(out)? time zone"
    r"|uuid|json|jsonb|inet|cidr|macaddr8?|money|xml|bit( varying)?(\(\d+\))?|tsvector|oid)$")

_MYSQL: Final[list[tuple[re.Pattern[str], str]]] = [
    (re.compile(p), t) for p, t in [
        (r"^bigint\b.*unsigned", "numeric(20,0)"),
        (r"^(int|integer|mediumint)\b.*unsigned", "bigint"),
        (r"^(tinyint|smallint)\b.*unsigned", "integer"),
        (r"^bigint\b", "bigint"),
        (r"^(int|integer|mediumint|year)\b", "integer"),
        (r"^(tinyint|smallint)\b", "smallint"),
        (r"^(decimal|numeric)(\(\d+(,\d+)?\))?", "numeric\\2"),
        (r"^float\b", "real"),
        (r"^(double|real)\b", "double precision"),
        (r"^(varchar|char)(\(\d+\))", "character varying\\2"),
        (r"^(tinytext|text|mediumtext|longtext|enum|set|varchar|char)\b", "text"),
        (r"^(binary|varbinary|tinyblob|blob|mediumblob|longblob|bit|geometry|point)\b", "bytea"),
        (r"^datetime\b", "timestamp without time zone"),
        (r"^timestamp\b", "timestamp with time zone"),
        (r"^date$", "date"),
        (r"^time\b", "time without time zone"),
        (r"^json$", "jsonb"),
        (r"^bool(ean)?$", "boolean"),
    ]
]

_BY_VALUE: Final = {
    "bool_value": "boolean", "int_value": "bigint", "uint_value": "numeric(20,0)",
    "float_value": "double precision", "decimal_value": "numeric", "text_value": "text",
    "bytes_value": "bytea", "json_value": "jsonb", "date_value": "date",
    "time_value": "time without time zone", "uuid_value": "uuid", "array_value": "jsonb",
}


def column_type(column: Column, source: str) -> str:
    """The PostgreSQL type for a new column, from the source type and the value."""
    declared = column.type.strip().lower()
    if declared.endswith("[]"):
        return "jsonb"
    if source == "postgres" and _PG_BUILTIN.match(declared):
        return declared
    if source == "mysql":
        for pattern, pg_type in _MYSQL:
            m = pattern.match(declared)
            if m:
                return m.expand(pg_type)
    kind = column.value.WhichOneof("kind") or ""
    if kind == "timestamp_value":
        zone = column.value.timestamp_value.with_zone
        return "timestamp with time zone" if zone else "timestamp without time zone"
    return _BY_VALUE.get(kind, "text")


def source_kind(event: ChangeEvent) -> str:
    return "postgres" if event.position.WhichOneof("native") == "postgres" else "mysql"


def parameter(value: Value) -> Any:
    """The Python value psycopg sends for a column value (JSON stays verbatim)."""
    kind = value.WhichOneof("kind")
    if kind == "json_value":
        return Jsonb(value.json_value, dumps=str)
    if kind == "array_value":
        return Jsonb(json_of(value))
    return python_of(value)


class TableCache:
    """Columns of the target tables, read once per table; `forget()` after a rollback."""

    def __init__(self) -> None:
        self._columns: dict[str, dict[str, str]] = {}

    def columns(self, conn: Connection[Any], table: sql.Composable, name: str) -> dict[str, str]:
        if name not in self._columns:
            rows = conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
                " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped"
                " ORDER BY a.attnum", [table.as_string(conn)]).fetchall()
            self._columns[name] = {r[0]: r[1] for r in rows}
        return self._columns[name]

    def create(self, conn: Connection[Any], table: sql.Composable, name: str,
               columns: list[Column], keys: list[str], source: str) -> None:
        defs = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(column_type(c, source)))
                for c in columns]
        if keys:
            defs.append(sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(map(sql.Identifier, keys))))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            table, sql.SQL(", ").join(defs)))
        self._columns[name] = {c.name: column_type(c, source) for c in columns}

    def add_columns(self, conn: Connection[Any], table: sql.Composable, name: str,
                    columns: list[Column], source: str) -> None:
        for c in columns:
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                table, sql.Identifier(c.name), sql.SQL(column_type(c, source))))
            self._columns[name][c.name] = column_type(c, source)

    def forget(self) -> None:
        self._columns.clear()
