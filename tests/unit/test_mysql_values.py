"""Binlog values -> typed values, and table shapes from table maps and from the catalog."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pytest
from pymysqlreplication.column import Column as LibColumn
from pymysqlreplication.constants import FIELD_TYPE

from tailrace.errors import FatalError
from tailrace.events import python_of
from tailrace_services.capture_mysql.schema import (
    ColumnShape,
    TableShape,
    catalog_type,
    fingerprint,
    shape_from_table_map,
)
from tailrace_services.capture_mysql.values import RowDecoder


def col(name: str | None, t: int, **kw: Any) -> LibColumn:
    base = {"name": name, "type": t, "unsigned": False, "is_primary": False,
            "character_set_name": None, "enum_values": None, "set_values": None}
    return LibColumn(**{**base, **kw})


COLUMNS = [
    col("id", FIELD_TYPE.LONGLONG, unsigned=True, is_primary=True),
    col("d", FIELD_TYPE.NEWDECIMAL, precision=30, decimals=10),
    col("f", FIELD_TYPE.FLOAT),
    col("dt", FIELD_TYPE.DATETIME2, fsp=6),
    col("ts", FIELD_TYPE.TIMESTAMP2, fsp=6),
    col("tm", FIELD_TYPE.TIME2, fsp=3),
    col("y", FIELD_TYPE.YEAR, unsigned=True),
    col("e", FIELD_TYPE.ENUM, enum_values=["", "a", "b"], character_set_name="utf8"),
    col("st", FIELD_TYPE.SET, set_values=["x", "y", "z"], character_set_name="utf8"),
    col("b1", FIELD_TYPE.BIT, bits=1),
    col("b", FIELD_TYPE.BIT, bits=10),
    col("bn", FIELD_TYPE.STRING, character_set_name="binary", max_length=4),
    col("u", FIELD_TYPE.STRING, character_set_name="binary", max_length=16),
    col("ip", FIELD_TYPE.STRING, character_set_name="binary", max_length=16),
    col("j", FIELD_TYPE.BLOB, character_set_name="utf8", length_size=4),
    col("mj", FIELD_TYPE.JSON, length_size=4),
    col("txt", FIELD_TYPE.VARCHAR, character_set_name="utf8", max_length=256),
]
HINTS = {"u": "uuid", "ip": "inet6", "j": "json"}


def decode(values: dict[str, Any], none_sources: dict[str, str] | None = None) -> dict[str, Any]:
    shape = shape_from_table_map("shop", "t", COLUMNS, HINTS)
    row = RowDecoder(shape).row(values, none_sources)
    return {c.name: python_of(c.value) for c in row.columns}


def test_types_are_named_alike_from_table_map_and_catalog() -> None:
    shape = shape_from_table_map("shop", "t", COLUMNS, HINTS)
    names = {c.name: c.type for c in shape.columns}
    assert names == {
        "id": "bigint unsigned", "d": "decimal(30,10)", "f": "float", "dt": "datetime(6)",
        "ts": "timestamp(6)", "tm": "time(3)", "y": "year", "e": "enum('a','b')",
        "st": "set('x','y','z')", "b1": "bit(1)", "b": "bit(10)", "bn": "binary", "u": "uuid",
        "ip": "inet6", "j": "json", "mj": "json", "txt": "varchar"}
    catalog = {"bigint(20) unsigned": "bigint unsigned", "decimal(30,10)": "decimal(30,10)",
               "datetime(6)": "datetime(6)", "timestamp(6)": "timestamp(6)", "year(4)": "year",
               "enum('a','b')": "enum('a','b')", "bit(10)": "bit(10)", "binary(4)": "binary",
               "varchar(64)": "varchar", "int(11)": "int", "longtext": "longtext",
               "datetime": "datetime", "tinyint(1)": "tinyint"}
    for column_type, expected in catalog.items():
        data_type = column_type.split("(")[0].split()[0]
        assert catalog_type(column_type, data_type, False) == expected
    assert catalog_type("longtext", "longtext", True) == "json"
    assert list(shape.key_columns) == ["id"]


def test_a_table_without_a_primary_key_has_no_key_columns() -> None:
    """Never every column: Kafka would scatter one row's versions over partitions."""
    shape = TableShape("shop", "t", (ColumnShape("a", "int", False),
                                     ColumnShape("b", "varchar", False)))
    assert shape.key_columns == ()


def test_values_decode_exactly() -> None:
    out = decode({
        "id": 2**64 - 1, "d": Decimal("12345678901234567890.0123456789"), "f": 1.100000023841858,
        "dt": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
        "ts": dt.datetime(2024, 1, 2, 1, 4, 5, 654321), "tm": -dt.timedelta(hours=12,
                                                                            microseconds=789000),
        "y": 2024, "e": "b", "st": {"z", "x"}, "b1": "1", "b": "1010101011", "bn": b"\x00\xff",
        "u": bytes.fromhex("123e4567e89b12d3a456426614174000").rstrip(b"\x00"),
        "ip": b"\x00" * 10 + b"\xff\xff\x01\x02\x03\x04", "j": '{"a": [1, 2.5]}',
        "mj": {b"k": [1, b"v", None]}, "txt": "héllo"})
    assert out["id"] == 2**64 - 1
    assert out["d"] == Decimal("12345678901234567890.0123456789")
    assert out["f"] == 1.1
    assert out["dt"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)  # naive: no zone
    assert out["ts"] == dt.datetime(2024, 1, 2, 1, 4, 5, 654321, tzinfo=dt.UTC)
    assert out["tm"] == -dt.timedelta(hours=12, microseconds=789000)
    assert out["st"] == "x,z" and out["e"] == "b"
    assert out["b1"] is True and out["b"] == 0b1010101011
    assert out["bn"] == b"\x00\xff\x00\x00"  # BINARY(4) padding restored
    assert out["u"] == uuid.UUID("123e4567-e89b-12d3-a456-426614174000")
    assert out["ip"] == "::ffff:1.2.3.4"
    assert out["j"] == '{"a": [1, 2.5]}' and out["mj"] == '{"k":[1,"v",null]}'
    assert out["txt"] == "héllo"


def test_nulls_empty_set_and_zero_year() -> None:
    values = {c.name: None for c in COLUMNS} | {"id": 1, "y": 1900}
    out = decode(values, {"st": "empty set", "e": "null"})
    assert out["st"] == "" and out["e"] is None and out["y"] == 0 and out["d"] is None


def test_empty_binary_values_stay_bytes() -> None:
    """The library hands '' for an empty binary value (Python decodes b"" without looking its
    codec up): the nil UUID (stored as nothing) stopped capture, an empty BINARY(n) or
    VARBINARY came out as text."""
    values = {c.name: None for c in COLUMNS} | {"id": 1, "bn": "", "u": "", "ip": ""}
    out = decode(values)
    assert out["bn"] == b"\x00" * 4
    assert out["u"] == uuid.UUID(int=0)
    assert out["ip"] == "::"
    vb = shape_from_table_map("s", "t", [col("vb", FIELD_TYPE.VARCHAR, max_length=20,
                                              character_set_name="binary")], {})
    row = RowDecoder(vb).row({"vb": ""})
    assert python_of(row.columns[0].value) == b""


def test_a_table_map_without_names_is_refused() -> None:
    with pytest.raises(FatalError, match="binlog_row_metadata must be FULL"):
        shape_from_table_map("shop", "t", [col(None, FIELD_TYPE.LONG)], {})


def test_fingerprint_follows_names_types_and_keys() -> None:
    a = shape_from_table_map("s", "t", [col("id", FIELD_TYPE.LONG, is_primary=True)], {})
    b = shape_from_table_map("s", "t", [col("id2", FIELD_TYPE.LONG, is_primary=True)], {})
    c = shape_from_table_map("s", "t", [col("id", FIELD_TYPE.LONG)], {})
    assert len({fingerprint(a), fingerprint(b), fingerprint(c)}) == 3
    assert fingerprint(a) == fingerprint(
        shape_from_table_map("s", "t", [col("id", FIELD_TYPE.LONG, is_primary=True)], {}))


def test_a_given_key_keys_a_table_without_its_own_and_leaves_the_fingerprint() -> None:
    """`snapshot.key_columns` (`TableShape.given_key`): the key of a table without a primary
    key that has every one of its columns; never over a primary key; not fingerprinted."""
    host, seq = col("host", FIELD_TYPE.VARCHAR), col("seq", FIELD_TYPE.LONG)
    keyless = shape_from_table_map("s", "logs", [host, seq], {})
    given = shape_from_table_map("s", "logs", [host, seq], {}, ["seq", "host"])
    assert keyless.key_columns == () and given.key_columns == ("seq", "host")
    assert fingerprint(given) == fingerprint(keyless)
    assert shape_from_table_map("s", "logs", [host], {}, ["seq", "host"]).key_columns == ()
    own = shape_from_table_map("s", "logs", [host, col("seq", FIELD_TYPE.LONG, is_primary=True)],
                               {}, ["host"])
    assert own.key_columns == ("seq",)


def test_snapshot_read_encoders_give_what_the_binlog_path_gives() -> None:
    """`read_encoders` (a snapshot's rows through `chunk_rows`) against `row` on the
    binlog library's values: a MySQL JSON `null` is NULL in both, a UUID's text taken as it
    is equals the converted one."""
    from tailrace.events._wire import NULL
    from tailrace_services.capture.snapshot import chunk_rows
    from tailrace_services.capture_mysql.snapshot import binlog_form

    shape = TableShape("shop", "t", (ColumnShape("id", "bigint", True, FIELD_TYPE.LONGLONG),
                                     ColumnShape("j", "json", False, FIELD_TYPE.JSON),
                                     ColumnShape("u", "uuid", False, FIELD_TYPE.STRING,
                                                 max_length=16)))
    decoder = RowDecoder(shape)
    kinds, encoders = decoder.read_encoders([binlog_form(c.type, "mysql")
                                             for c in shape.columns])
    u = uuid.UUID(int=12345)
    for read, streamed in ([(1, "null", str(u)), {"id": 1, "j": None, "u": u.bytes}],
                           [(2, '{"a": 1}', str(u).upper()), {"id": 2, "j": {"a": 1},
                                                               "u": u.bytes}]):
        rows = chunk_rows([read], kinds, encoders, tuple(decoder.prefixes), (0,), (0,), b"h")
        [(_, row)] = rows.values()
        assert row == decoder.row(streamed).SerializeToString(), read
    assert encoders[1]("null") == NULL


def test_an_event_parsed_from_its_template_equals_one_built_field_by_field() -> None:
    from tailrace.events import ChangeEvent, Op
    from tailrace_services.capture_mysql.events import EventFactory

    shape = shape_from_table_map("shop", "t", COLUMNS, HINTS)
    decoder, factory = RowDecoder(shape), EventFactory("src", "acme")
    row = {"id": 7, "txt": "é", "y": 2024}
    for op, before, after in ((Op.OP_INSERT, None, row), (Op.OP_UPDATE, row, row),
                              (Op.OP_DELETE, row, None)):
        for sequence in (1, 2, 1):
            built = factory.template(shape, sequence, op).change(
                b"", decoder.row_bytes(before), decoder.row_bytes(after)).event()
            expected = ChangeEvent(
                source_id="src", tenant="acme", database="shop", table="t", op=op,
                before=decoder.row(before), after=decoder.row(after),
                key_columns=shape.key_columns, schema_version=shape.fingerprint,
                schema_sequence=sequence)
            assert built.SerializeToString() == expected.SerializeToString(), (op, sequence)
