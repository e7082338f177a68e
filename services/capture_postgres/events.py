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
    Column,
    Op,
    Position,
    PostgresPosition,
    Row,
    idempotency_key,
    value_of,
)
from tailrace.events import event_id as make_event_id
from tailrace_services.capture_postgres.decoder import Delete, Insert, Relation, Update

__all__ = ["EventFactory", "key_columns", "make_row"]


def key_columns(relation: Relation) -> list[str]:
    keys = [c.name for c in relation.columns if c.is_key]
    return keys or [c.name for c in relation.columns]


def make_row(relation: Relation, values: list[Any] | None, only: set[str] | None = None) -> Row:
    if values is None:
        return Row()
    return Row(columns=[
        Column(name=col.name, type=type_name, value=value_of(value))
        for col, type_name, value in zip(relation.columns, relation.type_names, values, strict=True)
        if only is None or col.name in only
    ])


class EventFactory:
    """Builds the events of one transaction; ids and positions stamped when the commit is known."""

    def __init__(self, source_id: str, tenant: str, database: str, timeline: int) -> None:
        self.source_id = source_id
        self.tenant = tenant
        self.database = database
        self.timeline = timeline
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
            return self.change(rel, Op.OP_INSERT, Row(), make_row(rel, msg.new), event_lsn,
                               schema, keys)
        if isinstance(msg, Update):
            before = self._before(rel, msg.old, msg.new, msg.old_is_key_only, key_set)
            return self.change(rel, Op.OP_UPDATE, before, make_row(rel, msg.new), event_lsn,
                               schema, keys)
        before = self._before(rel, msg.old, None, msg.old_is_key_only, key_set)
        return self.change(rel, Op.OP_DELETE, before, Row(), event_lsn, schema, keys)

    @staticmethod
    def _before(relation: Relation, old: list[Any] | None, new: list[Any] | None,
                key_only: bool, keys: set[str]) -> Row:
        """Full before-image with REPLICA IDENTITY FULL, key columns otherwise."""
        if old is not None:
            return make_row(relation, old, keys if key_only else None)
        if new is not None:
            return make_row(relation, new, keys)
        return Row()

    def change(self, relation: Relation, op: int, before: Row, after: Row, event_lsn: int,
               schema: tuple[str, int] = ("", 0), keys: list[str] | None = None) -> ChangeEvent:
        return ChangeEvent(
            source_id=self.source_id, tenant=self.tenant, database=self.database,
            schema=relation.namespace, table=relation.name, op=op, before=before, after=after,
            key_columns=keys if keys is not None else self._key_columns(relation)[0],
            schema_version=schema[0], schema_sequence=schema[1],
            position=Position(postgres=PostgresPosition(event_lsn=event_lsn,
                                                        timeline=self.timeline)),
        )

    def truncate(self, relation: Relation, event_lsn: int, schema: tuple[str, int] = ("", 0)
                 ) -> ChangeEvent:
        return self.change(relation, Op.OP_TRUNCATE, Row(), Row(), event_lsn, schema)

    def stamp(self, event: ChangeEvent, *, xid: int, end_lsn: int, commit_ts_us: int,
              index: int, size: int) -> ChangeEvent:
        """Fill the transaction fields once the commit is known; tx_seq is the commit's end LSN.

        The id depends only on the source id, the commit's end LSN and the index, so a
        transaction re-read after a restart gets the same ids.
        """
        event.tx_id = str(xid)
        event.tx_index = index
        event.tx_size = size
        event.tx_end = index == size - 1
        position = event.position
        position.tx_seq = end_lsn
        position.event_index = index
        position.postgres.commit_lsn = end_lsn
        event.ts_source_micros = commit_ts_us
        event.ts_captured_micros = time.time_ns() // 1000
        event.id = make_event_id(self.source_id, f"{end_lsn:X}", index, commit_ts_us // 1000)
        event.idempotency_key = idempotency_key(
            self.tenant, self.database,
            f"{event.schema}.{event.table}" if event.schema else event.table, event.tx_id,
            event.id)
        return event
