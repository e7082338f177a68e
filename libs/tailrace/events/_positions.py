"""Ordering of source positions: (tx_seq, event_index) is total within one source."""

from __future__ import annotations

from tailrace.proto.event_pb2 import Position


def position_key(position: Position) -> tuple[int, int]:
    return (position.tx_seq, position.event_index)


def position_le(a: Position, b: Position) -> bool:
    """True when `a` is at or before `b`."""
    return position_key(a) <= position_key(b)
