"""Processors: filter by op/table/expression, transform, route; failures isolated per event."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from tailrace.config import FilterProcessor, RouteProcessor, TransformProcessor
from tailrace.errors import ConfigError
from tailrace.events import ChangeEvent, Column, Op, Row, python_of, value_of
from tailrace_services.delivery.processors import ProcessorChain


def ev(i: int, op: int = Op.OP_INSERT, table: str = "orders", amount: object = None) -> ChangeEvent:
    row = Row(columns=[Column(name="id", value=value_of(i)),
                       Column(name="amount", value=value_of(amount if amount is not None
                                                            else Decimal(f"{i}.50"))),
                       Column(name="name", value=value_of(f"n{i}"))])
    e = ChangeEvent(database="shop", table=table, op=op)
    (e.before if op == Op.OP_DELETE else e.after).CopyFrom(row)
    return e


def cols(e: ChangeEvent) -> dict:
    return {c.name: python_of(c.value) for c in e.after.columns}


def test_filter_by_op_table_and_expression():
    chain = ProcessorChain([
        FilterProcessor(type="filter", ops=["insert", "update"]),
        FilterProcessor(type="filter", tables=["shop.ord%"]),
        FilterProcessor(type="filter", where="amount > 2 AND name != 'n4'"),
    ])
    events = [ev(1), ev(2, Op.OP_DELETE), ev(3), ev(4), ev(5, table="items"), ev(6)]
    kept, failed = chain.apply(events)
    assert [python_of(e.after.columns[0].value) for e in kept] == [3, 6] and failed == []


def test_transform_set_drop_rename_and_route():
    chain = ProcessorChain([
        TransformProcessor(type="transform", set={"amount_cents": "amount * 100",
                                                  "label": "upper(name)"},
                           drop=["name"], rename={"id": "order_id"}),
        RouteProcessor(type="route", to="cdc.{database}.{table}.v2"),
    ])
    kept, failed = chain.apply([ev(7)])
    assert failed == []
    assert cols(kept[0]) == {"order_id": 7, "amount": Decimal("7.50"), "amount_cents": Decimal("750.00"),
                             "label": "N7"}
    assert kept[0].route == "cdc.{database}.{table}.v2"


def test_a_failing_event_is_isolated():
    chain = ProcessorChain([FilterProcessor(type="filter", where="amount / 1 > 0")])
    events = [ev(1), ev(2, amount="not a number"), ev(3)]
    kept, failed = chain.apply(events)
    assert kept == [ev(1), ev(3)], "the others pass through unchanged"
    assert [event for event, _ in failed] == [events[1]]
    assert re.fullmatch(r"filter where 'amount / 1 > 0': ExecuteError: Step '.+' failed: "
                        r"unsupported operand type\(s\) for /: 'str' and 'int'", failed[0][1])


def test_a_bad_expression_cannot_make_a_spec():
    with pytest.raises(ValueError, match="not a valid Spark SQL expression 'amount >>> AND'"):
        FilterProcessor(type="filter", where="amount >>> AND")


def test_a_chain_refuses_what_its_evaluator_cannot_run_naming_the_field():
    """A worker compiles the spec's expressions again; one its evaluator refuses (a worker
    whose sqlglot differs from the driver's) is a configuration error, never a per-event
    failure."""
    unchecked = TransformProcessor.model_construct(type="transform", set={"v": "nosuch(id)"},
                                                   drop=[], rename={})
    with pytest.raises(ConfigError, match=r"^spec\.processors\[1\]\.set\.v: not supported by "
                                          r"the processor evaluator .*NOSUCH"):
        ProcessorChain([RouteProcessor(type="route", to="x"), unchecked])


def outbox_row(i: int, op: int = Op.OP_INSERT, aggregate: str | None = "Order", table: str = "outbox"
               ) -> ChangeEvent:
    from tailrace.events._values import Json

    row = Row(columns=[
        Column(name="id", value=value_of(f"evt-{i}")),
        Column(name="aggregatetype", value=value_of(aggregate)),
        Column(name="aggregateid", value=value_of(100 + i % 2)),
        Column(name="type", value=value_of("OrderCreated")),
        Column(name="payload", value=value_of(Json(f'{{"n": {i}}}')) if i else value_of(None))])
    e = ChangeEvent(database="shop", schema="public", table=table, op=op)
    (e.before if op == Op.OP_DELETE else e.after).CopyFrom(row)
    return e


def test_outbox_inserts_become_their_messages_and_the_rest_of_the_outbox_table_is_dropped():
    from tailrace.config import OutboxProcessor
    from tailrace.envelopes import Encoder
    from tailrace_services.delivery.sinks._common import destination

    chain = ProcessorChain([OutboxProcessor(type="outbox", table="public.outbox",
                                            additional_fields={"type": "eventType"})])
    events = [outbox_row(1), outbox_row(2, Op.OP_UPDATE), outbox_row(3, Op.OP_DELETE),
              outbox_row(4, Op.OP_SNAPSHOT_READ), ev(5), outbox_row(6, aggregate="Odd{x}"),
              outbox_row(0)]
    kept, failed = chain.apply(events)
    assert failed == []
    assert [(e.table, e.op) for e in kept] == [("outbox", Op.OP_INSERT), ("orders", Op.OP_INSERT),
                                               ("outbox", Op.OP_INSERT), ("outbox", Op.OP_INSERT)]
    first, business, odd, null = kept
    assert destination("cdc.{table}", first) == "outbox.event.Order"
    assert destination("cdc.{table}", odd) == "outbox.event.Odd{x}", "a value's braces stay"
    assert destination("cdc.{table}", business) == "cdc.orders", "other tables pass unchanged"
    [record] = Encoder("native").records(first)
    assert (record.key, record.value) == (b"101", b'{"n": 1}')
    assert record.headers == (("id", b"evt-1"), ("eventType", b"OrderCreated"))
    assert null.outbox.payload == b"null"


def test_an_outbox_row_without_the_named_column_fails_alone():
    from tailrace.config import OutboxProcessor

    chain = ProcessorChain([OutboxProcessor(type="outbox", table="public.outbox",
                                            key="aggregate_id")])
    kept, failed = chain.apply([outbox_row(1), ev(2)])
    assert [e.table for e in kept] == ["orders"]
    assert "no column 'aggregate_id'" in failed[0][1]


@pytest.mark.parametrize("aggregate", [None, ""])
def test_an_outbox_row_with_no_route_by_value_fails_alone(aggregate):
    """No topic `outbox.event.`: the row goes to the DLQ with a reason, the rest flows."""
    from tailrace.config import OutboxProcessor

    chain = ProcessorChain([OutboxProcessor(type="outbox", table="public.outbox")])
    kept, failed = chain.apply([outbox_row(1, aggregate=aggregate), outbox_row(2), ev(3)])
    assert [(e.table, e.route) for e in kept] == [("outbox", "outbox.event.Order"),
                                                  ("orders", "")]
    [(event, reason)] = failed
    assert "aggregatetype (route_by) is empty or NULL" in reason
