"""Table shapes: from each table-map event (the truth for the rows that follow it) and from
information_schema (at DDL), one fingerprint for both, registered with the control service.

A shape is the ordered list of (column name, type name, primary-key flag).
Type names are normalised so the binlog's table map and information_schema
spell a structure alike: `int unsigned`, `decimal(12,2)`, `varchar`,
`datetime(6)`, `enum('a','b')`, `json`, `uuid` ... (lengths of character
columns are left out: the table map gives bytes, the catalog characters).

MariaDB's JSON (a LONGTEXT with a `json_valid` check), UUID and INET6 (16
binary bytes in the binlog) are not recognisable in a table map; the catalog
tells (`type hints`), looked up per table and forgotten at its next DDL.
Hints only ever change how a value is presented, never which column it is.

The event key of a table is its primary key (the table map's flags; the catalog's
`COLUMN_KEY = 'PRI'`). A table without one has no key — its events carry an empty
`key_columns` — unless `snapshot.key_columns` names columns for it (`TableShape.given_key`,
checked at start by `check_key_columns`): its events, streamed and read, are keyed by
those. Updates and deletes carry them because `binlog_row_image=FULL` is required of every
source (`connection.check_settings`). A given key is not part of the fingerprint: it
says how events are keyed, not what the table is.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql
from pymysqlreplication.constants import FIELD_TYPE

from tailrace.control_client import ControlClient
from tailrace.errors import ConfigError, FatalError
from tailrace.logs import get_logger
from tailrace.proto.event_pb2 import Position
from tailrace_services.capture_mysql.connection import ConnectionSettings, connect, one_row
from tailrace_services.capture_mysql.gtid import MariadbGtid, MariadbGtidPosition, MysqlGtidSet
from tailrace_services.capture_mysql.values import RowDecoder

__all__ = ["ColumnShape", "SchemaTracker", "TableShape", "TypeHints", "catalog_fingerprints",
           "catalog_shape", "check_key_columns", "fingerprint", "shape_from_table_map"]

log = get_logger(__name__)

_INT_NAMES = {FIELD_TYPE.TINY: "tinyint", FIELD_TYPE.SHORT: "smallint",
              FIELD_TYPE.INT24: "mediumint", FIELD_TYPE.LONG: "int",
              FIELD_TYPE.LONGLONG: "bigint"}
_BLOB_PREFIX = {1: "tiny", 2: "", 3: "medium", 4: "long"}
_SPATIAL = {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
            "multipolygon", "geometrycollection"}


@dataclass(frozen=True, slots=True)
class ColumnShape:
    name: str
    type: str  # normalised type name
    key: bool
    field_type: int = 0  # binlog FIELD_TYPE, 0 when from the catalog
    max_length: int = 0  # bytes, for BINARY(n) padding
    set_values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TableShape:
    database: str
    table: str
    columns: tuple[ColumnShape, ...]
    given_key: tuple[str, ...] = ()  # `snapshot.key_columns` of the table (module docstring)
    key_columns: tuple[str, ...] = field(init=False)
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        # No primary key: no key columns (never every column), as on PostgreSQL: Kafka then
        # keys by the table alone and the PostgreSQL sink refuses updates and deletes. The
        # given key only for a table without one that has all its columns.
        own = tuple(c.name for c in self.columns if c.key)
        given = self.given_key if set(self.given_key) <= {c.name for c in self.columns} else ()
        object.__setattr__(self, "key_columns", own or given)
        object.__setattr__(self, "fingerprint", fingerprint(self))

    def schema_json(self) -> str:
        return json.dumps({"database": self.database, "table": self.table,
                           "columns": [{"name": c.name, "type": c.type, "key": c.key}
                                       for c in self.columns]})


def fingerprint(shape: TableShape) -> str:
    """SHA-256 of (database, table, [(name, type, key), ...])."""
    doc = [shape.database, shape.table, [[c.name, c.type, c.key] for c in shape.columns]]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def _quote_list(values: list[str] | tuple[str, ...]) -> str:
    return ",".join("'" + v.replace("'", "''") + "'" for v in values)


def _binary(column: Any) -> bool:
    return getattr(column, "character_set_name", None) == "binary"


def type_name(column: Any, hint: str | None = None) -> str:
    """The normalised type of a table-map column (pymysqlreplication `Column`)."""
    t = column.type
    if t in _INT_NAMES:
        return _INT_NAMES[t] + (" unsigned" if column.unsigned else "")
    if t == FIELD_TYPE.NEWDECIMAL:
        return f"decimal({column.precision},{column.decimals})"
    if t == FIELD_TYPE.FLOAT:
        return "float"
    if t == FIELD_TYPE.DOUBLE:
        return "double"
    if t in (FIELD_TYPE.DATETIME2, FIELD_TYPE.TIMESTAMP2, FIELD_TYPE.TIME2):
        base = {FIELD_TYPE.DATETIME2: "datetime", FIELD_TYPE.TIMESTAMP2: "timestamp",
                FIELD_TYPE.TIME2: "time"}[t]
        return f"{base}({column.fsp})" if column.fsp else base
    simple = {FIELD_TYPE.DATETIME: "datetime", FIELD_TYPE.TIMESTAMP: "timestamp",
              FIELD_TYPE.TIME: "time", FIELD_TYPE.DATE: "date", FIELD_TYPE.YEAR: "year",
              FIELD_TYPE.JSON: "json", FIELD_TYPE.GEOMETRY: "geometry"}
    if t in simple:
        return simple[t]
    if t == FIELD_TYPE.BIT:
        return f"bit({column.bits})"
    if t == FIELD_TYPE.ENUM:
        return f"enum({_quote_list((column.enum_values or [''])[1:])})"
    if t == FIELD_TYPE.SET:
        return f"set({_quote_list(column.set_values or [])})"
    if t == FIELD_TYPE.VARCHAR:
        return "varbinary" if _binary(column) else "varchar"
    if t == FIELD_TYPE.STRING:
        if hint in ("uuid", "inet6", "inet4"):
            return hint
        return "binary" if _binary(column) else "char"
    if t == FIELD_TYPE.BLOB:
        if hint == "json":
            return "json"
        prefix = _BLOB_PREFIX.get(getattr(column, "length_size", 2), "")
        return prefix + ("blob" if _binary(column) else "text")
    raise FatalError(f"binlog column {column.name!r} has MySQL type code {t}, which Tailrace "
                     "cannot decode")


def shape_from_table_map(database: str, table: str, columns: list[Any],
                         hints: dict[str, str], given_key: Sequence[str] = ()) -> TableShape:
    """The shape of a table-map event; a column without a name is refused, never guessed."""
    out = []
    for i, column in enumerate(columns):
        if not column.name:
            raise FatalError(
                f"the table map of {database}.{table} carries no name for column {i + 1}: "
                "binlog_row_metadata must be FULL (SET GLOBAL binlog_row_metadata = 'FULL'); "
                "names looked up now would be wrong for rows written before a DDL")
        out.append(ColumnShape(
            name=column.name, type=type_name(column, hints.get(column.name)),
            key=bool(column.is_primary), field_type=column.type,
            max_length=getattr(column, "max_length", 0) or 0,
            set_values=tuple(column.set_values or ())))
    return TableShape(database, table, tuple(out), tuple(given_key))


_INFO_INT = re.compile(r"^(tinyint|smallint|mediumint|int|bigint)(\(\d+\))?( unsigned)?")


def catalog_type(column_type: str, data_type: str, is_json: bool) -> str:
    """information_schema's COLUMN_TYPE -> the normalised type name."""
    ct = column_type.lower().replace(" zerofill", "").strip()
    dt = data_type.lower()
    if is_json or dt == "json":
        return "json"
    m = _INFO_INT.match(ct)
    if m:
        return m.group(1) + (" unsigned" if m.group(3) else "")
    if dt in ("decimal", "numeric"):
        digits = re.findall(r"\d+", ct)
        precision, scale = (digits + ["10", "0"])[:2] if digits else ("10", "0")
        return f"decimal({precision},{scale if len(digits) > 1 else '0'})"
    if dt in ("datetime", "timestamp", "time"):
        fsp = re.search(r"\((\d)\)", ct)
        return f"{dt}({fsp.group(1)})" if fsp and fsp.group(1) != "0" else dt
    if dt in ("varchar", "varbinary", "char", "binary", "float", "double", "date", "year",
              "uuid", "inet6", "inet4"):
        return "float" if dt == "float" else dt
    if dt in ("enum", "set"):
        return ct
    if dt == "bit":
        return ct
    if dt in _SPATIAL:
        return "geometry"
    return dt  # tinytext, text, mediumtext, longtext and the blobs keep their name


class TypeHints:
    """MariaDB logical types per column (json, uuid, inet6, inet4), from the catalog."""

    def __init__(self, flavor: str) -> None:
        self.flavor = flavor
        self._cache: dict[tuple[str, str], dict[str, str]] = {}

    def forget(self, database: str, table: str) -> None:
        self._cache.pop((database, table), None)

    def get(self, conn: pymysql.connections.Connection | None, database: str, table: str
            ) -> dict[str, str]:
        key = (database, table)
        if key not in self._cache:
            if self.flavor != "mariadb" or conn is None:
                self._cache[key] = {}
            else:
                self._cache[key] = {c.name: c.type for c in catalog_shape(conn, database,
                                                                           table).columns
                                    if c.type in ("json", "uuid", "inet6", "inet4")}
        return self._cache[key]


def _json_columns(conn: pymysql.connections.Connection, database: str, table: str) -> set[str]:
    with conn.cursor() as cur:
        try:
            cur.execute("SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
                        "WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s", (database, table))
        except pymysql.err.MySQLError:
            return set()
        clauses = [str(row[0]) for row in cur.fetchall()]
    return {m for c in clauses for m in re.findall(r"json_valid\(`((?:[^`]|``)+)`\)", c)}


def catalog_shape(conn: pymysql.connections.Connection, database: str, table: str,
                  given_key: Sequence[str] = ()) -> TableShape:
    """The table's shape as information_schema tells it now (empty when it does not exist)."""
    json_cols = _json_columns(conn, database, table)
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, DATA_TYPE, COLUMN_KEY FROM "
                    "information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
                    "ORDER BY ORDINAL_POSITION", (database, table))
        rows = cur.fetchall()
    return TableShape(database, table, tuple(
        ColumnShape(name=str(name), type=catalog_type(str(ctype), str(dtype), name in json_cols),
                    key=str(key) == "PRI")
        for name, ctype, dtype, key in rows), tuple(given_key))


def catalog_fingerprints(conn: pymysql.connections.Connection, tables: list[tuple[str, str]]
                         ) -> dict[tuple[str, str], str]:
    """(database, table) -> fingerprint, as the registry names them, from the catalog (the
    drift check on a changed server, `tailrace_services.capture.drift`)."""
    return {(db, table): catalog_shape(conn, db, table).fingerprint for db, table in tables}


# data types a given key cannot have: ENUM and SET sort by member number but compare as
# text, FLOAT and DOUBLE are approximate, TEXT, BLOB, JSON and spatial values sort by a
# prefix only (max_sort_length) -- chunks read in key order would skip or repeat rows
_UNORDERED = frozenset({"enum", "set", "float", "double", "tinytext", "text", "mediumtext",
                        "longtext", "tinyblob", "blob", "mediumblob", "longblob", "json",
                        *_SPATIAL})


def check_key_columns(conn: pymysql.connections.Connection, tables: Sequence[tuple[str, str]],
                      configured: Mapping[str, Sequence[str]]) -> None:
    """Each table `snapshot.key_columns` names is selected, has no key of its own, has the
    columns, NOT NULL and of a type read in order (`_UNORDERED`). That updates and deletes
    carry them is `binlog_row_image=FULL`, checked for every source (`check_settings`)."""
    selected = {f"{d}.{t}" for d, t in tables}
    for table, columns in configured.items():
        where = f"spec.source.snapshot.key_columns: {table}"
        if table not in selected:
            raise ConfigError(f"{where} is not a selected table (it does not exist, or "
                              "spec.source.tables does not select it)")
        database, name = table.split(".")
        with conn.cursor() as cur:
            cur.execute("SELECT COLUMN_NAME, COLUMN_KEY, IS_NULLABLE, DATA_TYPE, COLUMN_TYPE "
                        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND "
                        "TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (database, name))
            found = {str(r[0]): [str(v) for v in r[1:]] for r in cur.fetchall()}
        own = [c for c, (key, *_) in found.items() if key == "PRI"]
        if own:  # a unique index on NOT NULL columns counts: the server takes it for one
            raise ConfigError(f"{where} has a primary key of its own ({', '.join(own)}), which "
                              "its events are keyed by: remove it from key_columns")
        missing = [c for c in columns if c not in found]
        if missing:
            raise ConfigError(f"{where} has no column {', '.join(missing)} (its columns: "
                              f"{', '.join(found)})")
        nullable = [c for c in columns if found[c][1] == "YES"]
        if nullable:  # a NULL in a key compares to nothing: chunks would skip rows
            fix = "; ".join(f"ALTER TABLE {table} MODIFY {c} {found[c][3]} NOT NULL"
                            for c in nullable)
            raise ConfigError(f"{where}: {', '.join(nullable)} may be NULL; key columns must "
                              f"be NOT NULL ({fix}, keeping the columns' other attributes)")
        unordered = [f"{c} ({found[c][3]})" for c in columns if found[c][2].lower() in _UNORDERED]
        if unordered:
            raise ConfigError(
                f"{where}: {', '.join(unordered)} cannot be read in key order (ENUM and SET "
                "sort by member number, FLOAT and DOUBLE are approximate, TEXT, BLOB, JSON "
                "and spatial values sort by a prefix): give other columns")


class SchemaTracker:
    """Table shapes of the stream, registered once per fingerprint; catalog hints per table.
    `key_columns`: `snapshot.key_columns` (`TableShape.given_key`)."""

    def __init__(self, control: ControlClient, tenant: str, settings: ConnectionSettings,
                 flavor: str, key_columns: Mapping[str, Sequence[str]] | None = None) -> None:
        self.control = control
        self.tenant = tenant
        self.settings = settings
        self.hints = TypeHints(flavor)
        self.given = key_columns or {}
        self._shapes: dict[tuple[Any, ...], tuple[TableShape, RowDecoder]] = {}
        self._sequences: dict[str, int] = {}
        self.latest: dict[tuple[str, str], TableShape] = {}

    def _catalog(self) -> pymysql.connections.Connection:
        return connect(self.settings)

    def for_rows(self, database: str, table: str, columns: list[Any], position: Position
                 ) -> tuple[TableShape, RowDecoder, int]:
        key = (database, table, tuple(
            (c.name, c.type, c.unsigned, c.is_primary, c.character_set_name,
             getattr(c, "fsp", None), getattr(c, "precision", None),
             getattr(c, "decimals", None), getattr(c, "bits", None),
             getattr(c, "max_length", None), getattr(c, "length_size", None),
             tuple(c.enum_values or ()), tuple(c.set_values or ())) for c in columns))
        found = self._shapes.get(key)
        if found is None:
            hints = self._hints(database, table)
            shape = shape_from_table_map(database, table, columns, hints,
                                         self.given.get(f"{database}.{table}", ()))
            found = (shape, RowDecoder(shape, columns))
            self._shapes[key] = found
        shape, decoder = found
        self.latest[(database, table)] = shape
        return shape, decoder, self.register(shape, position)

    def _hints(self, database: str, table: str) -> dict[str, str]:
        if self.hints.flavor != "mariadb":
            return {}
        conn = self._catalog()
        try:
            return self.hints.get(conn, database, table)
        finally:
            conn.close()

    def register(self, shape: TableShape, position: Position | None) -> int:
        fp = shape.fingerprint
        if fp not in self._sequences:
            record = self.control.register_schema(self.tenant, shape.database, shape.table, fp,
                                                  shape.schema_json(), position)
            self._sequences[fp] = int(record.sequence)
            log.info("schema registered", table=f"{shape.database}.{shape.table}",
                     version=int(record.version), sequence=int(record.sequence),
                     fingerprint=fp[:12])
        return self._sequences[fp]

    def after_ddl(self, database: str, table: str, gtid: str, position: Position
                  ) -> tuple[TableShape | None, int]:
        """Forget the table's hints; register its new structure when the catalog shows it.

        The catalog shows the structure *now*. That is this DDL's result only when
        nothing followed it in the binlog yet (we are at the tail); while catching
        up, a later DDL may already be applied, so registration waits for the next
        table map of the table, which is exact for its rows.
        """
        self.hints.forget(database, table)
        conn = self._catalog()
        try:
            if not _at_tail(conn, self.hints.flavor, gtid):
                return None, 0
            shape = catalog_shape(conn, database, table, self.given.get(f"{database}.{table}", ()))
        finally:
            conn.close()
        if not shape.columns:
            return None, 0  # dropped (or renamed away)
        self.latest[(database, table)] = shape
        return shape, self.register(shape, position)


def _at_tail(conn: pymysql.connections.Connection, flavor: str, gtid: str) -> bool:
    """Is `gtid` the last transaction in the server's binlog?"""
    with conn.cursor() as cur:
        cur.execute("SELECT @@global.gtid_binlog_pos" if flavor == "mariadb"
                    else "SELECT @@global.gtid_executed")
        (text,) = one_row(cur)
    if flavor == "mariadb":
        g = MariadbGtid.parse(gtid)
        current = MariadbGtidPosition.parse(str(text or "")).get(g.domain)
        return current == g
    sid, number = MysqlGtidSet.parse_gtid(gtid)
    intervals = MysqlGtidSet.parse(str(text or "")).intervals(sid.uuid, sid.tag)
    return bool(intervals) and intervals[-1][1] == number
