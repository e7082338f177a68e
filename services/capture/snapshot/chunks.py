"""What a snapshot chunk and a watermark are, and what a source supplies (`ChunkSource`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tailrace.events._wire import NULL, Kind, cwire, row_bytes
from tailrace.proto.event_pb2 import ChangeEvent, Position, Row

__all__ = ["WATERMARK_PREFIX", "ChunkRows", "ChunkSource", "Key", "ReadRow", "TablePlan",
           "Watermark", "chunk_rows", "key_of", "parse_watermark", "table_of",
           "watermark_content"]

WATERMARK_PREFIX = "tailrace"
Key = tuple[bytes, ...]
ReadRow = tuple[bytes, bytes]
"""A row a chunk read, in bus form: (its bus key, `bus_key`; its serialized `Row`)."""


def watermark_content(token: str, high: bool) -> str:
    return json.dumps({"chunk": token, "mark": "high" if high else "low"})


def parse_watermark(content: bytes) -> tuple[str, bool] | None:
    """(token, high) of a watermark written by `watermark_content`; None for anything else."""
    try:
        parsed = json.loads(content)
        return str(parsed["chunk"]), parsed["mark"] == "high"
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True, slots=True)
class Watermark:
    """A watermark as the feed read it from the log, outside any transaction. `position`
    is where a read transaction placed at it sits in the stream; `published` is set by
    the merger when it published one there (the feed may then confirm past it)."""

    token: str
    high: bool
    position: Position
    published: list[bool] = field(default_factory=list)


def key_of(row: Row, key_columns: Iterable[str]) -> Key:
    """A row's key as comparable bytes: the serialized values of its key columns."""
    values = {c.name: c.value for c in row.columns}
    return tuple(values[k].SerializeToString() if k in values else b"" for k in key_columns)


def table_of(event: ChangeEvent) -> str:
    """The event's table as snapshot records name it: `schema.table` (PostgreSQL),
    `database.table` (MySQL)."""
    return f"{event.schema or event.database}.{event.table}"


@dataclass(frozen=True)
class TablePlan:
    """How a table is read: its name as capture reports it, and its chunking key."""

    table: str
    key_columns: tuple[str, ...]
    estimate: int = 0


@dataclass
class ChunkRows:
    """What a chunk read: the table's read event without its row (`template`: what every
    read event of the table says) and the rows by key, in key order, already encoded (a
    chunk is many rows; see `records.py`); the cursor after them (the last key, as the
    source's text values); whether rows follow; which transactions the read could not see
    (`hidden`: listed as running by its snapshot, or at or past the snapshot's xmax)."""

    template: ChangeEvent
    rows: dict[Key, ReadRow]
    cursor: list[str] | None
    more: bool  # rows follow the chunk
    hidden: Callable[[str], bool] = field(default=lambda _tx: False)
    # transactions recorded for the table that no later chunk can name as hidden (prune)
    forgettable: Callable[[str], bool] | None = None


class ChunkSource(Protocol):
    """A source's side of a snapshot (`capture_<source>/snapshot.py`)."""

    # A commit can be streamed before a new read sees it (PostgreSQL: the commit record is
    # written, then the transaction is marked completed): the merger then remembers which
    # transactions it streamed before it recorded a table (`SnapshotMerger.record`).
    visible_after_streamed: bool

    def key_columns(self, table: str) -> tuple[str, ...]:
        """The table's chunking key; () when it has none."""

    def plan(self, table: str) -> TablePlan:
        """The table's key and size estimate; ConfigError when it has no key."""

    def cleared(self, plan: TablePlan) -> ChangeEvent:
        """The table's TRUNCATE event (unstamped): a read that starts over after a lost
        position clears what sinks hold of the table first (`SnapshotTable.reset`)."""

    def begin_table(self, plan: TablePlan) -> None:
        """Called after the merger records the table and before its first chunk."""

    def boundary(self, plan: TablePlan, after: list[str] | None, size: int, where: str
                 ) -> list[str] | None:
        """The key of the `size`-th row after `after` (None: from the start), when more rows
        follow it: the end of a chunk's key range, found before the chunk is read so that
        readers on other connections can read the ranges after it meanwhile. None when at
        most `size` rows are left: the table's last range. Keys only (an index scan)."""

    def read_chunk(self, plan: TablePlan, after: list[str] | None, limit: int, where: str,
                   token: str, upto: list[str] | None = None) -> ChunkRows:
        """Write the low watermark `token`, then read the rows after `after`: with `upto`,
        every row up to and including that key (`ChunkRows.more` is then True); without,
        up to `limit` rows."""

    def write_high(self, token: str) -> None:
        """Write the high watermark `token`."""

    def close(self) -> None: ...


def _py_chunk_rows(raw_rows: list[tuple[Any, ...]], kinds: bytes,
                   encoders: tuple[Callable[[Any], bytes], ...], prefixes: tuple[bytes, ...],
                   key_index: tuple[int, ...], bus_index: tuple[int, ...], head: bytes
                   ) -> dict[Key, ReadRow]:
    """A chunk's rows as {merger's key: (bus key, serialized Row)}: each value through its
    column's encoder (None: NULL); `head` is the table's `bus_key_of` prefix. The reference
    of `_cwire.chunk_rows`, which reads the common `kinds` itself (PostgreSQL's text,
    `values.kind_for`; a Python value, `KIND_OBJECT`) and gives the same bytes."""
    rows: dict[Key, ReadRow] = {}
    for raw in raw_rows:
        values = [NULL if value is None else encode(value)
                  for encode, value in zip(encoders, raw, strict=True)]
        rows[tuple([values[i] for i in key_index])] = (
            b"\x00".join([head, *[values[i] for i in bus_index]]),
            row_bytes(prefixes, values))
    return rows


KIND_OBJECT = Kind.OBJECT  # `chunk_rows`: a Python value, encoded as `_wire.value_bytes` would
chunk_rows: Callable[[list[tuple[Any, ...]], bytes, tuple[Callable[[Any], bytes], ...],
                      tuple[bytes, ...], tuple[int, ...], tuple[int, ...], bytes],
                     dict[Key, ReadRow]] = cwire.chunk_rows if cwire else _py_chunk_rows
