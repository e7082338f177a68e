"""Outbox rows deleted from the source once delivered (the outbox processor's
`delete_delivered`), so the table stays small without the application deleting them.

A task deletes the rows of the outbox messages it wrote once every sink of its batch
acknowledged them, before the driver commits the batch: a task that dies after the delete
is retried, its sinks skip what they hold, and the delete runs again (it is idempotent).
The messages are on the bus and in the sinks by then, so a deleted row loses nothing; its
delete event is one the outbox router sends nothing for. A delete that fails (a missing
privilege) is logged and the pipeline goes on: the rows stay, nothing is lost.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tailrace.config import OutboxProcessor, PipelineSpec
from tailrace.events import ChangeEvent, json_of
from tailrace.logs import get_logger, redact
from tailrace_services.delivery.processors import table_matches

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

log = get_logger(__name__)

_SAFE_TYPE = re.compile(r"^[a-z][a-z0-9 _(),]*$")  # a column type named in the cast
_CONNECTIONS: dict[str, psycopg.Connection[Any]] = {}  # per worker process, by DSN


def outbox_cleanup(pipeline: PipelineSpec) -> Callable[[Sequence[ChangeEvent]], None] | None:
    """What a task calls with the events its sinks all acknowledged; None when no outbox
    processor deletes its rows."""
    deleting = [p for p in pipeline.spec.processors
                if isinstance(p, OutboxProcessor) and p.delete_delivered]
    if not deleting:
        return None
    dsn = pipeline.spec.source.dsn.get_secret_value()
    return lambda events: _delete(dsn, deleting, events)


def _delete(dsn: str, processors: list[OutboxProcessor], events: Sequence[ChangeEvent]) -> None:
    rows: dict[tuple[str, str, str, str], list[Any]] = {}  # (schema, table, id, type): ids
    for event in events:
        if not event.HasField("outbox"):
            continue
        spec = next((p for p in processors if table_matches([p.table], event)), None)
        column = next((c for c in event.after.columns if spec and c.name == spec.id), None)
        if spec is None or column is None:
            continue
        rows.setdefault((event.schema, event.table, spec.id, column.type), []).append(
            json_of(column.value))
    if not rows:
        return
    import psycopg  # here, not at the top: ~0.2 s to import, and most workers never delete

    try:
        conn = _connection(dsn)
        with conn.transaction():
            for (schema, table, id_column, type_), ids in rows.items():
                conn.execute(_statement(schema, table, id_column, type_), (ids,))
    except psycopg.Error as e:
        _CONNECTIONS.pop(dsn, None)
        log.error("delivered outbox rows not deleted; they stay in the table (nothing is "
                  "lost); grant DELETE on it to the source user, or remove delete_delivered",
                  rows=sum(len(v) for v in rows.values()), error=redact(str(e)))
        return
    log.debug("delivered outbox rows deleted", rows=sum(len(v) for v in rows.values()))


def _statement(schema: str, table: str, id_column: str, type_: str) -> sql.Composed:
    from psycopg import sql

    target = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table)) \
        if schema else sql.Identifier(table)
    if _SAFE_TYPE.match(type_):  # the column's own type: its index is used
        return sql.SQL("DELETE FROM {} WHERE {} = ANY(%s::{}[])").format(
            target, sql.Identifier(id_column), sql.SQL(type_))
    return sql.SQL("DELETE FROM {} WHERE {}::text = ANY(%s::text[])").format(
        target, sql.Identifier(id_column))


def _connection(dsn: str) -> psycopg.Connection[Any]:
    import psycopg

    conn = _CONNECTIONS.get(dsn)
    if conn is None or conn.closed:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        _CONNECTIONS[dsn] = conn
    return conn
