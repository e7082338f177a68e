"""pgoutput text values -> Python objects, chosen by type OID.

pgoutput (protocol v1) sends every column as the text its type's output function
prints, so decoding is parsing that text. The replication session pins the settings
the text depends on (DateStyle=ISO, bytea_output=hex, TimeZone=UTC, extra_float_digits),
see `connection.py`.

Speed matters (the whole decode path is a few µs per row), so each OID maps to one
converter through a dict, built-ins like `int`, `float` and `Decimal` are used directly,
and `datetime.fromisoformat` (C code) parses dates and times.

Values Python cannot hold stay text: `infinity`/`-infinity` dates and timestamps,
BC dates, years past 9999 and `24:00:00`. Types without a natural Python object
(interval, timetz, money, inet, geometric, ranges, enums, domains, composites and
any OID we do not know) are text as well.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from decimal import Decimal
from functools import partial
from typing import Any

from tailrace.events._values import Json
from tailrace.events._wire import (
    Kind,
    value_bool,
    value_bytes,
    value_float,
    value_int,
    value_string,
    value_timestamp,
)

__all__ = [
    "ARRAY_ELEMENTS",
    "Converter",
    "Encoder",
    "array_converter",
    "converter_for",
    "encoder_for",
    "kind_for",
    "parse_array",
]

Converter = Callable[[str], Any]
Encoder = Callable[[str], bytes]
"""A column's text -> its serialized `Value`: `value_of(converter(text)).SerializeToString()`
without the objects in between (`tailrace.events._wire`)."""


def _bool(text: str) -> bool:
    return text == "t"


def _bytea(text: str) -> bytes:
    """Hex format (`\\x0aff`); the old escape format is decoded too."""
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return _bytea_escape(text)


def _bytea_escape(text: str) -> bytes:
    out = bytearray()
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char != "\\":
            out += char.encode()
            i += 1
        elif text[i + 1] == "\\":
            out.append(0x5C)
            i += 2
        else:
            out.append(int(text[i + 1 : i + 4], 8))
            i += 4
    return bytes(out)


def _date(text: str) -> dt.date | str:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:  # infinity, -infinity, BC, year > 9999
        return text


def _time(text: str) -> dt.time | str:
    try:
        return dt.time.fromisoformat(text)
    except ValueError:  # 24:00:00
        return text


def _timestamp(text: str) -> dt.datetime | str:
    """Naive for `timestamp`, aware for `timestamptz` (offsets like +00, -08, +05:30, +05:53:28)."""
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:  # infinity, -infinity, BC, year > 9999
        return text


def _text(text: str) -> str:
    return text


# Array type OID -> element type OID (pg_type.typelem of the built-in array types).
ARRAY_ELEMENTS: dict[int, int] = {
    143: 142, 199: 114, 271: 5069, 629: 628, 651: 650, 719: 718, 775: 774, 791: 790,
    1000: 16, 1001: 17, 1002: 18, 1003: 19, 1005: 21, 1006: 22, 1007: 23, 1008: 24,
    1009: 25, 1010: 27, 1011: 28, 1012: 29, 1013: 30, 1014: 1042, 1015: 1043, 1016: 20,
    1017: 600, 1018: 601, 1019: 602, 1020: 603, 1021: 700, 1022: 701, 1027: 604, 1028: 26,
    1034: 1033, 1040: 829, 1041: 869, 1115: 1114, 1182: 1082, 1183: 1083, 1185: 1184,
    1187: 1186, 1231: 1700, 1263: 2275, 1270: 1266, 1561: 1560, 1563: 1562, 2201: 1790,
    2207: 2202, 2208: 2203, 2209: 2204, 2210: 2205, 2211: 2206, 2949: 2970, 2951: 2950,
    3221: 3220, 3643: 3614, 3644: 3642, 3645: 3615, 3735: 3734, 3770: 3769, 3807: 3802,
    3905: 3904, 3907: 3906, 3909: 3908, 3911: 3910, 3913: 3912, 3927: 3926, 4073: 4072,
    4090: 4089, 4097: 4096, 4192: 4191, 5039: 5038, 6150: 4451, 6151: 4532, 6152: 4533,
    6153: 4534, 6155: 4535, 6157: 4536,
}  # fmt: skip

_BOX = 603  # the only built-in type whose array delimiter is ';'

_SCALARS: dict[int, Converter] = {
    16: _bool,
    17: _bytea,
    20: int, 21: int, 23: int, 26: int,  # int8, int2, int4, oid
    28: int, 29: int, 5069: int,  # xid, cid, xid8
    700: float, 701: float,  # NaN, Infinity and -Infinity parse as they are
    1700: Decimal,  # exact, NaN and ±Infinity included
    114: Json, 3802: Json,
    2950: uuid.UUID,
    1082: _date,
    1083: _time,
    1114: _timestamp, 1184: _timestamp,
}  # fmt: skip


def parse_array(text: str, element: Converter = _text, delimiter: str = ",") -> list[Any]:
    """Parse an array literal as `array_out` prints it: `{1,2}`, `{{"a b",NULL},{"c\\"d",e}}`.

    Unquoted `NULL` (any case) is None, a quoted `"NULL"` is the text NULL. Explicit
    bounds (`[0:1]={1,2}`) are dropped: the result is a (nested) list.
    """
    if text[0] == "[":
        text = text[text.index("=") + 1 :]
    inner = text[1:-1]
    if not inner:
        return []
    if '"' not in inner and "{" not in inner and "\\" not in inner:
        # Fast path: one dimension, nothing quoted.
        return [
            None if len(item) == 4 and item.upper() == "NULL" else element(item)
            for item in inner.split(delimiter)
        ]
    result, end = _parse_dimension(text, 0, element, delimiter)
    if text[end:].strip():
        raise ValueError(f"malformed array literal: trailing text after position {end}: {text!r}")
    return result


def _parse_dimension(
    text: str, pos: int, element: Converter, delimiter: str
) -> tuple[list[Any], int]:
    """Parse `{...}` starting at `text[pos] == '{'`; return the list and the index after `}`."""
    if text[pos] != "{":
        raise ValueError(f"malformed array literal: expected '{{' at {pos}: {text!r}")
    items: list[Any] = []
    pos += 1
    if text[pos] == "}":
        return items, pos + 1
    while True:
        while text[pos] == " ":
            pos += 1
        char = text[pos]
        if char == "{":
            sub, pos = _parse_dimension(text, pos, element, delimiter)
            items.append(sub)
        elif char == '"':
            value, pos = _quoted(text, pos + 1)
            items.append(element(value))
        else:
            value, pos = _unquoted(text, pos, delimiter)
            if len(value) == 4 and value.upper() == "NULL":
                items.append(None)
            else:
                items.append(element(value))
        while text[pos] == " ":
            pos += 1
        char = text[pos]
        if char == "}":
            return items, pos + 1
        if char != delimiter:
            raise ValueError(f"malformed array literal: unexpected {char!r} at {pos}: {text!r}")
        pos += 1


def _quoted(text: str, pos: int) -> tuple[str, int]:
    """Read a quoted element whose first character is at `pos`; return it and the index after."""
    parts: list[str] = []
    while True:
        quote = text.index('"', pos)
        slash = text.find("\\", pos, quote)
        if slash < 0:
            parts.append(text[pos:quote])
            return "".join(parts), quote + 1
        parts.append(text[pos:slash])
        parts.append(text[slash + 1])
        pos = slash + 2


def _unquoted(text: str, pos: int, delimiter: str) -> tuple[str, int]:
    start = pos
    escaped = False
    while True:
        char = text[pos]
        if char == "\\":
            escaped = True
            pos += 2
            continue
        if char == delimiter or char == "}":
            break
        pos += 1
    value = text[start:pos].strip()
    if escaped:
        value, _ = _quoted(value + '"', 0)
    return value, pos


def array_converter(element: Converter = _text, delimiter: str = ",") -> Converter:
    """A converter for arrays whose elements `element` converts."""
    return partial(parse_array, element=element, delimiter=delimiter)


_ARRAYS: dict[int, Converter] = {
    oid: array_converter(_SCALARS.get(elem, _text), ";" if elem == _BOX else ",")
    for oid, elem in ARRAY_ELEMENTS.items()
}
_TEXT_ARRAY = array_converter()


def converter_for(type_oid: int, custom_name: str | None = None) -> Converter:
    """The converter for a column type; `custom_name` is the name a Type message gave.

    A non-built-in type whose name starts with `_` is the array type of a custom type
    (PostgreSQL's naming): it becomes a list of text (e.g. an enum array). Any other
    unknown type is text.
    """
    found = _SCALARS.get(type_oid) or _ARRAYS.get(type_oid)
    if found is not None:
        return found
    if custom_name is not None and custom_name.startswith("_"):
        return _TEXT_ARRAY
    return _text


# -- Encoders: text -> serialized Value, for the types most tables are made of ------------

def _int_value(text: str) -> bytes:
    return value_int(int(text))


def _bool_value(text: str) -> bytes:
    return value_bool(text == "t")


def _float_value(text: str) -> bytes:
    return value_float(float(text))


def _decimal_value(text: str) -> bytes:
    return value_string(7, str(Decimal(text)))  # Decimal's own spelling, as value_of keeps it


def _text_value(text: str) -> bytes:
    return value_string(8, text)


def _json_value(text: str) -> bytes:
    return value_string(10, text)


def _uuid_value(text: str) -> bytes:
    return value_string(15, text)  # uuid_out prints the canonical form str(UUID) prints


def _timestamp_value(text: str) -> bytes:
    try:
        return value_timestamp(dt.datetime.fromisoformat(text))
    except ValueError:  # infinity, -infinity, BC, year > 9999: text, as `_timestamp`
        return value_string(8, text)


_ENCODERS: dict[Converter, Encoder] = {
    int: _int_value, _bool: _bool_value, float: _float_value, Decimal: _decimal_value,
    _text: _text_value, Json: _json_value, uuid.UUID: _uuid_value,
    _timestamp: _timestamp_value,
}


# The C encoder's fast path per converter (`_cwire.values`, `chunk_rows`): what it
# writes for a well-formed text equals the Python encoder's; anything else it hands to it.
_KINDS: dict[Converter, Kind] = {
    int: Kind.INT, _bool: Kind.BOOL, _text: Kind.TEXT, Json: Kind.JSON, uuid.UUID: Kind.UUID,
    _timestamp: Kind.TIMESTAMP, Decimal: Kind.NUMERIC,
}


def kind_for(type_oid: int, custom_name: str | None = None) -> int:
    """The C encoder's kind for a column type; 0: the Python encoder decides every value."""
    return _KINDS.get(converter_for(type_oid, custom_name), Kind.OTHER)


def encoder_for(type_oid: int, custom_name: str | None = None) -> Encoder:
    """The encoder for a column type: a direct one for common types, else the converter's
    value through `value_bytes` (`value_of`, with fast paths for the common types)."""
    converter = converter_for(type_oid, custom_name)
    direct = _ENCODERS.get(converter)
    if direct is not None:
        return direct
    return lambda text: value_bytes(converter(text))
