"""Protobuf wire encoding by hand, for the hot paths that build many alike events.

Building a `Row` of upb messages costs a few µs per column; a chunk of a snapshot has
millions of columns. These helpers write the same bytes directly: what they produce for
a `Value` is byte-identical to `Value.SerializeToString()` (the canonical encoding: the
set oneof field only, nested defaults omitted), because keys are compared as serialized
values (`bus_key`, the snapshot merger's `key_of`) — tests/unit/test_wire.py holds them
to it. A message is the concatenation of its fields, in any order, so a whole event is
a per-table prefix plus the few fields that differ.
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from enum import IntEnum
from typing import Any

from tailrace.events._values import Json, value_of

__all__ = [
    "NULL",
    "Kind",
    "column_prefix",
    "cwire",
    "field_bytes",
    "length_prefixed",
    "row_bytes",
    "value_bool",
    "value_bytes",
    "value_bytes_field",
    "value_float",
    "value_int",
    "value_string",
    "value_timestamp",
    "varint",
]

try:  # the hot loops in C (setup.py builds `_cwire`); the Python here is the reference
    from tailrace.events import _cwire as cwire
except ImportError:  # not built (no compiler): the same bytes, slower; capture logs which
    cwire = None  # type: ignore[assignment]

ACCELERATED = cwire is not None


class Kind(IntEnum):
    """What `_cwire.chunk_rows` reads a column's values as (its `enum` K_*): PostgreSQL's
    text of a type, or a Python value (`OBJECT`, as `value_bytes` encodes it); `OTHER`:
    the column's Python encoder decides every value."""

    OTHER = 0
    INT = 1
    BOOL = 2
    TEXT = 3
    JSON = 4
    UUID = 5
    TIMESTAMP = 6
    NUMERIC = 7
    OBJECT = 8

_SMALL = [bytes([n]) for n in range(128)]
_INT64 = (1 << 64) - 1

NULL = b"\x08\x01"  # Value.null = true
_TRUE, _FALSE = b"\x18\x01", b"\x18\x00"  # Value.bool_value


def _py_varint(n: int) -> bytes:
    """An unsigned varint; negative int64/int32 values as their 64-bit two's complement."""
    if 0 <= n < 128:
        return _SMALL[n]
    n &= _INT64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


varint: Callable[[int], bytes] = cwire.varint if cwire else _py_varint


def _py_length_prefixed(tag: int, data: bytes) -> bytes:
    """Field `tag` (wire type 2) holding `data`."""
    size = len(data)
    return (_SMALL[tag << 3 | 2] if tag < 16 else varint(tag << 3 | 2)) + (
        _SMALL[size] if size < 128 else varint(size)) + data


length_prefixed: Callable[[int, bytes], bytes] = cwire.length_prefixed if cwire else _py_length_prefixed


def field_bytes(tag: int, data: bytes | str) -> bytes:
    """A string or bytes field; empty when the value is the default (proto3)."""
    raw = data.encode() if isinstance(data, str) else data
    return length_prefixed(tag, raw) if raw else b""


# -- Values: each returns the serialized `Value` with one kind set -------------------------

def _py_value_int(n: int) -> bytes:
    """`value_of(int)`: sint64 (zigzag) below 2**63, else uint64; out of both ranges a
    ValueError, as upb raises (varint would truncate)."""
    if n >= 1 << 63:
        if n >= 1 << 64:
            raise ValueError(f"integer {n} is out of range for a Value (uint64)")
        return b"\x28" + varint(n)
    if n < -(1 << 63):
        raise ValueError(f"integer {n} is out of range for a Value (int64)")
    return b"\x20" + varint((n << 1) ^ (n >> 63))


value_int: Callable[[int], bytes] = cwire.value_int if cwire else _py_value_int


def value_bool(flag: bool) -> bytes:
    return _TRUE if flag else _FALSE


def value_float(x: float) -> bytes:
    return b"\x31" + struct.pack("<d", x)


def value_string(tag: int, text: str) -> bytes:
    """A string kind (decimal 7, text 8, json 10, uuid 15): set even when empty."""
    raw = text.encode()
    size = len(raw)
    return _SMALL[tag << 3 | 2] + (_SMALL[size] if size < 128 else varint(size)) + raw


def value_bytes_field(data: bytes) -> bytes:
    size = len(data)
    return b"\x4a" + (_SMALL[size] if size < 128 else varint(size)) + data


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)


def value_timestamp(moment: dt.datetime) -> bytes:
    """`value_of(datetime)`: microseconds since the epoch; aware ones flagged `with_zone`."""
    aware = moment.tzinfo is not None
    delta = moment - (_EPOCH if aware else _EPOCH_NAIVE)
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    inner = (b"\x08" + varint(micros) if micros else b"") + (b"\x10\x01" if aware else b"")
    return b"\x5a" + _SMALL[len(inner)] + inner


def _value_date(day: dt.date) -> bytes:
    return b"\x60" + varint((day - _EPOCH_DATE).days)


def _value_time(moment: dt.time) -> bytes:
    return b"\x68" + varint(((moment.hour * 60 + moment.minute) * 60 + moment.second)
                            * 1_000_000 + moment.microsecond)


def _value_timedelta(delta: dt.timedelta) -> bytes:
    return b"\x68" + varint((delta.days * 86_400 + delta.seconds) * 1_000_000
                            + delta.microseconds)


_EPOCH_DATE = dt.date(1970, 1, 1)
_BY_TYPE: dict[type, Callable[[Any], bytes]] = {
    int: value_int, bool: value_bool, float: value_float,
    str: lambda text: value_string(8, text), Json: lambda text: value_string(10, str(text)),
    Decimal: lambda number: value_string(7, str(number)),
    uuid.UUID: lambda u: value_string(15, str(u)),
    bytes: value_bytes_field, dt.datetime: value_timestamp, dt.date: _value_date,
    dt.time: _value_time, dt.timedelta: _value_timedelta,
}


def value_bytes(obj: Any) -> bytes:
    """`value_of(obj).SerializeToString()`, directly for the common types (by exact type:
    a subclass takes `value_of`'s own path)."""
    if obj is None:
        return NULL
    encode = _BY_TYPE.get(type(obj))
    if encode is not None:
        return encode(obj)
    return value_of(obj).SerializeToString()


# -- Rows ----------------------------------------------------------------------------------

def column_prefix(name: str, type_name: str) -> bytes:
    """A `Column`'s name and type fields and the value field's tag: the part of every
    column of one table that does not change from row to row."""
    return field_bytes(1, name) + field_bytes(2, type_name) + b"\x1a"


def _py_row_bytes(prefixes: Sequence[bytes], values: Sequence[bytes]) -> bytes:
    """A serialized `Row`: each column's prefix (`column_prefix`) with its serialized
    `Value`."""
    parts = []
    for prefix, value in zip(prefixes, values, strict=True):
        size = len(value)
        column = prefix + (_SMALL[size] if size < 128 else varint(size)) + value
        size = len(column)
        parts.append(b"\x0a" + (_SMALL[size] if size < 128 else varint(size)) + column)
    return b"".join(parts)


row_bytes: Callable[[Sequence[bytes], Sequence[bytes]], bytes] = (
    cwire.row_bytes if cwire else _py_row_bytes)

# the reference of each C twin (tests/unit/test_wire.py compares them)
PURE_PYTHON = {"varint": _py_varint, "length_prefixed": _py_length_prefixed,
               "value_int": _py_value_int, "row_bytes": _py_row_bytes}
