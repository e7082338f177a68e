"""What every sink shares: routing, replay skipping, checkpoint naming."""

from __future__ import annotations

from collections.abc import Sequence

from tailrace.events import ChangeEvent, Position, position_key
from tailrace_services.delivery.sinks.base import BatchCommit
from tailrace_services.delivery.sinks.templates import render

NO_POSITION = (-1, -1)


def destination(template: str, event: ChangeEvent) -> str:
    """The topic/stream/subject/table of `event`: a `route` processor's template wins."""
    return render(getattr(event, "route", "") or template, event)


def fresh_indexes(events: Sequence[ChangeEvent], stored: Position | None) -> list[int]:
    """Indexes of the events past the stored checkpoint: what a replayed batch still has to write."""
    mark = position_key(stored) if stored is not None else NO_POSITION
    return [i for i, e in enumerate(events) if position_key(e.position) > mark]


def advances(commit: BatchCommit, stored: Position | None) -> bool:
    """True when the batch's checkpoint is past the stored one (it must be written)."""
    return stored is None or position_key(commit.position) > position_key(stored)


def stored_sink_id(sink_id: str, rewind: int = 0) -> str:
    """The sink's name for the checkpoint it stores beside the data: its id, and after an
    operator's rewind or reset `{id}#rewind{n}`, so what it stored before the rewind is not
    taken for progress (the sink receives again what it already had)."""
    return sink_id if not rewind else f"{sink_id}#rewind{rewind}"


def checkpoint_name(pipeline: str, sink_id: str, partition: int, sep: str = ":",
                    rewind: int = 0) -> str:
    """`{pipeline}{sep}{sink}{sep}{partition}`: one checkpoint per bus partition (and per
    rewind generation, see `stored_sink_id`)."""
    return f"{pipeline}{sep}{stored_sink_id(sink_id, rewind)}{sep}{partition}"


def describe(position: Position | None) -> str | None:
    """A one-line form for logs: `tx_seq:event_index`."""
    return None if position is None else f"{position.tx_seq}:{position.event_index}"


def parse_position(raw: bytes | None) -> Position | None:
    if not raw:
        return None
    return Position.FromString(bytes(raw))
