"""The change event: typed values, deterministic ids, the bus codec and JSON envelopes."""

from tailrace.events._codec import (
    bus_key,
    decode_record,
    encode_epoch,
    encode_event,
    event_json,
    event_to_json_dict,
    key_and_event_json,
    key_bytes,
    key_values,
    rows_bus_key,
)
from tailrace.events._ids import EventIds, event_id, event_ids, idempotency_key
from tailrace.events._positions import lsn_text, native_position, position_key
from tailrace.events._values import UNCHANGED_TOAST, json_of, python_of, value_of
from tailrace.proto.event_pb2 import (
    BusRecord,
    ChangeEvent,
    Column,
    EpochMarker,
    Op,
    Position,
    PostgresPosition,
    Row,
    Value,
)

__all__ = [
    "EventIds",
    "UNCHANGED_TOAST",
    "BusRecord",
    "ChangeEvent",
    "Column",
    "EpochMarker",
    "Op",
    "Position",
    "PostgresPosition",
    "Row",
    "Value",
    "bus_key",
    "decode_record",
    "encode_epoch",
    "encode_event",
    "event_id",
    "event_ids",
    "event_json",
    "event_to_json_dict",
    "idempotency_key",
    "json_of",
    "key_and_event_json",
    "key_bytes",
    "key_values",
    "lsn_text",
    "native_position",
    "position_key",
    "python_of",
    "rows_bus_key",
    "value_of",
]
