"""Routing templates: `cdc.{database}.{table}` filled from the event.

Every event of a batch is routed, so a template is read once: the names it uses are
looked up on the event, and the text made for those values is kept (a batch touches few
tables), instead of formatting the template again for each event.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from string import Formatter
from typing import Any

from tailrace.events._codec import op_name
from tailrace.proto.event_pb2 import ChangeEvent

_FIELDS: dict[str, Callable[[ChangeEvent], str]] = {
    "database": lambda e: e.database,
    "schema": lambda e: e.schema,
    "table": lambda e: e.table,
    "op": lambda e: op_name(e.op),
    "source_id": lambda e: e.source_id,
    "tenant": lambda e: e.tenant,
}
_KEPT_PER_TEMPLATE = 4096  # texts kept per template; past it the template starts afresh


class _Template:
    """One template: the event fields it names, and the texts made so far."""

    def __init__(self, template: str) -> None:
        self.template = template
        names = [name for _, name, _, _ in Formatter().parse(template) if name is not None]
        # only plain names of the known fields take the short way; anything else
        # ({0}, {table.x}, {unknown}) is formatted as written, and fails as it did
        self.plain = all(name in _FIELDS for name in names)
        # the named fields as they are on the event (`op` its number), read in one call
        fields = list(dict.fromkeys(names))
        self.values: Callable[[ChangeEvent], Any] = (
            attrgetter(*fields) if fields else lambda _: ())
        self.made: dict[Any, str] = {}

    def render(self, event: ChangeEvent) -> str:
        if not self.plain:
            return _format(self.template, event)
        values = self.values(event)
        text = self.made.get(values)
        if text is None:
            if len(self.made) >= _KEPT_PER_TEMPLATE:
                self.made.clear()
            text = self.made[values] = _format(self.template, event)
        return text


_TEMPLATES: dict[str, _Template] = {}


def render(template: str, event: ChangeEvent) -> str:
    compiled = _TEMPLATES.get(template)
    if compiled is None:
        if len(_TEMPLATES) >= _KEPT_PER_TEMPLATE:  # routes made by a processor, per event
            _TEMPLATES.clear()
        compiled = _TEMPLATES[template] = _Template(template)
    return compiled.render(event)


def _format(template: str, event: ChangeEvent) -> str:
    return template.format_map({name: get(event) for name, get in _FIELDS.items()})
