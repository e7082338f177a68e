"""The sinks' JSON from C (`_cjson`) is byte-identical to the Python reference.

A difference would be silent: a consumer would read another document, and a message key
that differs sends a row's messages to another partition. So each C function is run
against its Python twin over values of every kind, the edges of each, and random events.
"""

from __future__ import annotations

import json
import math
import random
import struct

import hiredis
import pytest

from tailrace.envelopes import Encoder, cloudevent
from tailrace.events import (
    ChangeEvent,
    Column,
    Op,
    Position,
    PostgresPosition,
    Row,
    Value,
    event_json,
    key_and_event_json,
    key_bytes,
)
from tailrace.events._codec import _py_event_json, _py_key_bytes, cjson, op_name, xadd_commands
from tailrace.proto.event_pb2 import MysqlPosition, SnapshotMark, Timestamp, ValueList

DAY_US = 86_400_000_000
MIN_US, MAX_US = -62_135_596_800_000_000, 253_402_300_799_999_999  # years 1 and 9999

TEXTS = ["", "plain", 'quo"te', "back\\slash", "tab\there", "nl\n cr\r ff\f bs\b",
         "\x00\x01\x1f", "del\x7f", "é ü ß", "日本語", "emoji 😀 𝄞", "\u2028\u2029", "\ud7ff\ue000",
         "/slash/", "'single'"]

VALUES: list[Value] = [
    Value(), Value(null=True), Value(null=False), Value(unchanged_toast=True),
    Value(bool_value=True), Value(bool_value=False),
    *(Value(int_value=n) for n in (0, 1, -1, 2**31, -(2**63), 2**63 - 1)),
    *(Value(uint_value=n) for n in (0, 7, 2**63, 2**64 - 1)),
    *(Value(float_value=x) for x in (0.0, -0.0, 1.5, 0.1, 1e16, 1e22, 1.5e-7, 5e-324, 1e308,
                                     -2.25e300, 123456789.125, math.inf, -math.inf, math.nan)),
    *(Value(decimal_value=d) for d in ("0", "-0", "1.50", "-12.345", "0.000001", "0.0000001",
                                       "0.0000000", "1E+5", "007", "1e-7", "NaN", "Infinity",
                                       "12345678901234567890.123456789", "-0.5", ".5")),
    *(Value(text_value=t) for t in TEXTS),
    *(Value(bytes_value=b) for b in (b"", b"\x00", b"ab", b"abc", b"abcd", bytes(range(256)))),
    *(Value(json_value=j) for j in ('{"a": 1, "b": [true, null, 1.0e2]}', "[]", '"x"',
                                    '{"é": "\\u00e9", "k": {"z": 1, "a": 2}}', "12345678901234567890")),
    *(Value(timestamp_value=Timestamp(epoch_micros=us, with_zone=zone))
      for us in (0, 1, -1, 999_999, 1_700_000_000_123_456, DAY_US - 1, MIN_US, MAX_US)
      for zone in (False, True)),
    *(Value(date_value=d) for d in (0, -1, 19_700, -719_162, 2_932_896)),
    *(Value(time_value=t) for t in (0, 1, 1_000_000, DAY_US - 1, 45_296_000_001)),
    *(Value(uuid_value=u) for u in ("0190a3f2-1b2c-7d3e-8f40-123456789abc",
                                    "0190A3F2-1B2C-7D3E-8F40-123456789ABC",
                                    "{0190a3f2-1b2c-7d3e-8f40-123456789abc}",
                                    "0190a3f21b2c7d3e8f40123456789abc")),
    Value(array_value=ValueList(items=[Value(int_value=1), Value(null=True),
                                       Value(text_value="a")])),
]
# Python raises on these (a date or time outside datetime's range): so must the C path
RAISING: list[Value] = [
    Value(timestamp_value=Timestamp(epoch_micros=MAX_US + 1)),
    Value(timestamp_value=Timestamp(epoch_micros=MIN_US - 1, with_zone=True)),
    Value(date_value=2_932_897), Value(date_value=-719_163), Value(date_value=-(2**31)),
    Value(time_value=-1), Value(time_value=DAY_US), Value(time_value=2**62),
]


def event(op: int = Op.OP_UPDATE, *, after: list[tuple[str, Value]] | None = None,
          before: list[tuple[str, Value]] | None = None, keys: tuple[str, ...] = ("id",),
          native: str = "postgres", **fields: object) -> ChangeEvent:
    e = ChangeEvent(
        id="0190a3f2-1b2c-7d3e-8f40-123456789abc", source_id="src1", tenant="acme",
        database="shop", schema="public", table="orders", op=op, key_columns=keys,
        tx_id="771", tx_index=3, tx_size=9, tx_end=False, schema_version="ab" * 32,
        schema_sequence=4, ts_source_micros=1_700_000_000_000_001,
        ts_captured_micros=1_700_000_000_000_777, idempotency_key="acme|shop.orders|771|x",
    )
    for name, value in fields.items():
        setattr(e, name, value)
    if after is not None:
        e.after.CopyFrom(Row(columns=[Column(name=n, type="t", value=v) for n, v in after]))
    if before is not None:
        e.before.CopyFrom(Row(columns=[Column(name=n, type="t", value=v) for n, v in before]))
    if native == "postgres":
        e.position.CopyFrom(Position(tx_seq=2**64 - 1, event_index=2**32 - 1, postgres=PostgresPosition(
            commit_lsn=0x1_0000_0100, event_lsn=0x1_0000_00f0, timeline=2, xid=771)))
    elif native == "mysql":
        e.position.CopyFrom(Position(tx_seq=12, event_index=0, mysql=MysqlPosition(
            gtid_set="0-1-12,1-2-5", gtid="0-1-12", file="mariadb-bin.000003", offset=4567,
            server_id=2**32 - 1, identity="x")))
    return e


def same(e: ChangeEvent) -> None:
    """Both JSON functions give their Python twin's bytes, or raise what it raises."""
    for fast, reference in ((event_json, _py_event_json), (key_bytes, _py_key_bytes)):
        try:
            expected = reference(e)
        except Exception as error:  # noqa: BLE001 - the C path must raise the same
            with pytest.raises(type(error)):
                fast(e)
            continue
        assert fast(e) == expected, (fast.__name__, e)
    try:  # both from one serialization: the same bytes, or what the first to fail raises
        pair = (_py_key_bytes(e), _py_event_json(e))
    except Exception as error:  # noqa: BLE001 - the shared path must raise the same
        with pytest.raises(type(error)):
            key_and_event_json(e)
        return
    assert key_and_event_json(e) == pair, e


def test_the_c_json_is_built() -> None:
    assert cjson is not None, "tailrace.events._cjson is not built: run `make setup`"


@pytest.mark.parametrize("value", VALUES + RAISING, ids=repr)
def test_every_kind_of_value(value: Value) -> None:
    for op in (Op.OP_INSERT, Op.OP_UPDATE, Op.OP_DELETE):
        same(event(op, after=[("id", value), ("v", value)], before=[("id", value)]))


def test_the_c_path_answers_rather_than_deferring_to_python() -> None:
    """A plain event never reaches the Python fallback: the speed is the point."""
    def refuse(value: bytes) -> str:
        raise AssertionError(f"fallback asked for {Value.FromString(value)}")
    e = event(Op.OP_INSERT, after=[("id", Value(int_value=5)), ("note", Value(text_value="é\n")),
                                   ("amount", Value(decimal_value="12.50")),
                                   ("at", Value(timestamp_value=Timestamp(epoch_micros=5,
                                                                          with_zone=True)))])
    raw = e.SerializeToString()
    assert cjson.event_json(raw, refuse) == _py_event_json(e)
    assert cjson.key_json(raw, refuse) == _py_key_bytes(e)


@pytest.mark.parametrize("text", TEXTS)
def test_strings_in_every_field(text: str) -> None:
    same(event(Op.OP_INSERT, after=[(text or "id", Value(text_value=text))], keys=(text or "id",),
               id=text, source_id=text, tenant=text, database=text, schema=text, table=text,
               ddl=text, tx_id=text, schema_version=text, idempotency_key=text))


@pytest.mark.parametrize("native", ["postgres", "mysql", "none"])
@pytest.mark.parametrize("op", [0, *Op.values(), 99, -3])
def test_ops_positions_and_snapshot_marks(op: int, native: str) -> None:
    e = event(op, after=[("id", Value(int_value=1))], native=native)
    same(e)
    e.snapshot.CopyFrom(SnapshotMark(request_id=2**64 - 1, chunk=7, last=True))
    same(e)


def test_rows_and_keys() -> None:
    one, two = Value(int_value=1), Value(text_value="b")
    same(event(Op.OP_INSERT, after=[]))                                  # no row at all
    same(event(Op.OP_INSERT, after=[("b", two), ("a", one)], keys=("b", "a")))  # sorted keys
    same(event(Op.OP_INSERT, after=[("id", one)], keys=()))              # a table without key
    same(event(Op.OP_UPDATE, after=[("id", one)]))                       # no before image
    same(event(Op.OP_DELETE, before=[("id", one), ("x", two)], keys=("id", "missing")))
    same(event(Op.OP_INSERT, after=[("id", one), ("id", two)]))          # a repeated name
    same(event(Op.OP_INSERT, after=[("ß", one), ("z", two), ("é", one)], keys=("z", "ß", "é")))
    same(event(Op.OP_INSERT, after=[(f"c{i}", one) for i in range(1500)]))  # past MAX_COLUMNS
    same(event(Op.OP_INSERT, after=[("id", one)], keys=tuple(f"k{i}" for i in range(70))))
    same(event(Op.OP_INSERT, after=[("id", one)], schema=""))            # MySQL: no schema


def test_protobuf_merging_is_left_to_python() -> None:
    """A message field sent twice is merged by protobuf; the C side reads no such input and
    says so (None), and `event_json` then gives Python's answer."""
    e = event(Op.OP_INSERT, after=[("id", Value(int_value=1))])
    raw = e.SerializeToString()
    extra = ChangeEvent(after=Row(columns=[Column(name="x", value=Value(int_value=2))]))
    doubled = raw + extra.SerializeToString()
    assert cjson.event_json(doubled, str) is None
    assert cjson.key_json(doubled, str) is None
    # a Value with two kinds set: protobuf keeps the last; the fallback spells it
    two_kinds = (Value(int_value=1).SerializeToString() + Value(text_value="z").SerializeToString())
    column = Column(name="id").SerializeToString() + b"\x1a" + bytes([len(two_kinds)]) + two_kinds
    row = b"\x0a" + bytes([len(column)]) + column
    merged = ChangeEvent.FromString(raw + b"\x4a" + bytes([len(row)]) + row)
    same(merged)


def test_random_events() -> None:
    rng = random.Random(20261124)

    def value() -> Value:
        pick = rng.random()
        if pick < 0.6:
            return rng.choice(VALUES)
        if pick < 0.7:
            return Value(float_value=struct.unpack("<d", rng.randbytes(8))[0])
        if pick < 0.8:
            return Value(timestamp_value=Timestamp(epoch_micros=rng.randint(MIN_US, MAX_US),
                                                   with_zone=rng.random() < 0.5))
        if pick < 0.9:
            return Value(text_value="".join(chr(rng.choice([rng.randint(0, 0x7f),
                                                            rng.randint(0x80, 0xd7ff),
                                                            rng.randint(0xe000, 0x10ffff)]))
                                            for _ in range(rng.randint(0, 12))))
        return Value(decimal_value=f"{rng.randint(-10**12, 10**12)}.{rng.randint(0, 10**6):06d}")

    for _ in range(3000):
        names = rng.sample(["id", "a", "b", "note", "é", "k2"], rng.randint(0, 6))
        keys = tuple(rng.sample(names, min(len(names), rng.randint(0, 2))))
        same(event(rng.choice([*Op.values(), 0]),
                   after=[(n, value()) for n in names] if rng.random() < 0.8 else None,
                   before=[(n, value()) for n in names] if rng.random() < 0.5 else None,
                   keys=keys, native=rng.choice(["postgres", "mysql", "none"])))


def _xadd_reference(e: ChangeEvent, stream: str, trim: tuple[bytes, ...]) -> bytes:
    """What the Redis sink's Python packs for one event (`RedisSink.entries`, `xadd_args`)."""
    fields = {"id": e.id, "op": op_name(e.op), "key": _py_key_bytes(e),
              "idempotency_key": e.idempotency_key, "event": _py_event_json(e)}
    return hiredis.pack_command((b"XADD", stream, *trim, b"*",
                                 *[x for pair in fields.items() for x in pair]))


@pytest.mark.parametrize("trim", [(), (b"MAXLEN", b"~", b"1000")])
def test_redis_xadd_commands_are_what_the_sink_packs(trim: tuple[bytes, ...]) -> None:
    """`xadd_commands` (one C call a batch) against the fields the sink built per event and
    hiredis packed: the same RESP bytes, or None where the JSON is Python's to write."""
    rng = random.Random(20261130)
    events = [event(rng.choice([*Op.values(), 0]), keys=("id",),
                    after=[("id", rng.choice(VALUES)), ("é", rng.choice(VALUES))],
                    before=[("id", rng.choice(VALUES))] if rng.random() < 0.5 else None,
                    native=rng.choice(["postgres", "mysql", "none"]),
                    idempotency_key=f"k{i}", id=f"id-{i}")
              for i in range(400)]
    streams = [rng.choice(["cdc.shop.orders", "cdc.é.x", ""]) for _ in events]
    declined = 0
    for e, stream in zip(events, streams, strict=True):
        got = xadd_commands([e], [stream], trim)
        if got is None:  # only what the single-event C JSON also leaves to Python
            data = e.SerializeToString()
            assert (cjson.key_json(data, lambda _: 1 / 0) is None
                    or cjson.event_json(data, lambda _: 1 / 0) is None), e
            declined += 1
            continue
        assert got == _xadd_reference(e, stream, trim), e
    assert declined < len(events) // 4, "most values are written in C"
    readable = [(e, s) for e, s in zip(events, streams, strict=True)
                if xadd_commands([e], [s], trim) is not None]
    assert xadd_commands([e for e, _ in readable], [s for _, s in readable], trim) == b"".join(
        _xadd_reference(e, s, trim) for e, s in readable)
    assert xadd_commands([], [], trim) == b""


def test_json_documents_keep_pythons_spelling() -> None:
    doc = '{"b": 1, "a": {"y": [1, 2.50, "\\u00e9"], "x": null}, "b": 2}'
    e = event(Op.OP_INSERT, after=[("id", Value(json_value=doc))])
    same(e)
    assert json.loads(event_json(e))["after"]["id"] == {"b": 2, "a": {"y": [1, 2.5, "é"], "x": None}}


def test_cloudevents_splice_the_native_document_in_as_python_would_dump_it() -> None:
    encoder = Encoder("cloudevents")
    for value in VALUES:
        e = event(Op.OP_INSERT, after=[("id", value)])
        expected = json.dumps(cloudevent(e), separators=(",", ":"), ensure_ascii=False).encode()
        assert encoder.encode(e) == expected


def test_errors_are_pythons_in_pythons_order() -> None:
    """When values fail, the C path raises what the twin raises first (found by a fuzzer):
    the twin reads keys in row order and encodes only once the whole document is built."""
    keys_fail = ChangeEvent(op=Op.OP_INSERT, key_columns=["a", "b"], after=Row(columns=[
        Column(name="b", value=Value(decimal_value="x")),
        Column(name="a", value=Value(date_value=3_000_000))]))
    same(keys_fail)
    surrogate_then_bad_uuid = ChangeEvent(op=Op.OP_INSERT, after=Row(columns=[
        Column(name="j", value=Value(json_value='"\\ud800"')),
        Column(name="u", value=Value(uuid_value="x"))]))
    same(surrogate_then_bad_uuid)


def test_deep_arrays_and_empty_names() -> None:
    deep = ChangeEvent(op=Op.OP_INSERT, key_columns=["a"])
    value = deep.after.columns.add(name="a").value
    for _ in range(51):  # past upb's nesting limit for Value.FromString
        value = value.array_value.items.add()
    value.int_value = 1
    same(deep)
    same(ChangeEvent())  # no database, no table, nothing
    assert cjson.key_json(b"", str) == _py_key_bytes(ChangeEvent())
