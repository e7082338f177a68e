"""Routing templates: `cdc.{database}.{table}` filled from the event."""

from __future__ import annotations

from tailrace.events._codec import op_name
from tailrace.proto.event_pb2 import ChangeEvent


def render(template: str, event: ChangeEvent) -> str:
    return template.format_map({
        "database": event.database,
        "schema": event.schema,
        "table": event.table,
        "op": op_name(event.op),
        "source_id": event.source_id,
        "tenant": event.tenant,
    })
