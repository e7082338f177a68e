"""Ordering of source positions: (tx_seq, event_index) is total within one source."""

from __future__ import annotations

from tailrace.proto.event_pb2 import Position

PositionKey = tuple[int, int]
"""(tx_seq, event_index): positions compare as these do."""


def position_key(position: Position) -> PositionKey:
    return (position.tx_seq, position.event_index)


def lsn_text(lsn: int) -> str:
    """A 64-bit PostgreSQL LSN in the server's own `X/Y` notation (e.g. `0/198E748`)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def native_position(position: Position) -> str:
    """The position in the source's own notation: a PostgreSQL commit LSN (`0/198E748`),
    a MySQL/MariaDB GTID set (or `file:offset` without GTIDs); "" when it has none."""
    kind = position.WhichOneof("native")
    if kind == "postgres":
        return lsn_text(position.postgres.commit_lsn)
    if kind == "mysql":
        m = position.mysql
        return m.gtid_set or m.gtid or (f"{m.file}:{m.offset}" if m.file else "")
    return ""
