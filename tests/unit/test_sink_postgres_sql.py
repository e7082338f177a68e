"""The PostgreSQL sink's statements and column types, without a server."""

from __future__ import annotations

from tailrace.events import UNCHANGED_TOAST, Column, Op, Row, value_of
from tailrace_services.delivery.sinks._pg_schema import column_type
from tailrace_services.delivery.sinks.postgres import _statements
from tests.fix_sinks import source_events


def test_column_types_from_postgres_and_mysql_sources() -> None:
    def col(type_: str, value: object = None) -> Column:
        return Column(name="c", type=type_, value=value_of(value))

    assert column_type(col("numeric(12,2)"), "postgres") == "numeric(12,2)"
    assert column_type(col("timestamp with time zone"), "postgres") == "timestamp with time zone"
    assert column_type(col("integer[]", [1]), "postgres") == "jsonb"
    assert column_type(col("mood_enum", "ok"), "postgres") == "text"  # not in the target
    assert column_type(col("decimal(10,2)"), "mysql") == "numeric(10,2)"
    assert column_type(col("bigint(20) unsigned"), "mysql") == "numeric(20,0)"
    assert column_type(col("int unsigned"), "mysql") == "bigint"
    assert column_type(col("varchar(255)"), "mysql") == "character varying(255)"
    assert column_type(col("datetime(6)"), "mysql") == "timestamp without time zone"
    assert column_type(col("timestamp"), "mysql") == "timestamp with time zone"
    assert column_type(col("longblob"), "mysql") == "bytea"
    assert column_type(col("json"), "mysql") == "jsonb"
    assert column_type(col("", 1.5), "mysql") == "double precision"
    assert column_type(col("", None), "mysql") == "text"


def test_statements_keep_order_move_rows_on_key_change_and_skip_unchanged_toast() -> None:
    insert, update = source_events(2, max_tx=1, keys=1)[:1] + source_events(2, max_tx=1)[1:]
    update.op = Op.OP_UPDATE
    update.before.CopyFrom(Row(columns=[Column(name="id", value=value_of(99))]))
    update.after.columns[2].value.CopyFrom(value_of(UNCHANGED_TOAST))
    truncate = source_events(1)[0]
    truncate.op = Op.OP_TRUNCATE
    out = list(_statements([insert, update, truncate], "{table}"))
    assert [(k, cols) for k, _, cols, _ in out] == [
        ("upsert", ("id", "amount", "note", "changed_at", "version")),
        ("move", ("id",)),  # the old row takes the new key: its unsent note goes with it
        ("upsert", ("id", "amount", "changed_at", "version")),  # note stays as it is
        ("truncate", ()),
    ]
    new_id = out[2][3].params[0]
    assert out[1][3].params == [new_id, 99]  # SET id = new WHERE id = old
