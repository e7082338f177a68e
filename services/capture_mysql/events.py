"""Decoded binlog changes -> `ChangeEvent`s, with schema versions and deterministic ids.

An event's id is `event_id(source_id, gtid, index, commit_ms)`: the same
transaction re-read after a restart, a reconnect or a failover to a replica
(GTIDs are global) gets the same ids and idempotency keys.
"""

from __future__ import annotations

import time

from tailrace.events import ChangeEvent, Op, Position, Row, idempotency_key
from tailrace.events import event_id as make_event_id
from tailrace_services.capture_mysql.position import CapturePosition
from tailrace_services.capture_mysql.schema import TableShape

__all__ = ["EventFactory"]


class EventFactory:
    """Builds the events of one transaction; ids and positions stamped when it committed."""

    def __init__(self, source_id: str, tenant: str) -> None:
        self.source_id = source_id
        self.tenant = tenant

    def change(self, shape: TableShape, sequence: int, op: int, before: Row, after: Row
               ) -> ChangeEvent:
        return ChangeEvent(
            source_id=self.source_id, tenant=self.tenant, database=shape.database,
            table=shape.table, op=op, before=before, after=after,
            key_columns=shape.key_columns, schema_version=shape.fingerprint,
            schema_sequence=sequence)

    def ddl(self, database: str, table: str, query: str, shape: TableShape | None,
            sequence: int) -> ChangeEvent:
        return ChangeEvent(
            source_id=self.source_id, tenant=self.tenant, database=database, table=table,
            op=Op.OP_DDL, ddl=query, schema_version=shape.fingerprint if shape else "",
            schema_sequence=sequence)

    def truncate(self, database: str, table: str, shape: TableShape | None, sequence: int
                 ) -> ChangeEvent:
        return ChangeEvent(
            source_id=self.source_id, tenant=self.tenant, database=database, table=table,
            op=Op.OP_TRUNCATE, key_columns=shape.key_columns if shape else [],
            schema_version=shape.fingerprint if shape else "", schema_sequence=sequence)

    def stamp(self, event: ChangeEvent, position: CapturePosition, *, index: int, size: int,
              commit_ts: int, native: Position | None = None, captured_us: int = 0
              ) -> ChangeEvent:
        """Fill the transaction fields once the commit is known.

        `native` (the position's proto) and `captured_us` may be made once per
        transaction by the caller; the event's own index is set here.
        """
        event.tx_id = position.gtid
        event.tx_index = index
        event.tx_size = size
        event.tx_end = index == size - 1
        event.position.CopyFrom(native if native is not None else position.to_proto())
        event.position.event_index = index
        event.ts_source_micros = commit_ts * 1_000_000
        event.ts_captured_micros = captured_us or int(time.time() * 1_000_000)
        event.id = make_event_id(self.source_id, position.gtid, index, commit_ts * 1000)
        event.idempotency_key = idempotency_key(self.tenant, event.database, event.table,
                                                event.tx_id, event.id)
        return event
