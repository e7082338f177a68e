"""What every sink shares: routing, replay skipping, checkpoint naming."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence

from tailrace.events import ChangeEvent, Position, position_key
from tailrace_services.delivery.sinks.base import BatchCommit
from tailrace_services.delivery.sinks.templates import compiled, render


def destination(template: str, event: ChangeEvent) -> str:
    """The topic/stream/subject/table of `event`: a `route` processor's template wins."""
    return render(getattr(event, "route", "") or template, event)


def routing(template: str) -> Callable[[ChangeEvent], str]:
    """`destination` for a loop over a batch's events: `template` looked up once."""
    default = compiled(template).render

    def route(event: ChangeEvent) -> str:
        own = event.route
        return render(own, event) if own else default(event)

    return route


def fresh_indexes(events: Sequence[ChangeEvent], stored: Position | None,
                  ascending: bool = False) -> list[int]:
    """Indexes of the events past the stored checkpoint: what a replayed batch still has to
    write. `ascending`: the events ascend by position (`BatchCommit.ascending`), so those
    are the last ones, found by bisection."""
    if stored is None:
        return list(range(len(events)))
    mark = position_key(stored)
    if ascending:
        return list(range(bisect_right(events, mark, key=_position_key), len(events)))
    return [i for i, e in enumerate(events) if position_key(e.position) > mark]


def _position_key(event: ChangeEvent) -> tuple[int, int]:
    return position_key(event.position)


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
