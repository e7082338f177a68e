"""PostgreSQL sink (psycopg 3): a replica of the source tables, exactly-once.

Each write is one database transaction (`exactly_once.ExactlyOnceSink` owns the steps):
1. lock this sink's row in `tailrace_checkpoints` (created if missing) and read the
   stored position; drop the events at or before it (a replayed batch);
2. apply the rest in order, consecutive rows of one table and shape in one
   `executemany`: inserts/updates/snapshot reads as `INSERT … ON CONFLICT (pk) DO
   UPDATE`, deletes by primary key, truncates as `TRUNCATE`; a changed key deletes the
   old row, or moves it (`UPDATE … SET pk`) when the source left values unsent
   (unchanged TOAST) that only the old row holds; a missing table is
   created; columns the table lacks are added with `follow_ddl: true`, else the
   write fails and says so;
3. store the batch's position in the checkpoint row and commit.
The checkpoint row's `sink_id` is `{id}#rewind{n}` after an operator's rewind (see
`_common.stored_sink_id`), so a rewound sink does not skip what it had.
The rows and the checkpoint commit together or not at all, so a crash or a retry
never applies a batch twice; the row lock serialises two writers of one sink.
Values a PostgreSQL source did not send (unchanged TOAST) keep the target's value.

Rows are found by the event's key columns (the source's primary key). A table without
one (no primary key, REPLICA IDENTITY FULL or NOTHING) is created without a primary key
and its inserts are applied; its updates and deletes cannot be, and fail alone as a
`PerEventError` naming the table and the fix (dead-lettered with the journal on, else
the pipeline stops), before anything of the batch is written. Rows the target refuses
for their values (a CHECK, NOT NULL or foreign key, a value out of range: SQLSTATE classes
22 and 23) fail alone the same way: the batch is applied in a savepoint, and when that
fails for such a reason each event is tried in a savepoint of its own to name them; the
transaction is rolled back, and the rest is written again without them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import groupby
from typing import Any

import psycopg
from psycopg import sql

from tailrace.config import PostgresSinkSpec
from tailrace.errors import NonRetryableError, RetryableError, TailraceError
from tailrace.events import ChangeEvent, Column, Op, Position
from tailrace.logs import get_logger, redact
from tailrace_services.delivery.sinks._common import (
    destination,
    parse_position,
    stored_sink_id,
)
from tailrace_services.delivery.sinks._pg_schema import (
    TableCache,
    parameter,
    source_kind,
)
from tailrace_services.delivery.sinks.base import (
    BatchCommit,
    PerEventError,
    RetryPolicy,
    error_class,
)
from tailrace_services.delivery.sinks.exactly_once import AtomicWrite, ExactlyOnceSink

log = get_logger(__name__)

CHECKPOINT_TABLE = "tailrace_checkpoints"
_CREATE_CHECKPOINTS = f"""
CREATE TABLE IF NOT EXISTS {CHECKPOINT_TABLE} (
    pipeline text NOT NULL,
    sink_id text NOT NULL,
    partition integer NOT NULL DEFAULT 0,
    position bytea,
    tx_seq numeric(20, 0),
    event_index bigint,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, sink_id, partition)
)"""
_LOCK_CHECKPOINT = f"""
INSERT INTO {CHECKPOINT_TABLE} (pipeline, sink_id, partition) VALUES (%s, %s, %s)
ON CONFLICT (pipeline, sink_id, partition) DO UPDATE SET pipeline = EXCLUDED.pipeline
RETURNING position"""
_STORE_CHECKPOINT = f"""
UPDATE {CHECKPOINT_TABLE} SET position = %s, tx_seq = %s, event_index = %s, updated_at = now()
WHERE pipeline = %s AND sink_id = %s AND partition = %s"""

_RETRYABLE_STATES = ("08", "53", "57P01", "57P02", "57P03", "40001", "40P01", "55P03", "58")
_AUTH_TEXT = ("password authentication failed", "no pg_hba.conf entry", "role \"",
              "authentication failed", "database \"")


def refuses_rows(error: BaseException) -> bool:
    """The target refused rows for their values (SQLSTATE classes 22, data exception, and
    23, integrity constraint violation): those rows fail alone, the rest can be written."""
    state = getattr(error, "sqlstate", None) or ""
    return state.startswith(("22", "23"))


def classify_postgres(error: BaseException) -> type[TailraceError]:
    """SQLSTATE classes as Debezium does: communication retryable, auth (28) and the rest not."""
    state = getattr(error, "sqlstate", None)
    if state:
        if state.startswith(_RETRYABLE_STATES):
            return RetryableError
        return NonRetryableError
    if isinstance(error, psycopg.OperationalError):
        text = str(error)
        if any(t in text for t in _AUTH_TEXT):
            return NonRetryableError
        return RetryableError  # refused, reset, timed out, server gone
    if isinstance(error, psycopg.InterfaceError):
        return RetryableError  # the connection is closed
    return error_class(error)


class _Transaction(AtomicWrite):
    """The sink's checkpoint row, locked (created if missing) inside the transaction."""

    def __init__(self, sink: PostgresSink, conn: psycopg.Connection[Any],
                 commit: BatchCommit) -> None:
        self._sink, self._conn = sink, conn
        self._key = [commit.pipeline, stored_sink_id(sink.id, commit.rewind), commit.partition]
        row = conn.execute(_LOCK_CHECKPOINT, self._key).fetchone()
        self.stored = parse_position(row[0] if row else None)

    def write(self, events: Sequence[ChangeEvent], indexes: list[int],
              commit: BatchCommit) -> None:
        todo = [events[i] for i in indexes]
        try:
            with self._conn.transaction():  # a savepoint: the rows' error leaves it usable
                self._sink.apply(self._conn, todo)
        except psycopg.Error as e:
            if not refuses_rows(e):
                raise
            failures = self._sink.refused(self._conn, todo)
            if not failures:  # no row alone: the batch as a whole
                raise
            raise PerEventError(
                f"postgres sink {self._sink.id}: the target refused {len(failures)} row(s); first: "
                f"{failures[0][1]}", [(indexes[i], reason) for i, reason in failures]) from None
        p = commit.position
        self._conn.execute(_STORE_CHECKPOINT, [p.SerializeToString(), p.tx_seq, p.event_index,
                                               *self._key])


class PostgresSink(ExactlyOnceSink):
    retry = RetryPolicy(base_s=0.1, max_s=10.0, attempts=3)

    def __init__(self, spec: PostgresSinkSpec, *, pipeline: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.id = spec.id
        self.required = spec.required
        self.pipeline = pipeline
        self._spec = spec
        self._timeout_s = timeout_s
        self.follow_ddl = spec.follow_ddl
        self._conn: psycopg.Connection[Any] | None = None
        self._tables = TableCache()
        self._sql: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], str] = {}

    # -- lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        if self._conn is not None and not self._conn.closed:
            return
        try:
            conn = psycopg.connect(self._spec.dsn.get_secret_value(),
                                   connect_timeout=max(int(self._timeout_s), 2),
                                   application_name=f"tailrace-sink-{self.id}", autocommit=True)
            conn.execute("SET TIME ZONE 'UTC'")
            conn.execute(_CREATE_CHECKPOINTS)
        except Exception as e:
            raise self._error("cannot connect", e) from None
        self._conn = conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._tables.forget()

    # -- writing (exactly_once.ExactlyOnceSink) -----------------------------------------

    def per_event_failures(self, events: Sequence[ChangeEvent]) -> list[tuple[int, str]]:
        return keyless_changes(events)

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        keyless = keyless_changes(events)
        if keyless:  # before anything of the batch is written
            raise PerEventError(f"postgres sink {self.id}: {len(keyless)} update(s) or delete(s) "
                                f"cannot be applied; first: {keyless[0][1]}", keyless)
        super().write(events, commit)

    @contextmanager
    def begin(self, commit: BatchCommit) -> Iterator[AtomicWrite]:
        conn = self._connection()
        with conn.transaction():
            yield _Transaction(self, conn, commit)

    def write_unchecked(self, events: Sequence[ChangeEvent]) -> None:
        conn = self._connection()
        with conn.transaction():
            self.apply(conn, events)

    def write_failed(self, error: Exception, commit: BatchCommit | None) -> Exception:
        self._tables.forget()  # DDL of the failed transaction was rolled back
        if self._conn is not None and (classify_postgres(error) is RetryableError
                                       or self._conn.broken):
            self.close()
        return self._error("write failed", error)

    def _connection(self) -> psycopg.Connection[Any]:
        self.open()
        assert self._conn is not None
        return self._conn

    def apply(self, conn: psycopg.Connection[Any], events: Sequence[ChangeEvent]) -> None:
        """Every event in order, in the transaction open on `conn`."""
        with conn.pipeline(), conn.cursor() as cur:  # one round trip for the batch
            for (kind, name, cols), group in groupby(_statements(events, self._spec.table),
                                                     key=lambda s: s[:3]):
                rows = [s[3] for s in group]
                table = _identifier(name)
                first = rows[0]
                if kind == "truncate":
                    if self._tables.columns(conn, table, name):
                        cur.execute(sql.SQL("TRUNCATE TABLE {}").format(table))
                    continue
                known = self._tables.columns(conn, table, name)
                if not known:
                    if kind in ("delete", "move"):
                        continue  # no row to delete or move in a table that does not exist
                    event = first.event
                    self._tables.create(conn, table, name, list(event.after.columns),
                                        list(event.key_columns), source_kind(event))
                    log.info("target table created", sink=self.id, table=name)
                    if not event.key_columns:
                        log.warning("target table created without a primary key: the source "
                                    "table has none; inserts are applied, its updates and "
                                    "deletes will fail", sink=self.id, table=name,
                                    source_table=_source_table(event))
                    known = self._tables.columns(conn, table, name)
                missing = [c for c in first.columns if c.name not in known]
                if missing:
                    self._add_columns(conn, table, name, missing, first.event)
                statement = self._sql.get((kind, name, cols, first.keys))
                if statement is None:
                    statement = _sql(kind, table, cols, first.keys).as_string(conn)
                    self._sql[(kind, name, cols, first.keys)] = statement
                cur.executemany(statement, [r.params for r in rows])

    def refused(self, conn: psycopg.Connection[Any], events: Sequence[ChangeEvent]
                ) -> list[tuple[int, str]]:
        """(index, reason) of the events the target refuses by their values (a constraint,
        a value out of range: `refuses_rows`), each applied in order in a savepoint of its
        own on `conn`'s transaction; the caller rolls the transaction back."""
        failures = []
        for i, event in enumerate(events):
            try:
                with conn.transaction():
                    self.apply(conn, [event])
            except psycopg.Error as e:
                if not refuses_rows(e):
                    raise
                diag = e.diag
                failures.append((i, redact(
                    f"a row of {_source_table(event)}: {diag.message_primary} ({diag.sqlstate}"
                    + (f", constraint {diag.constraint_name}" if diag.constraint_name else "")
                    + ")")))
        return failures

    def _add_columns(self, conn: psycopg.Connection[Any], table: sql.Composable, name: str,
                     missing: list[Column], event: ChangeEvent) -> None:
        names = ", ".join(c.name for c in missing)
        if not self.follow_ddl:
            raise NonRetryableError(
                f"postgres sink {self.id}: target table {name} has no column(s) {names} "
                f"(seen in {event.database}.{event.table}); add them to the table, or set "
                "follow_ddl: true on the sink to add columns automatically")
        self._tables.add_columns(conn, table, name, missing, source_kind(event))
        log.info("target columns added", sink=self.id, table=name, columns=names)

    def read_checkpoint(self, pipeline: str, partition: int, rewind: int) -> Position | None:
        conn = self._connection()
        try:
            row = conn.execute(
                f"SELECT position FROM {CHECKPOINT_TABLE} WHERE pipeline = %s AND sink_id = %s"
                " AND partition = %s", [pipeline, stored_sink_id(self.id, rewind),
                                        partition]).fetchone()
        except Exception as e:
            self.close()
            raise self._error("cannot read the checkpoint", e) from None
        return parse_position(row[0] if row else None)

    # -- errors ------------------------------------------------------------------------

    def _error(self, what: str, error: BaseException) -> Exception:
        if isinstance(error, TailraceError):
            return error
        text = redact(f"{type(error).__name__}: {error}".strip())
        state = getattr(error, "sqlstate", None) or ""
        if state.startswith("28") or (isinstance(error, psycopg.OperationalError) and any(
                t in text for t in _AUTH_TEXT[:3])):
            return NonRetryableError(
                f"postgres sink {self.id}: authentication failed ({text}); check the user and "
                "password in spec.sinks[].dsn")
        if state == "42P10":
            return NonRetryableError(
                f"postgres sink {self.id}: {text}; the target table needs a primary key or "
                "unique index on the source's key columns")
        if classify_postgres(error) is RetryableError:
            return RetryableError(f"postgres sink {self.id}: {what}: {text}")
        return NonRetryableError(f"postgres sink {self.id}: {what}: {text}")


# -- statements --------------------------------------------------------------------------

def _source_table(event: ChangeEvent) -> str:
    return ".".join(p for p in (event.database, event.schema, event.table) if p)


def keyless_changes(events: Sequence[ChangeEvent]) -> list[tuple[int, str]]:
    """(index, reason) of the updates and deletes that carry no key columns: no target row
    can be found for them."""
    out = []
    for i, event in enumerate(events):
        if not event.key_columns and event.op in (Op.OP_UPDATE, Op.OP_DELETE):
            table = f"{event.schema}.{event.table}" if event.schema else event.table
            op = "update" if event.op == Op.OP_UPDATE else "delete"
            out.append((i, f"{op} of a row of {_source_table(event)} without key columns (the "
                           "source table has no primary key, so no target row can be found); "
                           f"add a primary key to {table}, or ALTER TABLE {table} REPLICA "
                           "IDENTITY USING INDEX <a unique index on NOT NULL columns>"))
    return out


class _Row:
    """One statement's parameters, with the event it came from."""

    __slots__ = ("columns", "event", "keys", "params")

    def __init__(self, event: ChangeEvent, columns: list[Column], keys: tuple[str, ...]) -> None:
        self.event, self.columns, self.keys = event, columns, keys
        self.params = [parameter(c.value) for c in columns]


def _identifier(name: str) -> sql.Composable:
    return sql.Identifier(*name.split(".", 1))


def _statements(events: Sequence[ChangeEvent], template: str
                ) -> Iterator[tuple[str, str, tuple[str, ...], _Row]]:
    """(kind, table, column names, row) per statement, in event order."""
    for event in events:
        name = destination(template, event)
        keys = tuple(event.key_columns)
        if event.op == Op.OP_TRUNCATE:
            yield "truncate", name, (), _Row(event, [], keys)
        elif event.op == Op.OP_DELETE:
            row = event.before if event.before.columns else event.after
            cols = [c for c in row.columns if c.name in keys]
            yield "delete", name, tuple(c.name for c in cols), _Row(event, cols, keys)
        elif event.op in (Op.OP_INSERT, Op.OP_UPDATE, Op.OP_SNAPSHOT_READ):
            old = {c.name: c.value for c in event.before.columns if c.name in keys}
            new_key = [c for c in event.after.columns if c.name in keys]
            cols = [c for c in event.after.columns
                    if c.value.WhichOneof("kind") != "unchanged_toast"]
            if old and any(old.get(c.name) != c.value for c in new_key):  # the key changed
                old_cols = [c for c in event.before.columns if c.name in keys]
                if len(cols) < len(event.after.columns):
                    # Values the source did not send live only in the old row: move it
                    # to the new key, then the upsert sets what was sent.
                    yield ("move", name, tuple(c.name for c in new_key),
                           _Row(event, new_key + old_cols, keys))
                else:
                    yield ("delete", name, tuple(c.name for c in old_cols),
                           _Row(event, old_cols, keys))
            yield "upsert", name, tuple(c.name for c in cols), _Row(event, cols, keys)
        # DDL events: the source's dialect is not replayed; added columns are followed
        # from the rows (follow_ddl)


def _sql(kind: str, table: sql.Composable, cols: tuple[str, ...], keys: tuple[str, ...]
         ) -> sql.Composed:
    if kind in ("delete", "move"):
        where = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in cols)
        if kind == "delete":
            return sql.SQL("DELETE FROM {} WHERE {}").format(table, where)
        # parameters: the new key, then the old one
        to = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in cols)
        return sql.SQL("UPDATE {} SET {} WHERE {}").format(table, to, where)
    names = sql.SQL(", ").join(map(sql.Identifier, cols))
    values = sql.SQL(", ").join(sql.Placeholder() * len(cols))
    insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(table, names, values)
    if not keys:
        return insert
    updates = [sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in cols
               if c not in keys]
    conflict = sql.SQL(", ").join(map(sql.Identifier, keys))
    if not updates:
        return sql.SQL("{} ON CONFLICT ({}) DO NOTHING").format(insert, conflict)
    return sql.SQL("{} ON CONFLICT ({}) DO UPDATE SET {}").format(
        insert, conflict, sql.SQL(", ").join(updates))
