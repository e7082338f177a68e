"""Routing templates: `cdc.{database}.{table}` filled from the event.

Every event of a batch is routed, so a template is read once: the names it uses are
looked up on the event, and the text made for those values is kept (a batch touches few
tables), instead of formatting the template again for each event.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from operator import attrgetter
from string import Formatter
from typing import Any

from tailrace.events._codec import op_name
from tailrace.proto.event_pb2 import ChangeEvent

_KEPT = 4096  # texts kept per template, and templates kept (a route processor's are many)


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
            if len(self.made) >= _KEPT:
                self.made.clear()
            text = self.made[values] = _format(self.template, event)
        return text


@functools.lru_cache(maxsize=_KEPT)
def compiled(template: str) -> _Template:
    """The template read once (kept): `render` it for each event of a loop."""
    return _Template(template)


def render(template: str, event: ChangeEvent) -> str:
    return compiled(template).render(event)


def _format(template: str, event: ChangeEvent) -> str:
    return template.format_map(_fields(event))


def _fields(event: ChangeEvent) -> dict[str, str]:
    """What a template may name, as it reads in the text."""
    return {
        "database": event.database,
        "schema": event.schema,
        "table": event.table,
        "op": op_name(event.op),
        "source_id": event.source_id,
        "tenant": event.tenant,
    }


_FIELDS = frozenset(_fields(ChangeEvent()))
