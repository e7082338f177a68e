"""Event ids, idempotency keys, typed values and the bus codec."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

from tailrace.events import (
    UNCHANGED_TOAST,
    ChangeEvent,
    Column,
    Op,
    Row,
    decode_record,
    encode_event,
    event_id,
    event_to_json_dict,
    idempotency_key,
    key_bytes,
    python_of,
    value_of,
)


def test_event_id_is_deterministic_uuid7():
    a = event_id("src", "16B3A48", 3, 1_700_000_000_000)
    assert a == event_id("src", "16B3A48", 3, 1_700_000_000_000)
    assert a != event_id("src", "16B3A48", 4, 1_700_000_000_000)
    u = uuid.UUID(a)
    assert u.version == 7
    assert int(a.replace("-", "")[:12], 16) == 1_700_000_000_000


def test_idempotency_key_format():
    assert idempotency_key("acme", "shop", "orders", "42", "e1") == "acme|shop.orders|42|e1"


def test_values_round_trip_exactly():
    samples = [
        None, True, 7, 2**64 - 1, 1.5, Decimal("12345678901234567890.123456789"), "text",
        b"\x00\xff", dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.UTC),
        dt.datetime(2024, 1, 1, 12, 0), dt.date(1999, 12, 31), dt.time(13, 14, 15, 16),
        uuid.UUID(int=5), [1, None, 3],
    ]
    for obj in samples:
        assert python_of(value_of(obj)) == obj
    assert python_of(value_of(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert value_of(None) != value_of(UNCHANGED_TOAST)


def test_codec_round_trip_and_key_is_primary_key():
    ev = ChangeEvent(database="db", schema="public", table="t", op=Op.OP_UPDATE,
                     key_columns=["id"],
                     before=Row(columns=[Column(name="id", value=value_of(1))]),
                     after=Row(columns=[Column(name="id", value=value_of(1)),
                                        Column(name="v", value=value_of(Decimal("1.10")))]))
    assert decode_record(encode_event(ev)).event == ev
    assert key_bytes(ev) == b'{"pk":{"id":1},"table":"db.public.t"}'
    assert event_to_json_dict(ev)["after"] == {"id": 1, "v": "1.10"}
