"""Hand-written protobuf encoding is byte-identical to upb's: keys are compared as bytes."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

import pytest

from tailrace.events import UNCHANGED_TOAST, Column, Row, _wire, event_id, event_ids, value_of
from tailrace.events._values import Json
from tailrace.events._wire import (
    PURE_PYTHON,
    column_prefix,
    cwire,
    row_bytes,
    value_bool,
    value_bytes,
    value_float,
    value_int,
    value_string,
    value_timestamp,
    varint,
)
from tailrace_services.capture.snapshot import chunks, records
from tailrace_services.capture_postgres.reader import (
    UNCHANGED_VALUE,
    Relation,
    RelationColumn,
    _py_tuple,
)
from tailrace_services.capture_postgres.values import converter_for, encoder_for, kind_for
from tests.pgoutput import tuple_data

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


# -- The C twins (`_cwire`, built by setup.py) give the Python reference's bytes ----------

def test_the_c_encoder_is_built() -> None:
    """`make setup` compiles it; without it capture is ~2x slower (docs/performance.md)."""
    assert _wire.ACCELERATED, "tailrace.events._cwire is not built: run `make setup`"


@pytest.mark.parametrize("n", [*INTS, -(2**63) - 1, 2**64, 2**70 + 5, -(2**70)])
def test_c_varint(n: int) -> None:
    assert cwire.varint(n) == PURE_PYTHON["varint"](n)


@pytest.mark.parametrize("n", [*INTS, 2**64, -(2**63) - 1])
def test_c_value_int(n: int) -> None:
    try:
        expected = PURE_PYTHON["value_int"](n)
    except ValueError as e:
        with pytest.raises(ValueError, match="out of range"):
            cwire.value_int(n)
        assert "out of range" in str(e)
        return
    assert cwire.value_int(n) == expected


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 300_000])
@pytest.mark.parametrize("tag", [1, 15, 16, 21, 2047, 2048])
def test_c_length_prefixed(tag: int, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert cwire.length_prefixed(tag, data) == PURE_PYTHON["length_prefixed"](tag, data)


def test_c_row_bytes() -> None:
    prefixes = [column_prefix("id", "bigint"), column_prefix("x" * 150, "text")]
    for values in ([b"\x20\x02", b"\x42\x00"], [b"", b"\x42" + b"y" * 200], [b"\x08\x01"] * 2):
        assert cwire.row_bytes(prefixes, values) == PURE_PYTHON["row_bytes"](prefixes, values)
    with pytest.raises(ValueError):
        cwire.row_bytes(prefixes, [b""])


# texts whose kind the C side reads itself, next to ones it must hand back to Python
PG_C_SAMPLES: dict[int, list[str]] = {
    **PG_SAMPLES,
    20: [*PG_SAMPLES[20], "-0", "123456789012345678", "-123456789012345678",
         "1234567890123456789", "-"],
    1700: [*PG_SAMPLES[1700], "-0", "0.00", "0.000001", "0.0000010", "0.0000000", "100",
           "-0.0000001", "12345678901234567890.123", "-Infinity", "1.5e3"],
    1114: [*PG_SAMPLES[1114], "2024-02-29 00:00:00", "2023-02-29 00:00:00", "0001-01-01 00:00:00",
           "9999-12-31 23:59:59.999999", "2026-11-24 07:30:01.5", "2026-11-24 07:30:01.",
           "12026-11-24 07:30:01", "2026-11-24T07:30:01", "2026-11-24 24:00:00"],
    1184: [*PG_SAMPLES[1184], "1969-12-31 23:59:59.999999+00", "2026-11-24 07:30:01+14",
           "2026-11-24 07:30:01-12:30", "0001-01-01 00:00:00+00", "2026-11-24 07:30:01+5",
           "2026-11-24 07:30:01+05:", "2026-11-24 07:30:01.1234567+00"],
}


@pytest.mark.parametrize("oid", sorted(PG_C_SAMPLES))
def test_c_postgres_values(oid: int) -> None:
    encode, kind = encoder_for(oid), kind_for(oid)
    for text in PG_C_SAMPLES[oid]:
        try:
            expected = encode(text)
        except ValueError:
            with pytest.raises(ValueError):
                cwire.values(bytes([kind]), (encode,), [text])
            continue
        assert cwire.values(bytes([kind]), (encode,), [text]) == [expected], (oid, text)


def test_c_postgres_chunk_rows() -> None:
    oids = [20, 25, 1184, 1700, 16, 2950, 3802, 1186]
    kinds = bytes(kind_for(o) for o in oids)
    encoders = tuple(encoder_for(o) for o in oids)
    prefixes = tuple(column_prefix(f"c{o}", "t") for o in oids)
    rows = [("1", "a", "2026-11-24 07:30:01+00", "1.50", "t", str(uuid.UUID(int=1)), "{}",
             "1 day"),
            ("2", None, "infinity", "NaN", "f", None, None, None),
            ("-3", "é" * 300, None, "0.0000001", None, str(uuid.UUID(int=2)), "[1]", "00:01:00")]
    head = b"db\x00public\x00t"
    for key_index, bus_index in (((0,), (0,)), ((1, 0), (0, 1))):
        args = (rows, kinds, encoders, prefixes, key_index, bus_index, head)
        assert cwire.chunk_rows(*args) == chunks._py_chunk_rows(*args)


def test_c_pgoutput_tuples() -> None:
    """`_cwire.pg_tuple` against its twin: every kind, NULL, unchanged TOAST, a long text,
    a value only the Python encoder knows; and a bad value, a cut tuple, a binary one."""
    oids = [20, 25, 1184, 1700, 16, 2950, 3802, 1186, 23, 1007]
    relation = Relation(1, "public", "t", "d",
                        tuple(RelationColumn(f"c{o}", o, -1, False) for o in oids))
    rows = [("1", "a", "2026-11-24 07:30:01+00", "1.50", "t", str(uuid.UUID(int=1)), "{}",
             "1 day", "7", "{1,2,NULL}"),
            ("-2", None, "infinity", "NaN", b"u", None, b"u", None, "-7", None),
            ("9223372036854775807", "é" * 300, None, "0.0000001", "f", str(uuid.UUID(int=2)),
             "[1]", "00:01:00", None, "{}")]
    for row in rows:
        payload = b"I\x00\x00\x00\x01N" + tuple_data(*row) + b"trailing"
        expected = _py_tuple(payload, 6, relation)
        assert cwire.pg_tuple(payload, 6, relation.kinds, relation.encoders,
                              UNCHANGED_VALUE) == expected
        assert expected[1] == len(payload) - len(b"trailing")
    bad = [tuple_data("x", *rows[0][1:]), tuple_data(*rows[0])[:-3],
           tuple_data(*rows[0][:-1]), b"\x00\x01b"]
    for payload in bad:
        with pytest.raises(ValueError):
            cwire.pg_tuple(payload, 0, relation.kinds, relation.encoders, UNCHANGED_VALUE)
    with pytest.raises(ValueError, match=r"t\.c20 \(bigint\) from b'x'"):
        _py_tuple(bad[0], 0, relation)


def test_c_read_records() -> None:
    rows = [((b"k%d" % i,), (b"bus%d" % i, b"\x0a\x05row%d" % i)) for i in range(300)]
    read_rows = [row for _, row in rows]
    eids = [str(uuid.UUID(int=i)) for i in range(300)]
    for last in (True, False):
        for n in (0, 1, 2, 300):
            args = (b"common" * 30, b"\x08\x07", b"\x08\x03\x10\x01", last, b"t|db.x|tx|",
                    eids[:n], read_rows[:n])
            assert cwire.read_records(*args) == records._py_bus_records(*args)


@pytest.mark.parametrize("source_id", ["", "pg1", "s" * 60, "é-source"])
def test_c_event_ids(source_id: str) -> None:
    """SHA-256 in C: every message length around the 55/56/64-byte block edges."""
    for native_tx in ("", "1A2B3C", "0-1-12345:7" * 5):
        for ts_ms in (0, 1_795_516_444_951, -1, 2**50):
            ids = event_ids(source_id, native_tx, 0, 130, ts_ms)
            assert ids == [event_id(source_id, native_tx, i, ts_ms) for i in range(130)]
    assert event_ids("x", "y", 10**12, 2, 5) == [event_id("x", "y", 10**12 + i, 5)
                                                 for i in range(2)]


def test_c_python_values() -> None:
    """`KIND_OBJECT`: the exact types `value_bytes` dispatches on, in C; the rest handed
    back to it."""
    objects: list[Any] = [
        *PYTHON_VALUES, -(2**63), 2**64 - 1, "é" * 200, b"x" * 300, math.nan, -0.0,
        dt.datetime(2026, 11, 24, 7, 30, 1, 5, tzinfo=dt.UTC),
        dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone(-dt.timedelta(hours=9))),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
    ]
    for obj in objects:
        expected = value_bytes(obj)
        assert cwire.values(bytes([chunks.KIND_OBJECT]), (value_bytes,), [obj]) == [expected], \
            repr(obj)
    for out_of_range in (2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="out of range"):
            cwire.values(bytes([chunks.KIND_OBJECT]), (value_bytes,), [out_of_range])


def test_c_chunk_rows_refuses_what_is_not_bytes() -> None:
    with pytest.raises(TypeError, match="prefixes must be bytes"):
        cwire.chunk_rows([(1,)], bytes([chunks.KIND_OBJECT]), (value_bytes,), ("abc",),  # type: ignore[arg-type]
                         (0,), (0,), b"h")


def test_c_bus_keys() -> None:
    """`bus_key` from the row's bytes (`_cwire.row_key`) equals the reference for inserts,
    updates and deletes (keyed by the old row), snapshot reads, keyless tables, composite
    keys in any order, and columns without a name or a value."""
    from tailrace.events import ChangeEvent, Op
    from tailrace.events._codec import _py_bus_key, bus_key
    from tests.fix_sinks import source_events

    events = list(source_events(300))
    weird = Row(columns=[Column(name="", value=value_of(1)), Column(name="b"),
                         Column(name="a", value=value_of("é" * 200)),
                         Column(name="c", value=value_of(dt.datetime(2020, 1, 1)))])
    for keys in ([], ["a"], ["b", "a"], ["c", "a"], [""], ["missing"]):
        for op in (Op.OP_INSERT, Op.OP_UPDATE, Op.OP_DELETE, Op.OP_SNAPSHOT_READ):
            events.append(ChangeEvent(database="d", schema="s", table="t", op=op,
                                      key_columns=keys, after=weird, before=weird))
            events.append(ChangeEvent(database="d", table="t", op=op, key_columns=keys,
                                      after=weird))
    for event in events:
        assert bus_key(event) == _py_bus_key(event), event
    assert cwire.row_key(b"h", b"\x0a\x05\x0a\x01a\x1a", ["a"]) is None, "malformed: Python's"


@pytest.mark.parametrize("size", [1, 2, 511, 512, 513, 1500])
def test_event_ids_of_a_transaction_in_blocks(size: int) -> None:
    from tailrace.events import EventIds

    ids = EventIds("pg1", "1A", 1_795_516_444_951, size)
    order = [*range(size), 0, size - 1, size // 2]  # in order, then a few again
    assert [ids(i) for i in order] == [event_id("pg1", "1A", i, 1_795_516_444_951)
                                       for i in order]
