"""Bus codec: every record on the internal topic is a serialized `BusRecord`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from tailrace.events._values import json_of
from tailrace.events._wire import cwire, length_prefixed
from tailrace.proto.event_pb2 import (
    BusRecord,
    BusRecords,
    ChangeEvent,
    Column,
    EpochMarker,
    Op,
    Row,
    Value,
)

try:  # the sinks' JSON in C (setup.py builds `_cjson`); the Python here is the reference
    from tailrace.events import _cjson as cjson
except ImportError:  # not built (no compiler): the same bytes, slower
    cjson = None  # type: ignore[assignment]

JSON_ACCELERATED = cjson is not None  # delivery logs which one it runs


def encode_event(event: ChangeEvent) -> bytes:
    """`BusRecord(event=event)` serialized, framed by hand (field 1, length-delimited) to
    avoid copying the event into a wrapper message."""
    return length_prefixed(1, event.SerializeToString())


def encode_epoch(marker: EpochMarker) -> bytes:
    return BusRecord(epoch=marker).SerializeToString()


def decode_record(data: bytes) -> BusRecord:
    return BusRecord.FromString(data)


# A record's first byte, as `decode_records` checks it: field 1 or 2, length-delimited.
EVENT_RECORD_HEAD, EPOCH_RECORD_HEAD = 0x0A, 0x12


def decode_records(values: Sequence[bytes]) -> BusRecords | None:
    """Records read together, parsed in one call: their events and their epoch markers,
    each in bus order. Records one after the other are a `BusRecords` message, its events
    in one arena: ~1 µs and ~1 KB an event, against ~2.6 µs and ~2.7 KB parsed one by one.

    None when a record is not one event or one marker (none that capture writes): each must
    begin with one of the two fields, and as many of each must come out as began. (A
    record's own length prefix is trusted, as capture wrote it and the bus checksummed it:
    one that ran into the next record would have to end on a field's boundary, and leave
    the counts as they were, to pass.) The caller parses those records one by one."""
    try:
        heads = bytes(map(itemgetter(0), values))  # (in C: this runs a record at a time)
    except IndexError:  # an empty record
        return None
    events, epochs = heads.count(EVENT_RECORD_HEAD), heads.count(EPOCH_RECORD_HEAD)
    if events + epochs != len(values):
        return None
    records = BusRecords.FromString(b"".join(values))
    return records if (len(records.event), len(records.epoch)) == (events, epochs) else None


_KEY_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def key_values(event: ChangeEvent) -> list[Column]:
    """The key columns of the row the event is about: the old row's for updates and deletes
    (a key change is keyed by the old key), the new row's for inserts and snapshot reads.
    Empty when the table has no key."""
    row = event.after if event.op in (Op.OP_INSERT, Op.OP_SNAPSHOT_READ) else event.before
    if not event.key_columns or not row.columns:
        row = event.after if event.after.columns else event.before
    keys = set(event.key_columns)
    return [c for c in row.columns if c.name in keys]


def key_bytes(event: ChangeEvent) -> bytes:
    """The message key for sinks: the table and primary-key values as compact JSON (a table
    without a key: the table alone, so its messages still share one partition)."""
    return _key_json(event, event.SerializeToString() if cjson is not None else b"")


def _key_json(event: ChangeEvent, data: bytes) -> bytes:
    """`key_bytes` from the event's serialized bytes `data` (unused without `_cjson`)."""
    if cjson is not None:  # from the event's bytes, no dict per event
        key = cjson.key_json(data, _key_value_json)
        if key is not None:
            return key
    return _py_key_bytes(event)


def _py_key_bytes(event: ChangeEvent) -> bytes:
    """`key_bytes` in Python: the reference of `_cjson.key_json` (tests/unit/test_cjson.py)."""
    values = {c.name: json_of(c.value) for c in key_values(event)}
    table = f"{event.database}.{event.schema + '.' if event.schema else ''}{event.table}"
    return _KEY_JSON.encode({"pk": values, "table": table}).encode()


def bus_key(event: ChangeEvent) -> bytes:
    """The internal bus key: table and the serialized primary-key values. Cheaper than
    `key_bytes` (no JSON) and equally stable: one row always maps to the same key."""
    if cwire is not None:  # from the row's bytes: no message object per column
        key = cwire.row_key(f"{event.database}.{event.schema}.{event.table}".encode(),
                            _key_row(event).SerializeToString(), event.key_columns)
        if key is not None:
            return key
    return _py_bus_key(event)


def rows_bus_key(head: bytes, op: int, before: bytes | None, after: bytes | None,
                 key_columns: Sequence[str]) -> bytes:
    """`bus_key` of an event from its parts: `head` is `{database}.{schema}.{table}`
    encoded, the rows serialized (None: no row). For a feed that keeps its changes as
    bytes (`tailrace_services.capture.changes`)."""
    row = after if op in _AFTER_FIRST else before
    if not row:
        row = after or before or b""
    if cwire is not None:
        key = cwire.row_key(head, row, key_columns)
        if key is not None:
            return key
    return _py_row_key(head, Row.FromString(row), key_columns)


def _py_bus_key(event: ChangeEvent) -> bytes:
    """`bus_key` in Python: the reference of `_cwire.row_key` (tests/unit/test_wire.py)."""
    return _py_row_key(f"{event.database}.{event.schema}.{event.table}".encode(),
                       _key_row(event), event.key_columns)


def _py_row_key(head: bytes, row: Row, key_columns: Sequence[str]) -> bytes:
    """`head` and the serialized values of the row's key columns, in the row's order."""
    keys = set(key_columns)
    return b"\x00".join([head, *(c.value.SerializeToString() for c in row.columns
                                 if c.name in keys)])


_AFTER_FIRST = (Op.OP_INSERT, Op.OP_SNAPSHOT_READ)  # keyed by the new row; the rest by the old


def _key_row(event: ChangeEvent) -> Row:
    row = event.after if event.op in _AFTER_FIRST else event.before
    return row if row.columns else (event.after if event.after.columns else event.before)


def bus_key_of(database: str, schema: str, table: str, key_values: list[bytes]) -> bytes:
    """`bus_key` from its parts: the serialized values of the key columns, in the row's
    column order."""
    return b"\x00".join([f"{database}.{schema}.{table}".encode(), *key_values])


def event_json(event: ChangeEvent) -> bytes:
    """The native JSON envelope (`event_to_json_dict`), compact and UTF-8: what sinks write."""
    return _event_json(event, event.SerializeToString() if cjson is not None else b"")


def _event_json(event: ChangeEvent, data: bytes) -> bytes:
    """`event_json` from the event's serialized bytes `data` (unused without `_cjson`)."""
    if cjson is not None:  # from the event's bytes, no dict per event
        document = cjson.event_json(data, _value_json)
        if document is not None:
            return document
    return _py_event_json(event)


def key_and_event_json(event: ChangeEvent) -> tuple[bytes, bytes]:
    """`key_bytes` and `event_json` of one event, from one serialization of it (each alone
    serializes the event again: a sink writing both paid it twice per event)."""
    data = event.SerializeToString() if cjson is not None else b""
    return _key_json(event, data), _event_json(event, data)


def xadd_commands(events: Sequence[ChangeEvent], streams: Sequence[str],
                  trim: tuple[bytes, ...]) -> bytes | None:
    """`XADD stream [trim...] * id .. op .. key .. idempotency_key .. event ..` of each event
    with the native envelope, packed as RESP in one C call (the Redis sink's fields); None
    without `_cjson`, or when an event is one whose JSON Python must write: the caller
    packs its own commands then."""
    if cjson is None:
        return None
    return cjson.redis_xadds([e.SerializeToString() for e in events],
                             [s.encode() for s in streams], trim, _value_json, _key_value_json)


KafkaRecord = tuple[bytes, bytes, list[tuple[str, bytes]], int]


def kafka_records(events: Sequence[ChangeEvent], content_type: bytes
                  ) -> list[KafkaRecord | None] | None:
    """Each event's one Kafka message with the native envelope, made in one C call: (key,
    value, headers, size), as the Kafka sink makes it in Python (`record_headers`,
    `Message.size`). None for an event the sink's Python must make (an outbox message, a
    value `_cjson` leaves to Python); None for all without `_cjson`."""
    if cjson is None:
        return None
    return cjson.kafka_records([e.SerializeToString() for e in events], content_type,
                               _value_json, _key_value_json)


def _py_event_json(event: ChangeEvent) -> bytes:
    """`event_json` in Python: the reference of `_cjson.event_json` (tests/unit/test_cjson.py)."""
    return _dumps(event_to_json_dict(event)).encode()


def _dumps(document: Any) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


def _value_json(value: bytes) -> str:
    """One serialized `Value` as the native envelope spells it: for the values `_cjson`
    leaves to Python (JSON documents, arrays, out-of-range dates, ...)."""
    return _dumps(json_of(Value.FromString(value)))


def _key_value_json(value: bytes) -> str:
    return _KEY_JSON.encode(json_of(Value.FromString(value)))


def row_to_dict(row: Row) -> dict[str, Any] | None:
    if not row.columns:
        return None
    return {c.name: json_of(c.value) for c in row.columns}


_OP_NAMES: dict[int, str] = {
    Op.OP_INSERT: "insert",
    Op.OP_UPDATE: "update",
    Op.OP_DELETE: "delete",
    Op.OP_DDL: "ddl",
    Op.OP_TRUNCATE: "truncate",
    Op.OP_SNAPSHOT_READ: "read",
}


def op_name(op: int) -> str:
    return _OP_NAMES.get(op, "unknown")


def event_to_json_dict(event: ChangeEvent) -> dict[str, Any]:
    """The native JSON envelope."""
    pos = event.position
    native = pos.WhichOneof("native")
    position: dict[str, Any] = {"tx_seq": pos.tx_seq, "event_index": pos.event_index}
    if native == "postgres":
        position.update(
            commit_lsn=pos.postgres.commit_lsn, event_lsn=pos.postgres.event_lsn,
            timeline=pos.postgres.timeline,
        )
    elif native == "mysql":
        position.update(
            gtid=pos.mysql.gtid, gtid_set=pos.mysql.gtid_set, file=pos.mysql.file,
            offset=pos.mysql.offset, server_id=pos.mysql.server_id,
        )
    return {
        "id": event.id,
        "source_id": event.source_id,
        "tenant": event.tenant,
        "database": event.database,
        "schema": event.schema or None,
        "table": event.table,
        "op": op_name(event.op),
        "before": row_to_dict(event.before),
        "after": row_to_dict(event.after),
        "key_columns": list(event.key_columns),
        "ddl": event.ddl or None,
        "tx": {"id": event.tx_id, "index": event.tx_index, "size": event.tx_size,
               "end": event.tx_end},
        "position": position,
        "schema_version": event.schema_version,
        "ts_source_us": event.ts_source_micros,
        "ts_captured_us": event.ts_captured_micros,
        "idempotency_key": event.idempotency_key,
        # snapshot reads: which read of the table and chunk; `last` on the table's last one
        "snapshot": ({"request_id": event.snapshot.request_id, "chunk": event.snapshot.chunk,
                      "last": event.snapshot.last}
                     if event.op == Op.OP_SNAPSHOT_READ else None),
    }
