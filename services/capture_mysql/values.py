"""Binlog row values -> typed `Value`s, exactly (serialized by `_wire.value_bytes`, as
`tailrace.events.value_of` would wrap them).

What `mysql-replication` hands us, and what we make of it:

- integers: unsigned columns arrive unsigned (`bigint unsigned` up to 2^64-1,
  carried as `uint_value` past 2^63);
- DECIMAL: `decimal.Decimal`, kept as exact text;
- FLOAT: a 4-byte float widened to a double (1.1 -> 1.100000023841858); we
  give back the shortest decimal that is the same float32 (1.1);
- DATETIME(n): a naive datetime, wall-clock time without zone
  (`with_zone=False`);
- TIMESTAMP(n): the binlog stores seconds since the epoch (UTC), whatever the
  session time_zone was; we emit an aware UTC datetime (`with_zone=True`);
- TIME: a signed interval (`time_value` microseconds, may be negative or > 24h);
- DATE / DATETIME zero values (`0000-00-00`) have no date: NULL;
- YEAR: the year; `0000` stays 0 (the library reads it as 1900);
- JSON: MySQL's binary JSON is parsed by the library -> compact JSON text;
  MariaDB's JSON is text, kept verbatim;
- ENUM: the label ('' for the invalid-value index 0); SET: the members in
  definition order joined by ',' ('' for the empty set, which the library
  reports as NULL);
- BIT(1): bool; BIT(n): unsigned integer;
- BINARY(n): the library strips the trailing 0x00 padding; it is put back;
- an empty value of a binary column (VARBINARY, BLOB, BINARY, UUID, INET6/INET4): the
  library hands '' (Python decodes an empty bytes object without looking the codec up, so
  its "no codec named binary: keep the bytes" never happens); it is bytes again (the nil
  UUID, stored as nothing, stopped capture before);
- MariaDB UUID: a `uuid`; INET6/INET4: the address as text (`::ffff:1.2.3.4`
  for mapped IPv4, as MariaDB prints it);
- character columns: str, decoded with the column's charset; binary ones bytes.
"""

from __future__ import annotations

import codecs
import datetime as dt
import ipaddress
import json
import re
import struct
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from enum import IntEnum
from functools import partial
from typing import Any, Protocol

from pymysql.charset import charset_by_name
from pymysqlreplication.constants import FIELD_TYPE

from tailrace.events import Row
from tailrace.events._values import Json
from tailrace.events._wire import (
    NULL,
    Kind,
    column_prefix,
    cwire,
    row_bytes,
    value_bytes,
    value_string,
)
from tailrace_services.capture.snapshot.chunks import KIND_OBJECT

__all__ = ["MYSQL_LATIN1", "BinlogKind", "ColumnShape", "RowDecoder", "TableShape", "binlog_plan",
           "converter_for", "make_row", "mysql_encoding"]


class ColumnShape(Protocol):
    """What converting needs of a column (`schema.ColumnShape`, which builds RowDecoders)."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...  # normalised type name
    @property
    def field_type(self) -> int: ...  # binlog FIELD_TYPE
    @property
    def max_length(self) -> int: ...
    @property
    def set_values(self) -> tuple[str, ...]: ...


class TableShape(Protocol):
    @property
    def columns(self) -> Sequence[ColumnShape]: ...

Converter = Callable[[Any], Any]

_EMPTY_SET = "empty set"


def _identity(v: Any) -> Any:
    return v


def _binary(v: Any) -> Any:
    return b"" if v == "" else v  # see the module docstring: '' is an empty binary value


_BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})


def _float32(v: float) -> float:
    packed = struct.pack("<f", v)
    for digits in range(6, 10):
        candidate = float(f"{v:.{digits}g}")
        if struct.pack("<f", candidate) == packed:
            return candidate
    return v


def _timestamp(v: dt.datetime) -> dt.datetime:
    return v.replace(tzinfo=dt.UTC)


def _year(v: int) -> int:
    return 0 if v == 1900 else v  # YEAR 0000 is stored as 0, read as 0 + 1900


def _json_text(v: Any) -> Json:
    if isinstance(v, str):
        return Json(v)

    def plain(o: Any) -> Any:
        if isinstance(o, bytes):
            return o.decode("utf-8", "replace")
        if isinstance(o, dict):
            return {plain(k): plain(x) for k, x in o.items()}
        if isinstance(o, list | tuple):
            return [plain(x) for x in o]
        if isinstance(o, Decimal):
            return float(o) if o != o.to_integral_value() else int(o)
        return o

    return Json(json.dumps(plain(v), separators=(",", ":"), ensure_ascii=False, default=str))


def _padder(length: int) -> Converter:
    def pad(v: bytes | str) -> bytes | str:
        v = _binary(v)
        return v.ljust(length, b"\x00") if isinstance(v, bytes) else v
    return pad


def _uuid(v: bytes | str) -> uuid.UUID:
    return uuid.UUID(bytes=bytes(_binary(v)).ljust(16, b"\x00"))


def _inet6(v: bytes | str) -> str:
    addr = ipaddress.IPv6Address(bytes(_binary(v)).ljust(16, b"\x00"))
    mapped = addr.ipv4_mapped
    return f"::ffff:{mapped}" if mapped is not None else str(addr)


def _inet4(v: bytes | str) -> str:
    return str(ipaddress.IPv4Address(bytes(_binary(v)).ljust(4, b"\x00")))


def _bits(single: bool) -> Converter:
    def convert(v: str) -> int | bool:
        n = int(v, 2) if v else 0
        return bool(n) if single else n
    return convert


def _set(values: tuple[str, ...]) -> Converter:
    order = {name: i for i, name in enumerate(values)}

    def convert(v: set[str] | str) -> str:
        if isinstance(v, str):
            return v
        return ",".join(sorted(v, key=lambda name: order.get(name, len(order))))
    return convert


def converter_for(column: ColumnShape) -> Converter:
    """How to turn the library's value for this column into ours (None stays None)."""
    t, name = column.field_type, column.type
    if name == "uuid":
        return _uuid
    if name == "inet6":
        return _inet6
    if name == "inet4":
        return _inet4
    if name == "json":
        return _json_text
    if t == FIELD_TYPE.FLOAT:
        return _float32
    if t in (FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2):
        return _timestamp
    if t == FIELD_TYPE.YEAR:
        return _year
    if t == FIELD_TYPE.BIT:
        return _bits(name == "bit(1)")
    if t == FIELD_TYPE.SET:
        return _set(column.set_values)
    if t == FIELD_TYPE.STRING and name == "binary" and column.max_length:
        return _padder(column.max_length)
    if name in _BINARY_TYPES:
        return _binary
    return _identity


class BinlogKind(IntEnum):
    """How `_cwire.binlog_rows` reads a column's value from a rows event (its `enum` B_*)."""

    INT = 1  # a: width in bytes, b: unsigned
    FLOAT = 2
    DOUBLE = 3
    DECIMAL = 4  # a: precision, b: scale
    DATE = 5
    DATETIME2 = 6  # a: fractional digits (fsp)
    TIMESTAMP2 = 7  # a: fsp
    TIME2 = 8  # a: fsp
    YEAR = 9
    TEXT = 10  # a: length bytes, b: the Value's tag (8 text, 10 json), extra: codec (None: UTF-8)
    BYTES = 11  # a: length bytes, b: the length to pad to with 0x00 (BINARY(n))
    UUID = 12  # a: length bytes
    ENUM = 13  # a: size, extra: the labels, UTF-8, index 0 the invalid value's ''
    SET = 14  # a: size, extra: the members, UTF-8, in definition order
    BIT = 15  # a: bytes, b: bits


BinlogPlan = tuple[tuple[int, int, int, object], ...]

_INT_WIDTH = {FIELD_TYPE.TINY: 1, FIELD_TYPE.SHORT: 2, FIELD_TYPE.INT24: 3, FIELD_TYPE.LONG: 4,
              FIELD_TYPE.LONGLONG: 8}
_FSP_KIND = {FIELD_TYPE.DATETIME2: BinlogKind.DATETIME2,
             FIELD_TYPE.TIMESTAMP2: BinlogKind.TIMESTAMP2, FIELD_TYPE.TIME2: BinlogKind.TIME2}


MYSQL_LATIN1 = "tailrace-mysql-latin1"
"""MySQL's latin1: Windows-1252, with the five bytes it leaves undefined (0x81, 0x8D, 0x8F,
0x90, 0x9D) read as the C1 controls of the same number, as the server converts them.
Python's cp1252 refuses those bytes, which stopped capture on text the server accepts."""

_LATIN1_TABLE = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b)
                        for b in range(256))


def _latin1_codec(name: str) -> codecs.CodecInfo | None:
    if name != MYSQL_LATIN1.replace("-", "_"):
        return None
    encoding = codecs.charmap_build(_LATIN1_TABLE)
    return codecs.CodecInfo(
        name=MYSQL_LATIN1,
        encode=lambda text, errors="strict": codecs.charmap_encode(text, errors, encoding),
        decode=lambda data, errors="strict": codecs.charmap_decode(data, errors,
                                                                    _LATIN1_TABLE))


codecs.register(_latin1_codec)


def mysql_encoding(encoding: str) -> str:
    """The codec to decode text the binlog library names by `encoding` with (pymysql names
    MySQL's latin1 `cp1252`)."""
    return MYSQL_LATIN1 if encoding == "cp1252" else encoding


def _codec(charset: str | None) -> tuple[bool, str | None]:
    """(is text, the Python codec when not UTF-8), as the binlog library decodes a column:
    with its charset's codec, or left bytes when Python has none (`binary`)."""
    if charset is None:
        return True, None
    found = charset_by_name(charset)
    name = mysql_encoding(found.encoding if found else charset)
    try:
        codec = codecs.lookup(name).name
    except LookupError:
        return False, None
    return True, (None if codec == "utf-8" else name)


def _binlog_column(column: Any, shape: ColumnShape) -> tuple[int, int, int, object] | None:
    t, name = column.type, shape.type
    if t in _INT_WIDTH:
        return BinlogKind.INT, _INT_WIDTH[t], int(bool(column.unsigned)), None
    if t == FIELD_TYPE.FLOAT:
        return BinlogKind.FLOAT, 0, 0, None
    if t == FIELD_TYPE.DOUBLE:
        return BinlogKind.DOUBLE, 0, 0, None
    if t == FIELD_TYPE.NEWDECIMAL:
        return BinlogKind.DECIMAL, column.precision, column.decimals, None
    if t == FIELD_TYPE.DATE:
        return BinlogKind.DATE, 0, 0, None
    if t in _FSP_KIND:
        return _FSP_KIND[t], column.fsp, 0, None
    if t == FIELD_TYPE.YEAR:
        return BinlogKind.YEAR, 0, 0, None
    if t == FIELD_TYPE.ENUM:
        labels = tuple(v.encode() for v in column.enum_values or ())
        return BinlogKind.ENUM, column.size, 0, labels
    if t == FIELD_TYPE.SET:
        members = tuple(v.encode() for v in column.set_values or ())
        if len(set(members)) != len(members):  # the library's labels it cannot read are all ''
            return None  # and its members a Python set: C would repeat them
        return BinlogKind.SET, column.size, 0, members
    if t == FIELD_TYPE.BIT:
        return BinlogKind.BIT, column.bytes, column.bits, None
    if t in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING):
        size = 2 if column.max_length > 255 else 1
    elif t == FIELD_TYPE.BLOB:
        size = column.length_size
    else:
        return None  # JSON (MySQL's binary form), spatial, the pre-5.6 temporal types
    text, codec = _codec(column.character_set_name)
    if name == "uuid":
        return (BinlogKind.UUID, size, 0, None) if not text else None
    if name in ("inet6", "inet4"):
        return None
    if name == "json":
        return (BinlogKind.TEXT, size, 10, None) if text and codec is None else None
    if not text:
        if name not in _BINARY_TYPES:  # a charset Python has no codec for: the library
            return None  # hands bytes, but '' for an empty value (module docstring)
        pad = column.max_length if name == "binary" and t == FIELD_TYPE.STRING else 0
        return BinlogKind.BYTES, size, pad, None
    return BinlogKind.TEXT, size, 8, codec


def binlog_plan(columns: Sequence[Any], shape: TableShape) -> BinlogPlan | None:
    """How `_cwire.binlog_rows` reads this table map's rows, giving what the binlog library's
    values would become through `converter_for`; None when a column is of a type it does
    not read (the library decodes those tables' rows)."""
    if cwire is None or len(columns) != len(shape.columns):
        return None
    plan = []
    for column, column_shape in zip(columns, shape.columns, strict=True):
        entry = _binlog_column(column, column_shape)
        if entry is None:
            return None
        plan.append((int(entry[0]), int(entry[1]), int(entry[2]), entry[3]))
    return tuple(plan)


class RowDecoder:
    """The converters of one table shape, built once and reused for its rows. With the table
    map's `columns`, also how its rows are read straight from a rows event's bytes."""

    def __init__(self, shape: TableShape, columns: Sequence[Any] | None = None) -> None:
        self.shape = shape
        self.plan = binlog_plan(columns, shape) if columns is not None else None
        self._columns = [(c.name, c.type, converter_for(c), c.field_type == FIELD_TYPE.SET)
                         for c in shape.columns]
        self._converters = [convert for _, _, convert, _ in self._columns]
        self.prefixes = tuple(column_prefix(name, type_name) for name, type_name, _, _
                              in self._columns)
        """Per column, its `Column` fields but the value (`_wire.row_bytes`)."""

    def images(self, data: bytes, start: int, end: int, per_row: int) -> list[bytes] | None:
        """A rows event's row images (`data[start:end]`, `reader.row_images`) as serialized
        Rows, `per_row` of them a row (an update's before and after), read in C without the
        library's Python values; None when this table or one of these values is not read
        there: the library's `event.rows` and `row_bytes` then make the same bytes."""
        if self.plan is None:
            return None
        return cwire.binlog_rows(data, start, end, per_row, self.plan, self.prefixes)

    def library_images(self, event: Any) -> list[bytes]:
        """`images` made from the binlog library's values of a rows event (`event.rows`)."""
        row = self.row_bytes
        images: list[bytes] = []
        for r in event.rows:
            if "before_values" in r:  # an update: before, after
                images.append(row(r["before_values"], r["before_none_sources"]))
                images.append(row(r["after_values"], r["after_none_sources"]))
            else:
                images.append(row(r["values"], r["none_sources"]))
        return images

    def read_encoders(self, forms: Sequence[Callable[[Any], Any] | None]
                      ) -> tuple[bytes, tuple[Callable[[Any], bytes], ...]]:
        """Per column, how a value PyMySQL read becomes a serialized `Value` (`forms`: to
        the binlog library's value first, `snapshot.binlog_form`), for
        `capture.snapshot.chunk_rows`: the C kind (`KIND_OBJECT` where the library's value
        is ours as it is), and the Python encoder for the rest."""
        kinds: list[int] = []
        encoders: list[Callable[[Any], bytes]] = []
        for convert, form in zip(self._converters, forms, strict=True):
            if convert in (_identity, _binary) and form is None:  # PyMySQL: bytes, b""
                kinds.append(KIND_OBJECT)
                encoders.append(value_bytes)
            elif convert is _uuid:  # the server's text is already what str(UUID) prints
                kinds.append(Kind.OTHER)
                encoders.append(partial(_uuid_text, form))
            else:
                kinds.append(Kind.OTHER)
                encoders.append(partial(_encode, form, convert))
        return bytes(kinds), tuple(encoders)

    def row(self, values: dict[str, Any] | None, none_sources: dict[str, str] | None = None,
            only: set[str] | None = None) -> Row:
        """The row as a message, encoded by hand and parsed in one call (`_wire`)."""
        return Row.FromString(self.row_bytes(values, none_sources, only))

    def row_bytes(self, values: dict[str, Any] | None,
                  none_sources: dict[str, str] | None = None, only: set[str] | None = None
                  ) -> bytes:
        """`row`, serialized (what `events.EventFactory.change` takes)."""
        if values is None:
            return b""
        none_sources = none_sources or {}
        prefixes: list[bytes] = []
        encoded: list[bytes] = []
        for (name, _, convert, is_set), prefix in zip(self._columns, self.prefixes,
                                                      strict=True):
            if only is not None and name not in only:
                continue
            v = values.get(name)
            if v is None:
                value = "" if is_set and none_sources.get(name) == _EMPTY_SET else None
            else:
                value = convert(v)
            prefixes.append(prefix)
            encoded.append(value_bytes(value))
        return row_bytes(prefixes, encoded)


def _encode(form: Callable[[Any], Any] | None, convert: Converter, value: Any) -> bytes:
    """PyMySQL's value -> the binlog library's (`form`; a JSON `null` becomes None, as the
    binlog has it: NULL) -> ours."""
    formed = form(value) if form is not None else value
    return NULL if formed is None else value_bytes(convert(formed))


def _uuid_text(form: Callable[[Any], Any] | None, value: Any) -> bytes:
    if isinstance(value, str) and _CANONICAL_UUID.fullmatch(value):
        return value_string(15, value)
    return _encode(form, _uuid, value)


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def make_row(shape: TableShape, values: dict[str, Any] | None,
             none_sources: dict[str, str] | None = None) -> Row:
    return RowDecoder(shape).row(values, none_sources)
