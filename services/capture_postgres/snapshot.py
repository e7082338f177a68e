"""PostgreSQL's side of a snapshot: watermarks through `pg_logical_emit_message`, chunks
read in key order in a REPEATABLE READ transaction (docs/snapshots.md).

A chunk, on its own connection:

1. the low watermark, a non-transactional logical message: in the WAL right away;
2. `BEGIN ISOLATION LEVEL REPEATABLE READ`, the snapshot (`pg_current_snapshot()`), and
   `SELECT ... WHERE (key) > (cursor) [AND (where)] ORDER BY key LIMIT n` in it; values
   come back as the server's text, converted like pgoutput's (so a key read here and
   the same key streamed compare equal);
3. the transactions the read could not see (`ChunkRows.hidden`): those the snapshot lists
   as running, and those at or past its `xmax` (begun after it, or not yet counted as
   completed). PostgreSQL makes a commit visible a moment after its WAL record, so such a
   transaction can sit before the low watermark in the stream and still be invisible to
   the read; the merger removes the keys of those it saw before the watermark, and reads
   the chunk again when one of them was streamed before it began recording the table;
4. after COMMIT, the high watermark, flushed at once (`write_high`).

Why this order: a transaction whose commit is in the WAL before the low watermark was
assigned its xid before the snapshot, so the snapshot either sees it or counts it as not
visible: listed as running, or at or past `xmax`. (`xmax` is one past the newest
*completed* xid: a transaction whose commit record is written but that is not yet marked
completed, and newer than every completed one, is not listed — a loaded machine showed
it.) Taking the snapshot first would miss one that starts and commits between the
snapshot and the watermark — not visible, not listed, yet before the watermark in the
stream: its change would be followed by an older read.

Values are encoded as the stream encodes them (`Relation.encoders` and `kinds`: the
server's text straight to the serialized `Value`), from a `Relation` built from the
catalog, with the same key columns the stream's events get (`schema.choose_key`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.string import TextLoader

from tailrace.errors import ConfigError
from tailrace.events import ChangeEvent, Op
from tailrace.events._codec import bus_key_of
from tailrace_services.capture.snapshot import (
    WATERMARK_PREFIX,
    ChunkRows,
    TablePlan,
    chunk_rows,
    watermark_content,
)
from tailrace_services.capture_postgres.connection import connect
from tailrace_services.capture_postgres.reader import Relation, RelationColumn, TypeInfo
from tailrace_services.capture_postgres.schema import choose_key, configured_key

__all__ = ["PostgresChunks"]

_FIRST_USER_OID = 16384
COUNT_BELOW_BYTES = 256 * 1024 * 1024  # an unanalyzed table's rows are counted up to this size
FLUSH_PREFIX = "tailrace-flush"

_COLUMNS = """
SELECT c.oid, c.relreplident::text, a.attname::text, a.atttypid::int, a.atttypmod,
       pg_catalog.format_type(a.atttypid, a.atttypmod), tn.nspname::text, t.typname::text,
       coalesce(a.attnum = ANY(ri.indkey), false), coalesce(a.attnum = ANY(pk.indkey), false),
       c.reltuples::bigint
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                     AND a.attgenerated = ''
  JOIN pg_type t ON t.oid = a.atttypid
  JOIN pg_namespace tn ON tn.oid = t.typnamespace
  LEFT JOIN pg_index pk ON pk.indrelid = c.oid AND pk.indisprimary
  LEFT JOIN pg_index ri ON ri.indrelid = c.oid AND
       CASE WHEN c.relreplident = 'i' THEN ri.indisreplident ELSE ri.indisprimary END
 WHERE n.nspname = %s AND c.relname = %s
 ORDER BY a.attnum"""


def _precedes(xid: int) -> Callable[[str], bool]:
    """Whether a streamed transaction id (32 bits) is older than `xid` (a snapshot's
    `xmin`: no later snapshot can count it as not visible)."""
    low = xid & 0xFFFFFFFF

    def older(tx_id: str) -> bool:
        return ((int(tx_id) - low) & 0xFFFFFFFF) >= 0x80000000

    return older


def _invisible(xmax: int, running: list[int]) -> Callable[[str], bool]:
    """Whether a streamed transaction id (32 bits) was not visible to a snapshot: listed as
    running, or at or past its `xmax`."""
    listed = {str(x & 0xFFFFFFFF) for x in running}
    before_xmax = _precedes(xmax)

    def invisible(tx_id: str) -> bool:
        return tx_id in listed or not before_xmax(tx_id)

    return invisible


class _Table:
    """What reading one table needs: its Relation, key and the SQL types of its columns."""

    def __init__(self, schema: str, name: str, rows: list[tuple[Any, ...]],
                 configured: Mapping[str, Sequence[str]]) -> None:
        self.schema, self.name = schema, name
        types = {r[3]: TypeInfo(r[3], r[6], r[7]) for r in rows if r[3] >= _FIRST_USER_OID}
        self.relation = Relation(
            rows[0][0], schema, name, rows[0][1],
            tuple(RelationColumn(r[2], r[3], r[4], bool(r[8])) for r in rows), types)
        self.sql_types = {r[2]: r[5] for r in rows}
        own = choose_key(self.relation, [r[2] for r in rows if r[9]])
        self.keys = tuple(own or configured_key(self.relation, configured))
        self.keys_unchecked = bool(self.keys) and not own  # from the spec: no constraint
        self.estimate = int(rows[0][10])  # -1: never analyzed
        names = [c.name for c in self.relation.columns]
        self.key_index = tuple(names.index(k) for k in self.keys)  # the merger's key order
        self.bus_index = tuple(sorted(self.key_index))  # `bus_key`: the row's column order


def _repeated(table: _Table, key: list[Any]) -> ConfigError:
    return ConfigError(
        f"spec.source.snapshot.key_columns: {table.schema}.{table.name} has two rows with "
        f"{', '.join(table.keys)} = {', '.join(map(str, key))}; give columns that are unique "
        "(and not null)")


class PostgresChunks:
    """`ChunkSource` for PostgreSQL (module docstring); one connection, used by the
    snapshot worker's thread only."""

    visible_after_streamed = True

    def __init__(self, dsn: str, source_id: str, tenant: str, database: str,
                 key_columns: Mapping[str, Sequence[str]] | None = None) -> None:
        self.dsn = dsn
        self.configured = key_columns or {}  # `snapshot.key_columns`
        self.source_id = source_id
        self.tenant = tenant
        self.database = database
        self._conn: psycopg.Connection[Any] | None = None
        self._tables: dict[str, _Table] = {}

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.dsn, pinned=True)  # text as pgoutput prints it
        return self._conn

    def _table(self, table: str) -> _Table:
        found = self._tables.get(table)
        if found is None:
            schema, _, name = table.partition(".")
            rows = self._connection().execute(_COLUMNS, (schema, name)).fetchall()
            if not rows:
                raise ConfigError(f"table {table} does not exist (any more)")
            found = self._tables[table] = _Table(schema, name, rows, self.configured)
        return found

    def key_columns(self, table: str) -> tuple[str, ...]:
        return self._table(table).keys

    def plan(self, table: str) -> TablePlan:
        self._tables.pop(table, None)  # the catalog as it is now
        found = self._table(table)
        if not found.keys:
            raise ConfigError(f"{table} has no primary key (or replica identity index) to read "
                              "it in chunks by: add one, or give its columns in "
                              "spec.source.snapshot.key_columns (with REPLICA IDENTITY FULL)")
        estimate = found.estimate
        if estimate < 0:  # never analyzed: count, unless that would take long
            query = sql.SQL("SELECT CASE WHEN pg_relation_size({oid}) < {limit} THEN "
                            "(SELECT count(*) FROM {schema}.{name}) ELSE "
                            "pg_relation_size({oid}) / 100 END").format(
                oid=sql.Literal(found.relation.oid), limit=sql.Literal(COUNT_BELOW_BYTES),
                schema=sql.Identifier(found.schema), name=sql.Identifier(found.name))
            row = self._connection().execute(query).fetchone()
            estimate = int(row[0]) if row else 0
        return TablePlan(table, found.keys, estimate)

    def cleared(self, plan: TablePlan) -> ChangeEvent:
        table = self._table(plan.table)
        return ChangeEvent(source_id=self.source_id, tenant=self.tenant, database=self.database,
                           schema=table.schema, table=table.name, op=Op.OP_TRUNCATE,
                           key_columns=table.keys)

    def begin_table(self, plan: TablePlan) -> None:
        """Nothing to prepare: the merger knows which transactions it streamed before it
        recorded the table (`SnapshotMerger._start_recording`)."""

    def _key_bound(self, table: _Table, op: str, bound: list[str]) -> sql.Composable:
        """`(key) <op> (bound)`, the bound as the key columns' text cast to their types."""
        return sql.SQL("({}) {} ({})").format(
            sql.SQL(", ").join(sql.Identifier(k) for k in table.keys), sql.SQL(op),
            sql.SQL(", ").join(sql.SQL("%s::{}").format(sql.SQL(table.sql_types[k]))
                               for k in table.keys))

    def _conditions(self, table: _Table, after: list[str] | None, upto: list[str] | None,
                    where: str) -> tuple[sql.Composable, list[Any]]:
        conditions: list[sql.Composable] = []
        params: list[Any] = []
        if after is not None:
            conditions.append(self._key_bound(table, ">", after))
            params.extend(after)
        if upto is not None:
            conditions.append(self._key_bound(table, "<=", upto))
            params.extend(upto)
        if where:
            conditions.append(sql.SQL("({})").format(sql.SQL(where)))  # noqa: S608 - an admin's filter, parsed by control
        if not conditions:
            return sql.SQL(""), params
        return sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(conditions)), params

    def boundary(self, plan: TablePlan, after: list[str] | None, size: int, where: str
                 ) -> list[str] | None:
        table = self._table(plan.table)
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in table.keys)
        condition, params = self._conditions(table, after, None, where)
        query = sql.SQL("SELECT {keys} FROM {schema}.{name}{condition} ORDER BY {keys} "
                        "OFFSET {skip} LIMIT 2").format(
            keys=keys, schema=sql.Identifier(table.schema), name=sql.Identifier(table.name),
            condition=condition, skip=sql.Literal(size - 1))
        reader = self._connection().cursor()
        for column in table.relation.columns:  # the server's text, as `read_chunk`'s cursor
            reader.adapters.register_loader(column.type_oid, TextLoader)
        rows = reader.execute(query, params).fetchall()
        if len(rows) < 2:  # at most `size` rows left: the last range
            return None
        # (two rows with one given key both fall in this range: `_check_unique` sees them)
        return [str(v) for v in rows[0]]

    def read_chunk(self, plan: TablePlan, after: list[str] | None, limit: int, where: str,
                   token: str, upto: list[str] | None = None) -> ChunkRows:
        table = self._table(plan.table)
        conn = self._connection()
        columns = table.relation.columns
        reader = conn.cursor()
        for column in columns:  # the server's text for every column, as pgoutput sends it
            reader.adapters.register_loader(column.type_oid, TextLoader)
        keys = [sql.Identifier(k) for k in table.keys]
        condition, params = self._conditions(table, after, upto, where)
        query = sql.SQL("SELECT {} FROM {}.{}{} ORDER BY {}").format(
            sql.SQL(", ").join(sql.Identifier(c.name) for c in columns),
            sql.Identifier(table.schema), sql.Identifier(table.name), condition,
            sql.SQL(", ").join(keys))
        if upto is None:  # one more: is it the end?
            query = sql.SQL("{} LIMIT {}").format(query, sql.Literal(limit + 1))
        conn.execute("SELECT pg_logical_emit_message(false, %s, %s)",
                     (WATERMARK_PREFIX, watermark_content(token, high=False)))
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        try:
            snapshot = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
            assert snapshot is not None
            raw_rows = reader.execute(query, params).fetchall()
            more = upto is not None or len(raw_rows) > limit
            if table.keys_unchecked:
                self._check_unique(table, raw_rows)
            if upto is None:
                del raw_rows[limit:]
            xmin, xmax, xip = snapshot[0].split(":")
            running = [int(x) for x in xip.split(",") if x]
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        template = ChangeEvent(source_id=self.source_id, tenant=self.tenant,
                               database=self.database, schema=table.schema, table=table.name,
                               op=Op.OP_SNAPSHOT_READ, key_columns=table.keys)
        head = bus_key_of(self.database, table.schema, table.name, [])
        relation = table.relation
        rows = chunk_rows(raw_rows, relation.kinds, relation.encoders, relation.prefixes,
                          table.key_index, table.bus_index, head)
        cursor = [raw_rows[-1][i] for i in table.key_index] if raw_rows else None
        return ChunkRows(template, rows, cursor, more,
                         hidden=_invisible(int(xmax), running),
                         forgettable=_precedes(int(xmin)))

    @staticmethod
    def _check_unique(table: _Table, raw_rows: list[tuple[Any, ...]]) -> None:
        """A key from `snapshot.key_columns` has no constraint behind it: two rows with the
        same key would be one to the merger, or split by a chunk boundary (the next chunk
        starts after the key). Sorted rows put such rows side by side, here or across the
        boundary (the extra row read to tell whether more follow; a range ends at a key, and
        every row with that key is in it)."""
        columns = [c.name for c in table.relation.columns]
        index = [columns.index(k) for k in table.keys]
        previous = None
        for raw in raw_rows:
            key = [raw[i] for i in index]
            if key == previous:
                raise _repeated(table, key)
            previous = key

    def write_high(self, token: str) -> None:
        conn = self._connection()
        conn.execute("SELECT pg_logical_emit_message(false, %s, %s)",
                     (WATERMARK_PREFIX, watermark_content(token, high=True)))
        # A non-transactional message waits in the WAL buffers for the WAL writer (up to
        # wal_writer_delay, 200 ms) before the walsender sends it; PostgreSQL 17 has a
        # `flush` argument, before it a transaction that wrote WAL flushes at commit.
        # The stream ignores transactional messages (only the `tailrace` non-transactional
        # ones are watermarks), and the empty transaction with them.
        with conn.transaction():
            # flushed here, whatever the role's default; not waiting for a synchronous standby
            conn.execute("SET LOCAL synchronous_commit = local")
            conn.execute("SELECT pg_logical_emit_message(true, %s, '')", (FLUSH_PREFIX,))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
