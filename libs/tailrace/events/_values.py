"""Typed column values: Python objects <-> protobuf `Value`, exact for decimals and zones.

Decoders of both sources build values through `value_of`, so a decimal stays
a decimal string and an aware datetime keeps its zone flag all the way to
the sink.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any, Final

from tailrace.proto.event_pb2 import Timestamp, Value, ValueList

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_DATE = dt.date(1970, 1, 1)


class _UnchangedToast:
    """Marker for a PostgreSQL TOAST value the server did not send: unchanged, not NULL."""

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()


class Json(str):
    """Text that is JSON (json/jsonb/MySQL JSON), kept verbatim."""


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def value_of(obj: Any) -> Value:
    """Wrap a decoded Python value; bool before int, Decimal kept as exact text."""
    if obj is None:
        return Value(null=True)
    if obj is UNCHANGED_TOAST:
        return Value(unchanged_toast=True)
    if isinstance(obj, bool):
        return Value(bool_value=obj)
    if isinstance(obj, int):
        return Value(int_value=obj) if obj < (1 << 63) else Value(uint_value=obj)
    if isinstance(obj, float):
        return Value(float_value=obj)
    if isinstance(obj, Decimal):
        return Value(decimal_value=str(obj))
    if isinstance(obj, Json):
        return Value(json_value=str(obj))
    if isinstance(obj, str):
        return Value(text_value=obj)
    if isinstance(obj, bytes | bytearray | memoryview):
        return Value(bytes_value=bytes(obj))
    if isinstance(obj, dt.datetime):
        if obj.tzinfo is not None:
            return Value(timestamp_value=Timestamp(epoch_micros=_micros(obj - _EPOCH), with_zone=True))
        naive = obj.replace(tzinfo=dt.UTC)
        return Value(timestamp_value=Timestamp(epoch_micros=_micros(naive - _EPOCH), with_zone=False))
    if isinstance(obj, dt.date):
        return Value(date_value=(obj - _EPOCH_DATE).days)
    if isinstance(obj, dt.time):
        return Value(
            time_value=((obj.hour * 60 + obj.minute) * 60 + obj.second) * 1_000_000 + obj.microsecond
        )
    if isinstance(obj, dt.timedelta):
        return Value(time_value=_micros(obj))
    if isinstance(obj, uuid.UUID):
        return Value(uuid_value=str(obj))
    if isinstance(obj, list | tuple):
        return Value(array_value=ValueList(items=[value_of(v) for v in obj]))
    if isinstance(obj, dict):
        return Value(json_value=json.dumps(obj, separators=(",", ":"), default=str))
    raise TypeError(f"cannot encode a value of type {type(obj).__name__}: {obj!r}")


def python_of(value: Value) -> Any:
    """The Python object a `Value` stands for (the inverse of `value_of`)."""
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    if kind == "unchanged_toast":
        return UNCHANGED_TOAST
    if kind == "decimal_value":
        return Decimal(value.decimal_value)
    if kind == "json_value":
        return Json(value.json_value)
    if kind == "timestamp_value":
        ts = value.timestamp_value
        moment = _EPOCH + dt.timedelta(microseconds=ts.epoch_micros)
        return moment if ts.with_zone else moment.replace(tzinfo=None)
    if kind == "date_value":
        return _EPOCH_DATE + dt.timedelta(days=value.date_value)
    if kind == "time_value":
        micros = value.time_value
        if 0 <= micros < 86_400_000_000:
            secs, us = divmod(micros, 1_000_000)
            return dt.time(secs // 3600, secs // 60 % 60, secs % 60, us)
        return dt.timedelta(microseconds=micros)
    if kind == "uuid_value":
        return uuid.UUID(value.uuid_value)
    if kind == "array_value":
        return [python_of(v) for v in value.array_value.items]
    return getattr(value, kind)


def json_of(value: Value) -> Any:
    """A JSON-safe form: decimals as strings (exact), timestamps ISO-8601, bytes base64."""
    import base64

    kind = value.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    if kind == "unchanged_toast":
        return {"__unchanged_toast": True}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind == "json_value":
        return json.loads(value.json_value)
    if kind == "array_value":
        return [json_of(v) for v in value.array_value.items]
    obj = python_of(value)
    if isinstance(obj, dt.datetime | dt.date | dt.time):
        return obj.isoformat()
    if isinstance(obj, Decimal | uuid.UUID | dt.timedelta):
        return str(obj)
    return obj
