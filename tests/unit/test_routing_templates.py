"""Routing templates read once per template give what formatting each event gives."""

from __future__ import annotations

import pytest

from tailrace.events import ChangeEvent, Op
from tailrace_services.delivery.sinks import templates
from tailrace_services.delivery.sinks._common import destination


def event(table: str = "orders", op: int = Op.OP_INSERT, tenant: str = "",
          database: str = "shop") -> ChangeEvent:
    return ChangeEvent(database=database, schema="public", table=table, op=op, tenant=tenant,
                       source_id="src-1")


def formatted(template: str, e: ChangeEvent) -> str:
    """What `render` gave before templates were kept: the template formatted per event."""
    return template.format_map({"database": e.database, "schema": e.schema, "table": e.table,
                                "op": {Op.OP_INSERT: "insert", Op.OP_DELETE: "delete"}[e.op],
                                "source_id": e.source_id, "tenant": e.tenant})


@pytest.mark.parametrize("template", [
    "cdc.{database}.{table}", "{table}", "plain", "{op}-{table}-{op}", "{tenant}/{source_id}",
    "{schema}.{table:>8}", "{table!r}", "{{literal}}.{table}",
])
def test_each_event_gets_its_own_fields_whatever_was_routed_before(template: str) -> None:
    events = [event("orders"), event("items"), event("orders", Op.OP_DELETE),
              event("orders", tenant="t2"), event("orders", database="shop2"), event("orders")]
    for e in events * 2:  # the second round reads what the first one kept
        assert templates.render(template, e) == formatted(template, e)


def test_a_template_naming_no_event_field_fails_as_formatting_it_does() -> None:
    with pytest.raises(KeyError):
        templates.render("cdc.{nope}", event())
    with pytest.raises(ValueError):
        templates.render("cdc.{table", event())
    with pytest.raises(AttributeError):
        templates.render("cdc.{table.x}", event())


def test_many_tables_past_what_is_kept_still_route_each_to_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(templates, "_KEPT", 3)
    names = [f"t{i}" for i in range(10)]
    for name in names * 2:
        assert templates.render("cdc.{table}", event(name)) == f"cdc.{name}"
        assert templates.render(f"route.{name}.{{op}}", event(name)) == f"route.{name}.insert"


def test_a_route_set_on_the_event_wins_over_the_sink_template() -> None:
    e = event()
    e.route = "outbox.{table}.{{x}}"
    assert destination("cdc.{table}", e) == "outbox.orders.{x}"
    assert destination("cdc.{table}", event("items")) == "cdc.items"
