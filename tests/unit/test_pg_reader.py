"""pgoutput v1 and v2 decoding from hand-built protocol bytes, and the text value converters."""

from __future__ import annotations

import datetime as dt
import math
import struct
import uuid
from decimal import Decimal
from typing import Any

import pytest

from tailrace.events import UNCHANGED_TOAST, Value, python_of
from tailrace.events._values import Json
from tailrace_services.capture_postgres.connection import lsn_to_str, str_to_lsn
from tailrace_services.capture_postgres.reader import (
    NULL_VALUE,
    PG_EPOCH_US,
    STREAM_STOP,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgOutputDecoder,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    Truncate,
    TypeInfo,
    Update,
    format_type,
)
from tailrace_services.capture_postgres.values import converter_for, parse_array
from tests.pgoutput import tuple_data

# -- builders for protocol bytes -----------------------------------------------------


def py(values: list[bytes] | None) -> list[Any] | None:
    """A decoded tuple's serialized `Value`s as the Python values they stand for."""
    return None if values is None else [python_of(Value.FromString(v)) for v in values]

INT4, INT8, TEXT, NUMERIC, TIMESTAMPTZ, TIMESTAMP = 23, 20, 25, 1700, 1184, 1114
ENUM_OID, ENUM_ARRAY_OID = 16385, 16384


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def relation_msg(
    oid: int, namespace: str, name: str, columns: list[tuple[str, int, int, bool]], ident: str = "d"
) -> bytes:
    out = b"R" + struct.pack(">I", oid) + cstr(namespace) + cstr(name) + ident.encode()
    out += struct.pack(">H", len(columns))
    for col_name, type_oid, typmod, key in columns:
        out += bytes([1 if key else 0]) + cstr(col_name) + struct.pack(">Ii", type_oid, typmod)
    return out


def pg_ts(unix_us: int) -> int:
    return unix_us - PG_EPOCH_US


ORDERS = relation_msg(
    16400,
    "shop",
    "orders",
    [
        ("id", INT8, -1, True),
        ("amount", NUMERIC, ((12 << 16) | 2) + 4, False),
        ("note", TEXT, -1, False),
        ("at", TIMESTAMPTZ, -1, False),
    ],
)


@pytest.fixture
def decoder() -> PgOutputDecoder:
    dec = PgOutputDecoder()
    dec.decode(ORDERS)
    return dec


# -- messages ------------------------------------------------------------------------


def test_begin_and_commit_convert_pg_epoch_to_unix_micros() -> None:
    dec = PgOutputDecoder()
    unix_us = 1_700_000_000_123_456
    begin = dec.decode(b"B" + struct.pack(">QqI", 0x16B3748, pg_ts(unix_us), 771))
    assert begin == Begin(final_lsn=0x16B3748, commit_ts_us=unix_us, xid=771)
    commit = dec.decode(b"C" + struct.pack(">bQQq", 0, 0x16B3700, 0x16B3748, pg_ts(unix_us)))
    assert commit == Commit(flags=0, commit_lsn=0x16B3700, end_lsn=0x16B3748, commit_ts_us=unix_us)
    assert dt.datetime.fromtimestamp(unix_us / 1e6, dt.UTC).year == 2023


def test_origin_and_type_and_logical_message() -> None:
    dec = PgOutputDecoder()
    assert dec.decode(b"O" + struct.pack(">Q", 42) + cstr("node_a")) == Origin(42, "node_a")
    info = dec.decode(b"Y" + struct.pack(">I", ENUM_OID) + cstr("public") + cstr("mood"))
    assert info == TypeInfo(ENUM_OID, "public", "mood")
    assert dec.types[ENUM_OID] == info
    logical_message = b"M" + b"\x01" + struct.pack(">Q", 1) + cstr("prefix") + b"\0\0\0\0"
    assert dec.decode(logical_message) == LogicalMessage(True, 1, "prefix", b"")
    watermark = (b"M" + b"\x00" + struct.pack(">Q", 0x16B3A28) + cstr("tailrace")
                 + struct.pack(">I", 5) + b"hello")
    assert dec.decode(watermark) == LogicalMessage(False, 0x16B3A28, "tailrace", b"hello")


def test_unknown_message_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown pgoutput message type 'Z'"):
        PgOutputDecoder().decode(b"Z\0\0\0\0")


def with_xid(xid: int, message: bytes) -> bytes:
    """A v1 message as a stream block carries it: its (sub)transaction's xid after its type."""
    return message[:1] + struct.pack(">I", xid) + message[1:]


def test_a_stream_block_s_messages_carry_their_subtransaction_s_xid(
        decoder: PgOutputDecoder) -> None:
    insert = b"I" + struct.pack(">I", 16400) + b"N" + tuple_data("7", "1.50", None, None)
    assert decoder.decode(b"S" + struct.pack(">IB", 900, 1)) == StreamStart(900, True)
    assert decoder.in_block and decoder.xid == 900
    renamed = relation_msg(16400, "shop", "orders2", [("id", INT8, -1, True)])
    assert isinstance(decoder.decode(with_xid(900, renamed)), Relation)
    # the streamed transaction's own until it commits
    assert decoder.stream_relations[900][16400].name == "orders2"
    assert decoder.relations[16400].name == "orders"
    decoder.decode(with_xid(900, ORDERS))  # (DDL in the transaction: its shape again)
    streamed = decoder.decode(with_xid(901, insert))
    assert isinstance(streamed, Insert) and decoder.xid == 901
    assert py(streamed.new) == [7, Decimal("1.50"), None, None]
    truncate = b"T" + struct.pack(">IBI", 1, 0, 16400)
    assert isinstance(decoder.decode(with_xid(902, truncate)), Truncate) and decoder.xid == 902
    assert decoder.decode(b"E") == STREAM_STOP
    assert not decoder.in_block and decoder.xid == 0
    whole = decoder.decode(insert)  # outside a block: no xid
    assert isinstance(whole, Insert) and py(whole.new) == py(streamed.new)
    assert decoder.decode(b"S" + struct.pack(">IB", 900, 0)) == StreamStart(900, False)
    assert isinstance(decoder.decode(with_xid(900, renamed)), Relation)
    one_column = b"I" + struct.pack(">I", 16400) + b"N" + tuple_data("8")
    assert py(decoder.decode(with_xid(900, one_column)).new) == [8]  # type: ignore[union-attr]
    decoder.decode(b"E")
    assert decoder.relations[16400].name == "orders"  # outside the block: the others' shape
    unix_us = 1_700_000_000_123_456
    assert decoder.decode(b"c" + struct.pack(">IbQQq", 900, 0, 0x500, 0x548, pg_ts(unix_us))) \
        == StreamCommit(900, 0, 0x500, 0x548, unix_us)
    assert decoder.relations[16400].name == "orders2"  # committed: everyone's
    assert 900 not in decoder.stream_relations
    assert decoder.decode(b"A" + struct.pack(">II", 900, 901)) == StreamAbort(900, 901)


def test_stream_blocks_out_of_turn_are_errors() -> None:
    with pytest.raises(ValueError, match="StreamStop outside a stream block"):
        PgOutputDecoder().decode(b"E")
    dec = PgOutputDecoder()
    dec.decode(b"S" + struct.pack(">IB", 5, 1))
    with pytest.raises(ValueError, match="StreamStart inside a stream block"):
        dec.decode(b"S" + struct.pack(">IB", 6, 1))


def test_relation_message_is_cached(decoder: PgOutputDecoder) -> None:
    rel = decoder.relations[16400]
    assert (rel.namespace, rel.name, rel.replica_identity) == ("shop", "orders", "d")
    assert [c.name for c in rel.columns] == ["id", "amount", "note", "at"]
    assert [c.is_key for c in rel.columns] == [True, False, False, False]
    assert rel.type_name(1) == "numeric(12,2)"
    assert rel.type_name(3) == "timestamp with time zone"


def test_insert_with_null_and_exact_values(decoder: PgOutputDecoder) -> None:
    payload = b"I" + struct.pack(">I", 16400) + b"N"
    exact, at = "12345678901234567890.123456789", "2024-03-01 10:00:00.5+05:30"
    payload += tuple_data("7", exact, None, at)
    msg = decoder.decode(payload)
    assert isinstance(msg, Insert)
    assert msg.relation.name == "orders"
    ident, amount, note, at = py(msg.new)
    assert ident == 7
    assert isinstance(amount, Decimal)
    assert str(amount) == "12345678901234567890.123456789"
    assert note is None
    assert at == dt.datetime(2024, 3, 1, 4, 30, 0, 500000, tzinfo=dt.UTC)
    assert msg.new[2] == NULL_VALUE  # what the event carries: Value(null)


def test_update_with_unchanged_toast_and_no_old_tuple(decoder: PgOutputDecoder) -> None:
    payload = b"U" + struct.pack(">I", 16400) + b"N"
    payload += tuple_data("7", "1.50", b"u", "2024-03-01 10:00:00+00")
    msg = decoder.decode(payload)
    assert isinstance(msg, Update)
    assert msg.old is None and not msg.old_is_key_only
    assert py(msg.new)[2] is UNCHANGED_TOAST
    assert py(msg.new)[1] == Decimal("1.50") and str(py(msg.new)[1]) == "1.50"


def test_update_with_key_only_old_tuple(decoder: PgOutputDecoder) -> None:
    # The key changed: 'K' carries the old key, other columns are sent as NULL.
    payload = b"U" + struct.pack(">I", 16400) + b"K" + tuple_data("7", None, None, None)
    payload += b"N" + tuple_data("8", "2.00", "x", "2024-03-01 10:00:00-08")
    msg = decoder.decode(payload)
    assert isinstance(msg, Update)
    assert py(msg.old) == [7, None, None, None]
    assert msg.old_is_key_only
    assert py(msg.new)[0] == 8
    assert py(msg.new)[3] == dt.datetime(2024, 3, 1, 18, 0, tzinfo=dt.UTC)


def test_update_with_full_old_tuple() -> None:
    dec = PgOutputDecoder()
    dec.decode(relation_msg(5, "public", "t", [("id", INT4, -1, True), ("v", TEXT, -1, True)], "f"))
    payload = b"U" + struct.pack(">I", 5) + b"O" + tuple_data("1", "old")
    msg = dec.decode(payload + b"N" + tuple_data("1", "new"))
    assert isinstance(msg, Update)
    assert py(msg.old) == [1, "old"] and not msg.old_is_key_only
    assert py(msg.new) == [1, "new"]
    assert msg.relation.replica_identity == "f"


def test_delete_key_only_and_full(decoder: PgOutputDecoder) -> None:
    msg = decoder.decode(b"D" + struct.pack(">I", 16400) + b"K" + tuple_data("7", None, None, None))
    assert isinstance(msg, Delete) and msg.relation is decoder.relations[16400]
    assert py(msg.old) == [7, None, None, None] and msg.old_is_key_only
    full = b"D" + struct.pack(">I", 16400) + b"O" + tuple_data("7", "NaN", "n", "infinity")
    msg = decoder.decode(full)
    assert isinstance(msg, Delete) and not msg.old_is_key_only
    assert py(msg.old)[1].is_nan()
    assert py(msg.old)[2] == "n"
    assert py(msg.old)[3] == "infinity"


def test_truncate(decoder: PgOutputDecoder) -> None:
    decoder.decode(relation_msg(16401, "shop", "items", [("id", INT4, -1, True)]))
    msg = decoder.decode(b"T" + struct.pack(">IB", 2, 3) + struct.pack(">II", 16400, 16401))
    assert isinstance(msg, Truncate)
    assert [r.name for r in msg.relations] == ["orders", "items"]
    assert msg.cascade and msg.restart_identity
    msg = decoder.decode(b"T" + struct.pack(">IB", 1, 0) + struct.pack(">I", 16401))
    assert isinstance(msg, Truncate) and not msg.cascade and not msg.restart_identity


def test_change_before_relation_is_an_error() -> None:
    with pytest.raises(ValueError, match="before its Relation message"):
        PgOutputDecoder().decode(b"I" + struct.pack(">I", 99) + b"N" + tuple_data("1"))


def test_bad_value_names_the_column(decoder: PgOutputDecoder) -> None:
    payload = b"I" + struct.pack(">I", 16400) + b"N" + tuple_data("x", None, None, None)
    with pytest.raises(ValueError, match=r"orders\.id \(bigint\) from b'x'"):
        decoder.decode(payload)


def test_a_tuple_cut_short_is_a_value_error_at_every_byte(decoder: PgOutputDecoder) -> None:
    """What the feed turns into a FatalError naming the LSN (not an IndexError)."""
    payload = b"I" + struct.pack(">I", 16400) + b"N" + tuple_data("7", "1.5", None, b"u")
    for cut in range(6, len(payload)):
        with pytest.raises(ValueError, match="cut short"):
            decoder.decode(payload[:cut])


def test_relation_replaced_after_ddl(decoder: PgOutputDecoder) -> None:
    decoder.decode(relation_msg(16400, "shop", "orders", [("id", INT8, -1, True)]))
    msg = decoder.decode(b"I" + struct.pack(">I", 16400) + b"N" + tuple_data("3"))
    assert isinstance(msg, Insert) and py(msg.new) == [3]


def test_custom_enum_and_its_array() -> None:
    dec = PgOutputDecoder()
    dec.decode(b"Y" + struct.pack(">I", ENUM_OID) + cstr("public") + cstr("mood"))
    dec.decode(b"Y" + struct.pack(">I", ENUM_ARRAY_OID) + cstr("app") + cstr("_mood"))
    rel = dec.decode(
        relation_msg(
            9, "public", "p", [("m", ENUM_OID, -1, False), ("ms", ENUM_ARRAY_OID, -1, False)]
        )
    )
    assert isinstance(rel, Relation)
    assert rel.type_name(0) == "mood"
    assert rel.type_name(1) == "app.mood[]"
    msg = dec.decode(b"I" + struct.pack(">I", 9) + b"N" + tuple_data("happy", '{happy,"very sad"}'))
    assert isinstance(msg, Insert)
    assert py(msg.new) == ["happy", ["happy", "very sad"]]


# -- type names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("oid", "typmod", "expected"),
    [
        (1700, 786438, "numeric(12,2)"),
        (1700, 329730, "numeric(5,-2)"),
        (1700, -1, "numeric"),
        (1043, 24, "character varying(20)"),
        (1043, -1, "character varying"),
        (1042, 7, "character(3)"),
        (1560, 4, "bit(4)"),
        (1562, 9, "bit varying(9)"),
        (1184, 3, "timestamp(3) with time zone"),
        (1114, 0, "timestamp(0) without time zone"),
        (1083, 2, "time(2) without time zone"),
        (1266, -1, "time with time zone"),
        (1186, 2147418115, "interval(3)"),
        (1186, 458751, "interval year to month"),
        (1186, 470286338, "interval day to second(2)"),
        (1186, 134283263, "interval minute"),
        (1231, 786438, "numeric(12,2)[]"),
        (1007, -1, "integer[]"),
        (1185, -1, "timestamp with time zone[]"),
        (3802, -1, "jsonb"),
        (18, -1, '"char"'),
        (16, -1, "boolean"),
        (99999, -1, "oid:99999"),
    ],
)
def test_format_type(oid: int, typmod: int, expected: str) -> None:
    assert format_type(oid, typmod) == expected


# -- values --------------------------------------------------------------------------


def convert(oid: int, text: str) -> object:
    return converter_for(oid)(text)


def test_scalar_values() -> None:
    assert convert(16, "t") is True and convert(16, "f") is False
    assert convert(21, "-32768") == -32768
    assert convert(20, "9223372036854775807") == 9223372036854775807
    assert convert(26, "4294967295") == 4294967295
    assert convert(701, "1.5") == 1.5
    assert math.isnan(convert(701, "NaN"))  # type: ignore[arg-type]
    assert convert(700, "-Infinity") == -math.inf
    assert convert(701, "Infinity") == math.inf
    assert convert(1700, "-0.000000000000000000001") == Decimal("-1E-21")
    assert convert(1700, "Infinity") == Decimal("Infinity")
    assert convert(25, "héllo") == "héllo"
    assert convert(1043, "") == ""
    value = convert(3802, '{"a": [1, 2.50]}')
    assert isinstance(value, Json) and value == '{"a": [1, 2.50]}'
    assert isinstance(convert(114, "[1]"), Json)
    assert convert(17, "\\x00ff10") == b"\x00\xff\x10"
    assert convert(17, "\\x") == b""
    assert convert(17, "a\\\\b\\000") == b"a\\b\x00"  # the escape format, too
    assert convert(2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11") == uuid.UUID(
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    )
    assert convert(1186, "1 year 2 mons 3 days 04:05:06") == "1 year 2 mons 3 days 04:05:06"
    assert convert(1266, "12:00:00+05:30") == "12:00:00+05:30"
    assert convert(869, "10.0.0.1/8") == "10.0.0.1/8"
    assert convert(424242, "(1,2)") == "(1,2)"  # unknown type: text


def test_dates_times_and_timestamps() -> None:
    assert convert(1082, "2024-02-29") == dt.date(2024, 2, 29)
    assert convert(1082, "infinity") == "infinity"
    assert convert(1082, "-infinity") == "-infinity"
    assert convert(1082, "0044-03-15 BC") == "0044-03-15 BC"
    assert convert(1083, "23:59:59.999999") == dt.time(23, 59, 59, 999999)
    assert convert(1083, "24:00:00") == "24:00:00"
    naive = convert(TIMESTAMP, "2024-01-02 03:04:05.25")
    assert naive == dt.datetime(2024, 1, 2, 3, 4, 5, 250000)
    assert isinstance(naive, dt.datetime) and naive.tzinfo is None
    assert convert(TIMESTAMP, "infinity") == "infinity"
    utc = convert(TIMESTAMPTZ, "2024-01-02 03:04:05+00")
    assert isinstance(utc, dt.datetime) and utc.utcoffset() == dt.timedelta(0)
    west = convert(TIMESTAMPTZ, "2024-01-02 03:04:05-08")
    assert west == dt.datetime(2024, 1, 2, 11, 4, 5, tzinfo=dt.UTC)
    lmt = convert(TIMESTAMPTZ, "1800-01-01 00:00:00+05:53:28")
    assert isinstance(lmt, dt.datetime)
    assert lmt.utcoffset() == dt.timedelta(hours=5, minutes=53, seconds=28)
    assert convert(TIMESTAMPTZ, "-infinity") == "-infinity"


@pytest.mark.parametrize(
    ("oid", "text", "expected"),
    [
        (1007, "{}", []),
        (1007, "{1,2,NULL,-4}", [1, 2, None, -4]),
        (1007, "{{1,2},{3,4}}", [[1, 2], [3, 4]]),
        (1007, "{{{1}},{{2}}}", [[[1]], [[2]]]),
        (1007, "[0:1]={5,6}", [5, 6]),
        (1009, '{"a b","c\\"d",NULL,"NULL","x\\\\y","","{}"," lead"}',
         ["a b", 'c"d', None, "NULL", "x\\y", "", "{}", " lead"]),
        (1009, '{{a,b},{NULL,"}"}}', [["a", "b"], [None, "}"]]),
        (1009, "{null,Null}", [None, None]),
        (1231, "{1.50,NaN,12345678901234567890.123456789}",
         [Decimal("1.50"), Decimal("NaN"), Decimal("12345678901234567890.123456789")]),
        (1001, '{"\\\\x01ff",NULL}', [b"\x01\xff", None]),
        (1000, "{t,f}", [True, False]),
        (1020, "{(3,4),(1,2);(1,1),(0,0)}", ["(3,4),(1,2)", "(1,1),(0,0)"]),
        (1115, '{"2024-01-02 03:04:05",infinity}', [dt.datetime(2024, 1, 2, 3, 4, 5), "infinity"]),
    ],
)  # fmt: skip
def test_arrays(oid: int, text: str, expected: list[object]) -> None:
    result = convert(oid, text)
    assert result == [*expected] or _nan_equal(result, expected)


def _nan_equal(result: object, expected: list[object]) -> bool:
    return isinstance(result, list) and [str(x) for x in result] == [str(x) for x in expected]


def test_array_of_timestamptz_and_json() -> None:
    [value] = convert(1185, '{"2024-01-02 03:04:05.5+05:30"}')  # type: ignore[misc]
    assert value == dt.datetime(2024, 1, 1, 21, 34, 5, 500000, tzinfo=dt.UTC)
    [doc] = convert(3807, '{"{\\"a\\": 1}"}')  # type: ignore[misc]
    assert isinstance(doc, Json) and doc == '{"a": 1}'


def test_array_numeric_is_exact() -> None:
    values = convert(1231, "{0.1,0.2}")
    assert isinstance(values, list) and sum(values) == Decimal("0.3")


def test_malformed_array_is_an_error() -> None:
    with pytest.raises(ValueError, match="malformed array literal"):
        parse_array('{"a"x}')


# -- LSNs ----------------------------------------------------------------------------


def test_lsn_text_round_trip() -> None:
    assert lsn_to_str(0) == "0/0"
    assert lsn_to_str(0x16B3748) == "0/16B3748"
    assert lsn_to_str((0xA << 32) | 0xFF) == "A/FF"
    assert str_to_lsn("A/FF") == (0xA << 32) | 0xFF
    assert str_to_lsn(lsn_to_str(2**64 - 1)) == 2**64 - 1
    for bad in ("", "16B3748", "x/1", "0/", "123456789/0"):
        with pytest.raises(ValueError, match="invalid LSN"):
            str_to_lsn(bad)
