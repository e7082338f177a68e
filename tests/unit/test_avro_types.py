"""Source column types to Avro, and values to Avro data (the Kafka sink's `format: avro`)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from tailrace.events import Column, Value, value_of
from tailrace_services.delivery.sinks._avro import _datum, avro_name, avro_type, converter


@pytest.mark.parametrize(("source", "avro"), [
    ("integer", {"type": "int"}), ("smallint", {"type": "int"}), ("int", {"type": "int"}),
    ("int unsigned", {"type": "long"}), ("bigint", {"type": "long"}),
    ("bigint unsigned", {"type": "bytes", "logicalType": "decimal", "precision": 20,
                         "scale": 0}),
    ("numeric(12,2)", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}),
    ("decimal(10,0)", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 0}),
    ("numeric", {"type": "string"}),
    ("timestamp with time zone", {"type": "long", "logicalType": "timestamp-micros"}),
    ("timestamp(3) with time zone", {"type": "long", "logicalType": "timestamp-micros"}),
    ("timestamp without time zone", {"type": "long", "logicalType": "local-timestamp-micros"}),
    ("timestamp", {"type": "long", "logicalType": "timestamp-micros"}),  # MySQL's: UTC
    ("timestamp(6)", {"type": "long", "logicalType": "timestamp-micros"}),
    ("datetime(6)", {"type": "long", "logicalType": "local-timestamp-micros"}),
    ("date", {"type": "int", "logicalType": "date"}),
    ("time without time zone", {"type": "long", "logicalType": "time-micros"}),
    ("boolean", {"type": "boolean"}), ("double precision", {"type": "double"}),
    ("real", {"type": "float"}), ("uuid", {"type": "string", "logicalType": "uuid"}),
    ("bytea", {"type": "bytes"}), ("longblob", {"type": "bytes"}),
    ("jsonb", {"type": "string", "connect.name": "io.debezium.data.Json"}),
    ("character varying(20)", {"type": "string"}), ("interval", {"type": "string"}),
    ("integer[]", {"type": "array", "items": ["null", {"type": "int"}]}),
])
def test_each_source_type_has_its_avro_type(source: str, avro: dict[str, object]) -> None:
    assert avro_type(source) == avro


def test_values_become_avro_data_and_what_does_not_fit_fails_naming_the_column() -> None:
    money = avro_type("numeric(12,2)")
    assert converter(money, "total")(Value(decimal_value="12.5")) == Decimal("12.50")
    with pytest.raises(ValueError, match="column total: NaN"):
        converter(money, "total")(Value(decimal_value="NaN"))
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    stamp = converter(avro_type("timestamptz"), "at")(value_of(when))
    assert stamp == int(when.timestamp()) * 1_000_000
    toast = Column(name="big", type="text", value=Value(unchanged_toast=True))
    assert _datum(toast, avro_type("text"), converter(avro_type("text"), "big")) == \
        "__debezium_unavailable_value"
    toast_array = Column(name="tags", type="integer[]", value=Value(unchanged_toast=True))
    with pytest.raises(ValueError, match="tags: an unchanged TOAST value.*REPLICA IDENTITY FULL"):
        _datum(toast_array, avro_type("integer[]"), converter(avro_type("integer[]"), "tags"))
    assert _datum(Column(name="n", type="int", value=value_of(None)), avro_type("int"),
                  converter(avro_type("int"), "n")) is None


def test_names_are_avro_names() -> None:
    assert avro_name("order-lines") == "order_lines"
    assert avro_name("2fa") == "_2fa"


@pytest.mark.parametrize("source, text", [
    ("timestamp with time zone", "infinity"), ("timestamp without time zone", "-infinity"),
    ("date", "infinity"), ("date", "0044-03-15 BC"), ("time without time zone", "24:00:00")])
def test_a_value_kept_as_text_fails_its_event_instead_of_reading_as_zero(
        source: str, text: str) -> None:
    """PostgreSQL keeps what has no timestamp/date/time form as text; an unset field of the
    expected kind would be 0 (1970-01-01) in Avro, JSON Schema and Protobuf alike."""
    with pytest.raises(ValueError, match=f"column c: '{text}' has no"):
        converter(avro_type(source), "c")(Value(text_value=text))


def test_decimals_are_written_as_plain_text() -> None:
    from tailrace_services.delivery.sinks._avro import plain_decimal

    assert plain_decimal(Decimal("0E-10")) == "0.0000000000"
    assert plain_decimal(Decimal("1.000E-7")) == "0.0000001000"
    assert plain_decimal(Decimal("-12.50")) == "-12.50"
