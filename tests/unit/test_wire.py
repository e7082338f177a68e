"""Hand-written protobuf encoding is byte-identical to upb's: keys are compared as bytes."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

import pytest

from tailrace.events import UNCHANGED_TOAST, Column, Row, value_of
from tailrace.events._values import Json
from tailrace.events._wire import (
    column_prefix,
    row_bytes,
    value_bool,
    value_bytes,
    value_float,
    value_int,
    value_string,
    value_timestamp,
    varint,
)
from tailrace_services.capture_postgres.values import converter_for, encoder_for

INTS = [0, 1, -1, 63, 64, -64, -65, 127, 128, 300, -300, 2**31, -(2**31), 2**62, 2**63 - 1,
        -(2**63), 2**63, 2**64 - 1]


@pytest.mark.parametrize("n", INTS)
def test_int_values(n: int) -> None:
    assert value_int(n) == value_of(n).SerializeToString()


@pytest.mark.parametrize("x", [0.0, -0.0, 1.5, -2.25e300, math.inf, -math.inf, 5e-324])
def test_float_values(x: float) -> None:
    assert value_float(x) == value_of(x).SerializeToString()


def test_nan_and_bools() -> None:
    assert value_float(math.nan) == value_of(math.nan).SerializeToString()
    assert value_bool(True) == value_of(True).SerializeToString()
    assert value_bool(False) == value_of(False).SerializeToString()


@pytest.mark.parametrize("text", ["", "a", "é" * 70, "x" * 127, "y" * 128, "z" * 20_000])
def test_text_values(text: str) -> None:
    assert value_string(8, text) == value_of(text).SerializeToString()


@pytest.mark.parametrize("moment", [
    dt.datetime(1970, 1, 1), dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    dt.datetime(2026, 11, 24, 7, 30, 1, 123456), dt.datetime(1, 1, 1),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
    dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone(dt.timedelta(hours=-8))),
])
def test_timestamp_values(moment: dt.datetime) -> None:
    assert value_timestamp(moment) == value_of(moment).SerializeToString()


@pytest.mark.parametrize("n", [2**64, -(2**63) - 1])
def test_ints_out_of_range_are_refused_as_upb_refuses_them(n: int) -> None:
    with pytest.raises(ValueError):
        value_of(n)
    with pytest.raises(ValueError):
        value_int(n)


def test_varint_of_negative_is_twos_complement() -> None:
    assert len(varint(-1)) == 10


PG_SAMPLES: dict[int, list[str]] = {
    16: ["t", "f"],
    17: ["\\x", "\\x00ff10"],
    20: ["0", "-9223372036854775808", "9223372036854775807", "42"],
    21: ["-32768", "7"], 23: ["2147483647", "-1"], 26: ["4294967295"],
    700: ["1.5", "NaN", "Infinity", "-Infinity", "-0"], 701: ["1e+300", "3.14159"],
    1700: ["0", "123.45", "0.0000001", "-1000000000000000000000000.5", "NaN", "Infinity"],
    25: ["", "plain", "ünïcödé" * 30], 1043: ["varchar"], 1042: ["char      "],
    114: ['{"a": [1, 2]}'], 3802: ['{"g": 1, "tags": ["a", "b"]}', "[]"],
    2950: ["827ccb0e-ea8a-706c-4c34-a16891f84e7b", "00000000-0000-0000-0000-000000000000"],
    1082: ["2026-11-24", "infinity", "0044-03-15 BC"],
    1083: ["00:00:00", "23:59:59.999999", "24:00:00"],
    1114: ["2026-11-24 07:30:01.123456", "1970-01-01 00:00:00", "infinity", "-infinity",
           "0100-01-01 00:00:00 BC"],
    1184: ["2026-11-24 07:30:01.123456+00", "1960-06-01 00:00:00-08", "infinity",
           "2001-02-03 04:05:06+05:30", "1890-01-01 00:00:00+05:53:28"],
    1186: ["1 day 02:00:00"], 1007: ["{1,2,NULL}"], 1009: ['{"a b",c}'], 1000: ["{t,f}"],
    869: ["10.0.0.1"],
}


@pytest.mark.parametrize("oid", sorted(PG_SAMPLES))
def test_postgres_encoders_match_the_converters(oid: int) -> None:
    encode, convert = encoder_for(oid), converter_for(oid)
    for text in PG_SAMPLES[oid]:
        assert encode(text) == value_of(convert(text)).SerializeToString(), (oid, text)


def test_rows_as_upb_builds_them() -> None:
    names = [("id", "bigint"), ("label", "text"), ("at", "timestamp with time zone"),
             ("long", "x" * 200)]
    values = [5, "é" * 100, dt.datetime(2026, 1, 2, tzinfo=dt.UTC), None]
    expected = Row(columns=[Column(name=n, type=t, value=value_of(v))
                            for (n, t), v in zip(names, values, strict=True)])
    encoded = row_bytes([column_prefix(n, t) for n, t in names],
                        [value_of(v).SerializeToString() for v in values])
    assert encoded == expected.SerializeToString()


PYTHON_VALUES: list[Any] = [
    None, UNCHANGED_TOAST, True, False, 0, -5, 2**63, 1.25, "", "text", Json('{"a": 1}'),
    Decimal("1E-7"), Decimal("-0.00"), Decimal("NaN"), uuid.UUID(int=7), b"", b"\x00\xff",
    bytearray(b"ab"), dt.datetime(2001, 2, 3, 4, 5, 6, 7), dt.date(1970, 1, 1),
    dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.time(0, 0), dt.time(23, 59, 59, 999999),
    dt.timedelta(hours=-838), dt.timedelta(hours=838, seconds=59), [1, None, "a"],
    {"k": [1, 2]},
]


def test_python_values_as_value_of_serializes_them() -> None:
    for obj in PYTHON_VALUES:
        assert value_bytes(obj) == value_of(obj).SerializeToString(), repr(obj)
