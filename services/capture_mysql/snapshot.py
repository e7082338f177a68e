"""MySQL/MariaDB's side of a snapshot: watermarks as rows of the signal table, chunks read in
primary-key order (or `snapshot.key_columns`) by a fresh consistent read (docs/snapshots.md).

A chunk, on the snapshot reader's own autocommit connection:

1. the low watermark: an INSERT into the signal table (`signal_table.py`), committed,
   so it is in the binlog before the read starts;
2. `SELECT ... WHERE (key) > (cursor) [AND (where)] ORDER BY key LIMIT n + 1` as one
   autocommit statement: a fresh consistent read (InnoDB makes its read view when the
   statement starts), streamed row by row (an unbuffered cursor: the server's result is
   never held twice in memory);
3. the high watermark, another INSERT.

Why `ChunkRows.hidden` stays empty here (unlike PostgreSQL): these servers make commits
visible in binlog order. MariaDB's group commit calls each engine's `commit_ordered()` —
where InnoDB makes a transaction visible — serialised, in the order the transactions went
into the binlog, always (sql/handler.h; there is no switch). MySQL does the same with
`binlog_order_commits=ON` (its default); with OFF, a group's transactions may become
visible out of binlog order, so `plan` refuses to snapshot and names the setting. Hence:

- a transaction before the low watermark in the binlog was visible once the watermark's
  INSERT returned (it committed before it, in order), so the SELECT sees it;
- a transaction the SELECT sees has committed, and with the binlog on it is written to the
  binlog before its engine commit (two-phase commit), so it is before the high watermark;
- anything else committed between the watermarks, and the merger drops its keys.

Non-transactional tables (MyISAM, Aria) are outside this argument: their changes are
visible before they are logged.

A table without a primary key is read by the columns `snapshot.key_columns` gives it
(checked at start: `schema.check_key_columns`), which its streamed events carry too
(`schema.TableShape.given_key`). Nothing keeps them unique, so each chunk's query also
tells which row repeats the key of the row before it (`_with_repeats`): such a chunk fails
the table, naming the key.

DDL: the catalog is read for every chunk, before and after its SELECT; a structure that
changed in between means the SELECT ran with a stale column list, so it runs again (still
between the watermarks). A DDL committed after that check and before the high watermark
would leave the chunk with the columns from before it, placed after the DDL event — a
window of one INSERT. A changed primary key fails the table (request it again).

Values: each column is read so that the value handed to `values.RowDecoder` is what
python-mysql-replication gives for the same binlog column (FLOAT widened to double, BIT as
a bit string, MariaDB UUID/INET as their bytes, TIMESTAMP in UTC, zero dates as NULL, MySQL
JSON parsed), and the shape comes from the catalog (`schema.catalog_shape`, which spells
types as the table map does): a key read here and the same key streamed compare equal, and
sinks see one representation.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import pymysql
import pymysql.cursors
from pymysqlreplication.constants import FIELD_TYPE

from tailrace.control_client import ControlClient
from tailrace.errors import ConfigError, RetryableError
from tailrace.events import ChangeEvent, Op
from tailrace.events._codec import bus_key_of
from tailrace.logs import get_logger
from tailrace_services.capture.snapshot import ChunkRows, Key, ReadRow, TablePlan, chunk_rows
from tailrace_services.capture_mysql.connection import ConnectionSettings, connect
from tailrace_services.capture_mysql.schema import TableShape, catalog_shape
from tailrace_services.capture_mysql.signal_table import PRUNE_EVERY, SignalTable
from tailrace_services.capture_mysql.values import RowDecoder

__all__ = ["MysqlChunks", "binlog_form", "cursor_text"]

log = get_logger(__name__)

_BINARY_TYPES = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "bit",
                 "geometry")
_SET_MEMBER = re.compile(r"'((?:[^']|'')*)'")
SHAPE_ATTEMPTS = 5


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _bits(v: bytes) -> str:
    return format(int.from_bytes(v, "big"), "b")


def _no_date(v: Any) -> Any:
    return None if isinstance(v, str) else v  # '0000-00-00': no date, as the binlog has it


def _epoch_if_zero(v: Any) -> Any:
    # a zero TIMESTAMP is 0 seconds in the binlog, which the library reads as the epoch
    return dt.datetime(1970, 1, 1) if isinstance(v, str) else v  # noqa: DTZ001 - naive UTC, as the library


def binlog_form(type_name: str, flavor: str) -> Callable[[Any], Any] | None:
    """How a value PyMySQL read for a column of `type_name` becomes the value the binlog
    library gives for it (then `values.converter_for` does the rest); None: the same."""
    if type_name == "uuid":
        return lambda v: uuid.UUID(v).bytes
    if type_name == "inet6":
        return lambda v: ipaddress.IPv6Address(v).packed
    if type_name == "inet4":
        return lambda v: ipaddress.IPv4Address(v).packed
    if type_name == "json" and flavor == "mysql":
        # numbers as the library gives a binary JSON double (a JSON decimal, which the
        # text cannot tell apart, then prints 1.0 where the stream prints 1)
        return lambda v: json.loads(v) if isinstance(v, str | bytes) else v
    if type_name.startswith("bit("):
        return _bits
    if type_name == "date" or type_name.startswith("datetime"):
        return _no_date
    if type_name.startswith("timestamp"):
        return _epoch_if_zero
    return None


def cursor_text(value: Any) -> str:
    """A key value as text that the server compares like the column (the stored cursor)."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.timedelta):
        sign, total = ("-", -value) if value < dt.timedelta(0) else ("", value)
        seconds = total.days * 86400 + total.seconds
        return f"{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}." \
               f"{total.microseconds:06d}"
    return str(value)


def _shape_for_rows(shape: TableShape, column_types: dict[str, tuple[str, int]]) -> TableShape:
    """The catalog shape with what `values.converter_for` needs (binlog field types, BINARY
    lengths, SET members); the fingerprint (names, types, key) stays the same."""
    columns = []
    for c in shape.columns:
        column_type, octets = column_types[c.name]
        field_type, max_length, members = 0, 0, ()
        if c.type == "float":
            field_type = FIELD_TYPE.FLOAT
        elif c.type.startswith("timestamp"):
            field_type = FIELD_TYPE.TIMESTAMP2
        elif c.type == "year":
            field_type = FIELD_TYPE.YEAR
        elif c.type.startswith("bit("):
            field_type = FIELD_TYPE.BIT
        elif c.type.startswith("set("):
            field_type = FIELD_TYPE.SET
            members = tuple(m.replace("''", "'") for m in _SET_MEMBER.findall(column_type))
        elif c.type == "binary":
            field_type, max_length = FIELD_TYPE.STRING, octets
        columns.append(replace(c, field_type=field_type, max_length=max_length,
                               set_values=members))
    return replace(shape, columns=tuple(columns))


def _with_repeats(query: str, keys: tuple[str, ...]) -> str:
    """`query`'s rows, each with one more column: whether its key equals the row's before it
    as the server compares them (collations: letter case and trailing spaces may not count).

    A key from `snapshot.key_columns` has no constraint behind it: two rows with one key
    would be one row to the merger, or split by a chunk boundary (the next chunk starts
    after the key, so the second would never be read). Rows sorted by the key put such rows
    side by side, here or across the boundary (the extra row read to tell whether more
    follow); the comparison is the server's, as the ORDER BY and the cursor's are."""
    order = ", ".join(_q(k) for k in keys)
    same = " AND ".join(f"c.{_q(k)} <=> LAG(c.{_q(k)}) OVER w" for k in keys)
    return (f"SELECT c.*, {same} FROM ({query}) AS c "  # noqa: S608 - quoted identifiers
            f"WINDOW w AS (ORDER BY {order}) ORDER BY {order}")


def _repeated(table: _Table, key: list[Any]) -> ConfigError:
    return ConfigError(
        f"spec.source.snapshot.key_columns: {table.database}.{table.name} has two rows with "
        f"{', '.join(table.chunk_key)} = {', '.join(map(cursor_text, key))} (equal as the "
        "server compares them); give columns that are unique (and not null)")


@dataclass
class _Table:
    """What reading one table needs, from the catalog."""

    database: str
    name: str
    shape: TableShape
    decoder: RowDecoder
    chunk_key: tuple[str, ...]  # the primary key in index order, or the given key (ORDER BY)
    select: str  # the column list
    forms: list[tuple[str, Callable[[Any], Any] | None]]
    binary_keys: frozenset[str]
    estimate: int
    sequence: int = 0
    given: bool = False  # chunk_key from `snapshot.key_columns`: no constraint behind it
    kinds: bytes = field(init=False)  # `chunk_rows`' per column (`RowDecoder.read_encoders`)
    encoders: tuple[Callable[[Any], bytes], ...] = field(init=False)

    def __post_init__(self) -> None:
        self.kinds, self.encoders = self.decoder.read_encoders([f for _, f in self.forms])

    # the rest of what `chunk_rows` takes, made once per table: where the chunk key and the
    # event key are among the columns (the merger's key; `bus_key`: in column order)
    @cached_property
    def key_index(self) -> tuple[int, ...]:
        return tuple(self._names.index(k) for k in self.chunk_key)

    @cached_property
    def bus_index(self) -> tuple[int, ...]:
        return tuple(sorted(self._names.index(k) for k in self.shape.key_columns))

    @cached_property
    def prefixes(self) -> tuple[bytes, ...]:
        return tuple(self.decoder.prefixes)

    @cached_property
    def head(self) -> bytes:
        return bus_key_of(self.database, "", self.name, [])

    @property
    def _names(self) -> list[str]:
        return [n for n, _ in self.forms]  # the shape's columns, as the decoder's


class MysqlChunks:
    """`ChunkSource` for MySQL/MariaDB (module docstring); one connection, used by the
    snapshot worker's thread only. `key_columns`: `snapshot.key_columns`."""

    visible_after_streamed = False  # a read after the low watermark sees what it precedes

    def __init__(self, settings: ConnectionSettings, source_id: str, tenant: str,
                 flavor: str, signal: SignalTable, control: ControlClient,
                 key_columns: Mapping[str, Sequence[str]] | None = None) -> None:
        self.settings = settings
        self.given = key_columns or {}
        self.source_id = source_id
        self.tenant = tenant
        self.flavor = flavor
        self.signal = signal
        self.control = control
        self._conn: pymysql.connections.Connection | None = None
        self._tables: dict[str, _Table] = {}
        self._sequences: dict[str, int] = {}  # fingerprint -> registry sequence
        self._signal_ready = False
        self._writes = 0
        self._last_signal_id = 0

    def _connection(self) -> pymysql.connections.Connection:
        if self._conn is None or not self._conn.open:
            self._conn = connect(self.settings)
            with self._conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")  # TIMESTAMP as UTC, as the binlog holds it
        return self._conn

    def _table(self, table: str) -> _Table:
        found = self._tables.get(table)
        if found is None:
            found = self._tables[table] = self._load(table)
        return found

    def _load(self, table: str) -> _Table:
        database, _, name = table.partition(".")
        conn = self._connection()
        shape = catalog_shape(conn, database, name, self.given.get(table, ()))
        if not shape.columns:
            raise ConfigError(f"table {table} does not exist (any more)")
        with conn.cursor() as cur:
            cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, COALESCE(CHARACTER_OCTET_LENGTH, 0) "
                        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND "
                        "TABLE_NAME = %s", (database, name))
            column_types = {str(n): (str(t), int(o)) for n, t, o in cur.fetchall()}
            cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE "
                        "TABLE_SCHEMA = %s AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' "
                        "ORDER BY SEQ_IN_INDEX", (database, name))
            chunk_key = tuple(str(r[0]) for r in cur.fetchall())
            cur.execute("SELECT COALESCE(TABLE_ROWS, 0) FROM information_schema.TABLES "
                        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (database, name))
            row = cur.fetchone()
        given = not chunk_key and not any(c.key for c in shape.columns) and bool(shape.key_columns)
        if given:
            chunk_key = shape.key_columns
        shape = _shape_for_rows(shape, column_types)
        # FLOAT widened to double, as the binlog library reads it (text would round it)
        select = ", ".join(f"{_q(c.name)} + 0e0" if c.type == "float" else _q(c.name)
                           for c in shape.columns)
        binary = frozenset(c.name for c in shape.columns
                           if c.type.split("(")[0] in _BINARY_TYPES)
        return _Table(database, name, shape, RowDecoder(shape), chunk_key, select,
                      [(c.name, binlog_form(c.type, self.flavor)) for c in shape.columns],
                      binary, int(row[0]) if row else 0, given=given)

    # -- ChunkSource --------------------------------------------------------------------

    def key_columns(self, table: str) -> tuple[str, ...]:
        return self._table(table).chunk_key

    def plan(self, table: str) -> TablePlan:
        self._tables.pop(table, None)  # the catalog as it is now
        found = self._table(table)
        if not found.chunk_key and found.shape.key_columns:  # a unique index the server promoted
            raise ConfigError(f"{table} has no primary key, only a unique index on NOT NULL "
                              f"columns ({', '.join(found.shape.key_columns)}), which Tailrace "
                              "cannot read it in chunks by yet: make it the primary key")
        if not found.chunk_key:
            raise ConfigError(f"{table} has no primary key to read it in chunks by: add one, or "
                              "give its columns in spec.source.snapshot.key_columns")
        ordered_apart = [c.name for c in found.shape.columns if c.name in found.chunk_key
                         and c.type.startswith(("enum(", "set("))]
        if ordered_apart:  # sorted by member number, compared as text: chunks would skip rows
            raise ConfigError(f"{table}: its primary key column(s) {', '.join(ordered_apart)} "
                              "are ENUM/SET, which Tailrace cannot read in key order yet")
        self._check_commit_order()
        if not self._signal_ready:
            self.signal.ensure(self._connection())
            self._signal_ready = True
        self._register(found)
        return TablePlan(table, found.chunk_key, found.estimate)

    def _register(self, found: _Table) -> None:
        """The shape's sequence in the schema registry (the same fingerprint as the table
        map's, so the streamed events' sequence)."""
        sequence = self._sequences.get(found.shape.fingerprint)
        if sequence is None:
            registered = self.control.register_schema(
                self.tenant, found.database, found.name, found.shape.fingerprint,
                found.shape.schema_json())
            sequence = self._sequences[found.shape.fingerprint] = int(registered.sequence)
        found.sequence = sequence

    def _current(self, plan: TablePlan) -> _Table:
        """The table as the catalog shows it now (a DDL since the last chunk: the new
        columns, registered); a changed key is an error (the cursor would not fit it)."""
        found = self._tables[plan.table] = self._load(plan.table)
        if found.chunk_key != plan.key_columns:
            raise ConfigError(f"the primary key of {plan.table} changed during its snapshot "
                              f"({', '.join(plan.key_columns)} -> "
                              f"{', '.join(found.chunk_key) or 'none'}): request it again")
        self._register(found)
        return found

    def _check_commit_order(self) -> None:
        if self.flavor != "mysql":
            return  # MariaDB always commits in binlog order (module docstring)
        with self._connection().cursor() as cur:
            cur.execute("SELECT @@global.binlog_order_commits")
            row = cur.fetchone()
        if row is not None and str(row[0]) not in ("1", "ON"):
            raise ConfigError("binlog_order_commits is OFF on the source server, so commits may "
                              "become visible out of binlog order and a snapshot could read a "
                              "row older than a change streamed before it; SET GLOBAL "
                              "binlog_order_commits = ON (and in the server's config file)")

    def cleared(self, plan: TablePlan) -> ChangeEvent:
        table = self._table(plan.table)
        return ChangeEvent(source_id=self.source_id, tenant=self.tenant,
                           database=table.database, table=table.name, op=Op.OP_TRUNCATE,
                           key_columns=table.chunk_key)

    def begin_table(self, plan: TablePlan) -> None:
        """Nothing to note: no transaction can be hidden from a read (module docstring)."""

    def boundary(self, plan: TablePlan, after: list[str] | None, size: int, where: str
                 ) -> list[str] | None:
        table = self._table(plan.table)
        keys = ", ".join(_q(k) for k in table.chunk_key)
        condition, params = self._conditions(table, after, None, where)
        query = (f"SELECT {keys} FROM {_q(table.database)}.{_q(table.name)}{condition} "  # noqa: S608 - quoted identifiers
                 f"ORDER BY {keys} LIMIT {int(size) - 1}, 2")
        with self._connection().cursor() as cur:
            cur.execute(query, params)
            rows = cur.fetchall()
        if len(rows) < 2:  # at most `size` rows left: the last range
            return None
        # (rows with one given key all fall in this range: `_with_repeats` sees them)
        return [cursor_text(v) for v in rows[0]]

    def read_chunk(self, plan: TablePlan, after: list[str] | None, limit: int, where: str,
                   token: str, upto: list[str] | None = None) -> ChunkRows:
        """Low watermark, then the SELECT; when the table's structure changed around it (a
        DDL between the catalog read and the SELECT), the SELECT again with the new columns —
        still between the watermarks, so still a valid read."""
        table = self._current(plan)
        self._write(token, high=False)
        for _ in range(SHAPE_ATTEMPTS):
            template, rows, cursor, more = self._select(table, after, upto, limit, where)
            now = self._current(plan)
            if now.shape.fingerprint == table.shape.fingerprint:
                return ChunkRows(template, rows, cursor, more, forgettable=lambda _tx: True)
            log.info("table changed during a snapshot chunk's read; reading it again",
                     table=plan.table)
            table = now
        raise RetryableError(f"the structure of {plan.table} kept changing during a snapshot "
                             "chunk's read")

    def _select(self, table: _Table, after: list[str] | None, upto: list[str] | None,
                limit: int, where: str
                ) -> tuple[ChangeEvent, dict[Key, ReadRow], list[str] | None, bool]:
        """(the table's read event without its row, the rows by the merger's key, the
        cursor after them, whether rows follow)."""
        query, params = self._query(table, after, upto, limit, where)
        template = ChangeEvent(source_id=self.source_id, tenant=self.tenant,
                               database=table.database, table=table.name,
                               op=Op.OP_SNAPSHOT_READ, key_columns=table.shape.key_columns,
                               schema_version=table.shape.fingerprint,
                               schema_sequence=table.sequence)
        key_index = table.key_index  # the chunk key, as the plan's (`_current` checks)
        with self._connection().cursor(pymysql.cursors.SSCursor) as cur:
            cur.execute(query, params)
            raw_rows = list(cur.fetchall_unbuffered())  # limit + 1 rows at most, or a range
        if table.given:  # its last column: a repeated key (`_with_repeats`)
            for raw in raw_rows:
                if raw[-1]:
                    raise _repeated(table, [raw[i] for i in key_index])
            raw_rows = [raw[:-1] for raw in raw_rows]
        more = upto is not None or len(raw_rows) > limit
        if upto is None:
            del raw_rows[limit:]  # the extra row only says the table goes on
        rows = chunk_rows(raw_rows, table.kinds, table.encoders, table.prefixes, key_index,
                          table.bus_index, table.head)
        last = raw_rows[-1] if raw_rows else None
        cursor = [cursor_text(last[i]) for i in key_index] if last is not None else None
        return template, rows, cursor, more

    @staticmethod
    def _beyond(table: _Table, bound: list[str]) -> tuple[str, list[Any]]:
        """`(k1, k2, ...) > (v1, v2, ...)` spelled so that the optimizer ranges on k1."""
        keys = table.chunk_key

        def value(k: str) -> str:
            return "UNHEX(%s)" if k in table.binary_keys else "%s"

        alternatives = []
        params: list[Any] = []
        for i, k in enumerate(keys):
            parts = [f"{_q(p)} = {value(p)}" for p in keys[:i]] + [f"{_q(k)} > {value(k)}"]
            alternatives.append("(" + " AND ".join(parts) + ")")
            params.extend([*bound[:i], bound[i]])
        if len(keys) == 1:
            return alternatives[0], params
        return (f"{_q(keys[0])} >= {value(keys[0])} AND ({' OR '.join(alternatives)})",
                [bound[0], *params])

    @staticmethod
    def _conditions(table: _Table, after: list[str] | None, upto: list[str] | None,
                    where: str) -> tuple[str, list[Any]]:
        conditions: list[str] = []
        params: list[Any] = []
        if after is not None:
            beyond, values = MysqlChunks._beyond(table, after)
            conditions.append(beyond)
            params.extend(values)
        if upto is not None:  # NOT beyond it, with the first column's range spelled out
            first = table.chunk_key[0]
            value = "UNHEX(%s)" if first in table.binary_keys else "%s"
            beyond, values = MysqlChunks._beyond(table, upto)
            conditions.append(f"{_q(first)} <= {value} AND NOT ({beyond})")
            params.extend([upto[0], *values])
        if where:
            conditions.append(f"({where.replace('%', '%%')})")  # an admin's filter, parsed by control
        return (" WHERE " + " AND ".join(conditions) if conditions else ""), params

    @staticmethod
    def _query(table: _Table, after: list[str] | None, upto: list[str] | None, limit: int,
               where: str) -> tuple[str, list[Any]]:
        keys = table.chunk_key
        condition, params = MysqlChunks._conditions(table, after, upto, where)
        query = f"SELECT {table.select} FROM {_q(table.database)}.{_q(table.name)}{condition}"  # noqa: S608 - quoted identifiers
        query += f" ORDER BY {', '.join(_q(k) for k in keys)}"
        if upto is None:
            query += f" LIMIT {int(limit) + 1}"
        return (_with_repeats(query, keys) if table.given else query), params

    def write_high(self, token: str) -> None:
        self._write(token, high=True)

    def _write(self, token: str, high: bool) -> None:
        conn = self._connection()
        row_id = self.signal.write(conn, self.source_id, token, high)
        self._writes += 1
        if self._writes % PRUNE_EVERY == 0 and self._last_signal_id:
            self.signal.prune(conn, self.source_id, self._last_signal_id)  # older than the last
        self._last_signal_id = row_id

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(pymysql.err.Error):
                self._conn.close()
            self._conn = None
