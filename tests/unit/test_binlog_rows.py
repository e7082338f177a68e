"""`_cwire.binlog_rows` on hand-built row images: bytes no server writes (fractional seconds
or DECIMAL groups past their digits) are left to the binlog library, which reads them its
own way; the real-server comparison is tests/integration/test_mysql_binlog_rows.py."""

from __future__ import annotations

import datetime as dt

from tailrace.events import Row, python_of
from tailrace.events._wire import cwire
from tailrace_services.capture_mysql.values import BinlogKind

_PREFIX = (b"\x0a\x01c\x12\x01t\x1a",)  # Column(name="c", type="t") and the value's tag


def _datetime2(moment: dt.datetime, fraction: bytes) -> bytes:
    year_month = moment.year * 13 + moment.month
    packed = (1 << 39 | year_month << 22 | moment.day << 17 | moment.hour << 12
              | moment.minute << 6 | moment.second)
    return b"\x00" + packed.to_bytes(5, "big") + fraction  # null bitmap, value


def _read(kind: int, a: int, b: int, image: bytes) -> list[bytes] | None:
    assert cwire is not None
    return cwire.binlog_rows(image, 0, len(image), 1, ((kind, a, b, None),), _PREFIX)


def test_fractional_seconds_past_their_digits_are_the_librarys() -> None:
    moment = dt.datetime(2024, 1, 2, 3, 4, 5)
    rows = _read(BinlogKind.DATETIME2, 6, 0, _datetime2(moment, (123456).to_bytes(3, "big")))
    assert rows is not None
    value = python_of(Row.FromString(rows[0]).columns[0].value)
    assert value == moment.replace(microsecond=123456)
    assert _read(BinlogKind.DATETIME2, 6, 0, _datetime2(moment, (10**6).to_bytes(3, "big"))) \
        is None
    assert _read(BinlogKind.DATETIME2, 2, 0, _datetime2(moment, b"\x80")) is None


def test_decimal_groups_past_their_digits_are_the_librarys() -> None:
    # DECIMAL(10,0): one compressed digit (1 byte) and a group of nine (4 bytes)
    rows = _read(BinlogKind.DECIMAL, 10, 0, b"\x00\x80" + (999_999_999).to_bytes(4, "big"))
    assert rows is not None
    assert Row.FromString(rows[0]).columns[0].value.decimal_value == "999999999"
    assert _read(BinlogKind.DECIMAL, 10, 0, b"\x00\x80" + (10**9).to_bytes(4, "big")) is None
    assert _read(BinlogKind.DECIMAL, 10, 0, b"\x00\x8a" + bytes(4)) is None  # 10 in one digit
