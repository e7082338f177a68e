"""A streamed row change kept as the bytes of its bus record until its transaction commits.

A feed yields each row change of an open transaction as a `Change`: the fields every
event of its table and op shares (`template`, serialized once per table), its own
position fields (`at`), its rows and its bus key, all bytes. At the commit,
`ChangeStamp` writes the records in one C call per run of changes
(`_cwire.change_records`): the template, the transaction's fields, the event's id,
index and position, its idempotency key and its rows, framed as a `BusRecord` — no
`ChangeEvent` is built, stamped and serialized again per change (half of the capture
service's time before). Parsed, a record equals the event the source's `stamp` would
give for `change.event()` (tests/unit/test_capture_changes.py holds the C to its
Python twin and to that).

What a feed yields only now and then (TRUNCATE, DDL, a snapshot's reset) stays a
`ChangeEvent` stamped in Python; a transaction may hold both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tailrace.events import ChangeEvent, Position, event_ids, rows_bus_key
from tailrace.events._wire import cwire, length_prefixed, varint

__all__ = ["CHANGE_ITEMS", "Change", "ChangeStamp", "ChangeTemplate"]

_TX_END = b"\x78\x01"  # ChangeEvent.tx_end = true (field 15)


class Change(NamedTuple):
    """One row change of an open transaction, not yet stamped."""

    template: bytes  # the serialized fields of every event of its table and op
    ident: bytes  # b"{tenant}|{database}.{table}|": how its idempotency key starts
    # Position's field of the source's position (0: no per-change part); read by `event()`
    # and the spill file only: the stamp takes it from the transaction's position
    source_field: int
    at: bytes  # that position's fields of this change alone (PostgreSQL: its LSN, timeline)
    rows: bytes  # `before` (8) and `after` (9), serialized as the event's fields
    key: bytes  # its bus key (`tailrace.events.bus_key`)

    def event(self) -> ChangeEvent:
        """The change as an unstamped event (for what must read its rows: the snapshot
        merger while it records a table, tests)."""
        where = length_prefixed(16, length_prefixed(self.source_field, self.at)) \
            if self.source_field else b""
        return ChangeEvent.FromString(self.template + where + self.rows)


CHANGE_ITEMS = (Change, ChangeEvent)
"""What a feed yields per change: a row change as bytes, the rare rest as an event."""


@dataclass(frozen=True, slots=True)
class ChangeTemplate:
    """What every change of one table and op shares: made once per table, by `of`."""

    fields: bytes  # the event's shared fields, serialized
    ident: bytes  # how its idempotency key starts
    head: bytes  # how its bus key starts
    op: int
    key_columns: tuple[str, ...]
    source_field: int  # `Change.source_field`

    @classmethod
    def of(cls, event: ChangeEvent, source_field: int = 0) -> ChangeTemplate:
        """From an event that holds the shared fields only (table, op, keys, schema)."""
        table = f"{event.schema}.{event.table}" if event.schema else event.table
        return cls(event.SerializeToString(),
                   f"{event.tenant}|{event.database}.{table}|".encode(),
                   f"{event.database}.{event.schema}.{event.table}".encode(),
                   event.op, tuple(event.key_columns), source_field)

    def change(self, at: bytes, before: bytes | None, after: bytes | None) -> Change:
        """A change of the table: `at` its own position fields, the rows serialized (None:
        not there; b"": there and empty)."""
        rows = (length_prefixed(8, before) if before is not None else b"") + \
            (length_prefixed(9, after) if after is not None else b"")
        return Change(self.fields, self.ident, self.source_field, at, rows,
                      rows_bus_key(self.head, self.op, before, after, self.key_columns))


class ChangeStamp:
    """Stamps the changes of one committed transaction into bus records: what its source's
    `stamp` sets on an event, written as bytes. `position`: the transaction's (event_index
    0; the source's oneof holds its transaction-wide fields only); `native_tx`: what its
    event ids hash (`event_id`)."""

    def __init__(self, source_id: str, tx_id: str, position: Position, native_tx: str,
                 ts_source_us: int, ts_captured_us: int) -> None:
        if position.WhichOneof("native") is None:
            raise ValueError("a transaction's position names no source position")
        self.source_id, self.tx_id, self.native_tx = source_id, tx_id, native_tx
        self.position = position
        self.ts_source_us, self.ts_captured_us = ts_source_us, ts_captured_us
        # serialized at the first run, for a transaction that has changes (every commit,
        # heartbeats and skipped ones included, makes a ChangeStamp)
        self._parts: tuple[int, bytes, bytes, int, bytes, bytes] | None = None

    def records(self, changes: Sequence[Change], first: int, size: int
                ) -> list[tuple[bytes, bytes]]:
        """(bus key, serialized `BusRecord`) of `changes`, events `first`.. of `size`."""
        if self._parts is None or self._parts[0] != size:
            source = self.position.WhichOneof("native")
            assert source is not None  # checked when made
            self._parts = (size, ChangeEvent(
                tx_id=self.tx_id, tx_size=size, ts_source_micros=self.ts_source_us,
                ts_captured_micros=self.ts_captured_us).SerializeToString(),
                Position(tx_seq=self.position.tx_seq).SerializeToString(),
                self.position.DESCRIPTOR.fields_by_name[source].number,
                getattr(self.position, source).SerializeToString(),
                f"{self.tx_id}|".encode())
        _, head, position, source_field, source_tx, idem_tx = self._parts
        eids = event_ids(self.source_id, self.native_tx, first, len(changes),
                         self.ts_source_us // 1000)
        return change_records(head, position, source_field, source_tx, idem_tx, eids, first,
                              size, changes)


def _py_change_records(head: bytes, position: bytes, source_field: int, source_tx: bytes,
                       idem_tx: bytes, eids: Sequence[str], first: int, size: int,
                       changes: Sequence[Change]) -> list[tuple[bytes, bytes]]:
    """The reference of `_cwire.change_records` (the same bytes)."""
    if len(eids) != len(changes) or first + len(changes) > size:
        raise ValueError("change_records: eids and changes differ in length, or the changes "
                         "go past the transaction's size")
    records: list[tuple[bytes, bytes]] = []
    for offset, (change, eid) in enumerate(zip(changes, eids, strict=True)):
        index = first + offset
        raw_id = eid.encode()
        where = b"".join((position, b"\x10" + varint(index) if index else b"",
                          length_prefixed(source_field, source_tx + change.at)))
        body = b"".join((
            change.template, head,
            length_prefixed(1, raw_id),
            b"\x68" + varint(index) if index else b"",  # tx_index (13)
            _TX_END if index == size - 1 else b"",
            length_prefixed(16, where),
            length_prefixed(21, change.ident + idem_tx + raw_id),
            change.rows,
        ))
        records.append((change.key, length_prefixed(1, body)))  # BusRecord.event
    return records


change_records = cwire.change_records if cwire else _py_change_records
