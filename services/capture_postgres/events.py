"""Decoded pgoutput changes -> `ChangeEvent`s, with schema versions and deterministic ids.

Before-images: with `REPLICA IDENTITY FULL` the server sends the whole old row of
an update or delete, and `before` has every column; otherwise (DEFAULT, USING
INDEX) it sends only the key columns — for an update only when the key changed —
and `before` holds just the key columns (taken from the new row when the server
sent no old one). A column the server did not send because its TOASTed value did
not change carries `unchanged_toast`, never NULL.
"""

from __future__ import annotations

import time
from typing import Any

from tailrace.events import (
    ChangeEvent,
    Op,
    Row,
    idempotency_key,
    value_of,
)
from tailrace.events import event_id as make_event_id
from tailrace_services.capture_postgres.decoder import Delete, Insert, Relation, Update
from tailrace_services.capture_postgres.position import Timelines

__all__ = ["EventFactory", "fill_row", "key_columns", "make_row"]

_INSERT, _UPDATE, _DELETE, _TRUNCATE = Op.OP_INSERT, Op.OP_UPDATE, Op.OP_DELETE, Op.OP_TRUNCATE


def key_columns(relation: Relation) -> list[str]:
    keys = [c.name for c in relation.columns if c.is_key]
    return keys or [c.name for c in relation.columns]


def make_row(relation: Relation, values: list[Any] | None, only: set[str] | None = None) -> Row:
    row = Row()
    if values is not None:
        fill_row(row, relation, values, only)
    return row


def fill_row(row: Row, relation: Relation, values: list[Any], only: set[str] | None = None
             ) -> None:
    """Append the columns (all, or those named in `only`) to `row` in place."""
    add = row.columns.add
    for col, type_name, value in zip(relation.columns, relation.type_names, values, strict=True):
        if only is None or col.name in only:
            add(name=col.name, type=type_name, value=value_of(value))


class EventFactory:
    """Builds the events of one transaction; ids and positions stamped when the commit is known."""

    def __init__(self, source_id: str, tenant: str, database: str, timelines: Timelines) -> None:
        self.source_id = source_id
        self.tenant = tenant
        self.database = database
        self.timelines = timelines
        self._keys: dict[int, tuple[Relation, list[str], set[str]]] = {}

    def _key_columns(self, relation: Relation) -> tuple[list[str], set[str]]:
        cached = self._keys.get(relation.oid)
        if cached is None or cached[0] is not relation:
            keys = key_columns(relation)
            cached = (relation, keys, set(keys))
            self._keys[relation.oid] = cached
        return cached[1], cached[2]

    def from_change(self, msg: Insert | Update | Delete, event_lsn: int,
                    schema: tuple[str, int]) -> ChangeEvent:
        rel = msg.relation
        keys, key_set = self._key_columns(rel)
        if isinstance(msg, Insert):
            event = self.change(rel, _INSERT, None, None, event_lsn, schema, keys)
            fill_row(event.after, rel, msg.new)
        elif isinstance(msg, Update):
            event = self.change(rel, _UPDATE, None, None, event_lsn, schema, keys)
            self._before(event.before, rel, msg.old, msg.new, msg.old_is_key_only, key_set)
            fill_row(event.after, rel, msg.new)
        else:
            event = self.change(rel, _DELETE, None, None, event_lsn, schema, keys)
            self._before(event.before, rel, msg.old, None, msg.old_is_key_only, key_set)
        return event

    @staticmethod
    def _before(row: Row, relation: Relation, old: list[Any] | None, new: list[Any] | None,
                key_only: bool, keys: set[str]) -> None:
        """Full before-image with REPLICA IDENTITY FULL, key columns otherwise."""
        if old is not None:
            fill_row(row, relation, old, keys if key_only else None)
        elif new is not None:
            fill_row(row, relation, new, keys)

    def change(self, relation: Relation, op: int, before: Row | None, after: Row | None,
               event_lsn: int, schema: tuple[str, int] = ("", 0), keys: list[str] | None = None
               ) -> ChangeEvent:
        event = ChangeEvent(
            source_id=self.source_id, tenant=self.tenant, database=self.database,
            schema=relation.namespace, table=relation.name, op=op, before=before, after=after,
            key_columns=keys if keys is not None else self._key_columns(relation)[0],
            schema_version=schema[0], schema_sequence=schema[1])
        postgres = event.position.postgres
        postgres.event_lsn = event_lsn
        postgres.timeline = self.timelines.of(event_lsn)
        return event

    def truncate(self, relation: Relation, event_lsn: int, schema: tuple[str, int] = ("", 0)
                 ) -> ChangeEvent:
        return self.change(relation, _TRUNCATE, None, None, event_lsn, schema)

    def stamp(self, event: ChangeEvent, *, xid: int, tx_seq: int, end_lsn: int,
              commit_ts_us: int, index: int, size: int) -> ChangeEvent:
        """Fill the transaction fields once the commit is known (`tx_seq`: see position.py).

        The id depends only on the source id, `tx_seq` and the index, so a transaction
        re-read after a restart gets the same ids.
        """
        event.tx_id = str(xid)
        event.tx_index = index
        event.tx_size = size
        event.tx_end = index == size - 1
        position = event.position
        position.tx_seq = tx_seq
        position.event_index = index
        position.postgres.commit_lsn = end_lsn
        event.ts_source_micros = commit_ts_us
        event.ts_captured_micros = time.time_ns() // 1000
        event.id = make_event_id(self.source_id, f"{tx_seq:X}", index, commit_ts_us // 1000)
        event.idempotency_key = idempotency_key(
            self.tenant, self.database,
            f"{event.schema}.{event.table}" if event.schema else event.table, event.tx_id,
            event.id)
        return event
