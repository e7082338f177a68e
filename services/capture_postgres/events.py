"""Decoded pgoutput changes -> `ChangeEvent`s, with schema fingerprints and deterministic ids."""

from __future__ import annotations

import hashlib
import json
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
from tailrace_services.capture_postgres.decoder import Relation


def fingerprint(relation: Relation) -> str:
    """SHA-256 of the table's structure: names, types, modifiers, key flags."""
    shape = {
        "schema": relation.namespace,
        "table": relation.name,
        "columns": [[c.name, c.type_oid, c.type_modifier, c.is_key] for c in relation.columns],
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def key_columns(relation: Relation) -> list[str]:
    keys = [c.name for c in relation.columns if c.is_key]
    return keys or [c.name for c in relation.columns]


def make_row(relation: Relation, values: list[Any] | None, only: set[str] | None = None) -> Row:
    if values is None:
        return Row()
    return Row(columns=[
        Column(name=col.name, type=relation.type_name(i), value=value_of(values[i]))
        for i, col in enumerate(relation.columns)
        if only is None or col.name in only
    ])


class EventFactory:
    """Builds the events of one transaction; ids and positions stamped when the commit is known."""

    def __init__(self, source_id: str, tenant: str, database: str, timeline: int) -> None:
        self.source_id = source_id
        self.tenant = tenant
        self.database = database
        self.timeline = timeline

    def change(self, relation: Relation, op: int, before: Row, after: Row, event_lsn: int
               ) -> ChangeEvent:
        return ChangeEvent(
            source_id=self.source_id, tenant=self.tenant, database=self.database,
            schema=relation.namespace, table=relation.name, op=op, before=before, after=after,
            key_columns=key_columns(relation), schema_version=fingerprint(relation),
            position=Position(postgres=PostgresPosition(event_lsn=event_lsn,
                                                        timeline=self.timeline)),
        )

    def truncate(self, relation: Relation, event_lsn: int) -> ChangeEvent:
        return self.change(relation, Op.OP_TRUNCATE, Row(), Row(), event_lsn)

    def stamp(self, event: ChangeEvent, *, xid: int, end_lsn: int, commit_ts_us: int,
              index: int, size: int) -> ChangeEvent:
        """Fill the transaction fields once the commit is known; tx_seq is the commit's end LSN."""
        event.tx_id = str(xid)
        event.tx_index = index
        event.tx_size = size
        event.tx_end = index == size - 1
        event.position.tx_seq = end_lsn
        event.position.event_index = index
        event.position.postgres.commit_lsn = end_lsn
        event.ts_source_micros = commit_ts_us
        event.ts_captured_micros = int(time.time() * 1_000_000)
        event.id = make_event_id(self.source_id, f"{end_lsn:X}", index, commit_ts_us // 1000)
        event.idempotency_key = idempotency_key(
            self.tenant, self.database,
            f"{event.schema}.{event.table}" if event.schema else event.table, event.tx_id,
            event.id)
        return event
