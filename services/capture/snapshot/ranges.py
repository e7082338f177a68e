"""One table's read, shared by the snapshot readers that take part in it: which key range
each chunk covers, and in what order chunks are done (docs/snapshots.md, "Ranges").

A chunk's range ends at a key found before the chunk is read (`ChunkSource.boundary`:
the `chunk_size`-th row after the range's start, an index scan), so the next range is
known at once and another reader, on its own connection, can read it meanwhile. Ranges
are handed out in key order (`claim`); each is read between its own watermarks and
merged on its own, so their read transactions may reach the bus in any order — the
keys of two ranges never meet. What stays in order:

- the table's cursor (the control service's record) moves over chunks in number order,
  once each is done (`to_store`), so a restart never skips a range;
- the last range (no end key: at most `chunk_size` rows were left) is read once every
  range before it is done, so its read transaction, marked `last`, is the table's last;
  if rows were inserted meanwhile it reads `chunk_size` of them and ranges go on after it;
- a reset read's first chunk (it publishes the table's TRUNCATE at its low watermark)
  is done before any other range is handed out: no read may precede that TRUNCATE.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tailrace.proto import control_pb2 as pb
from tailrace_services.capture.snapshot.chunks import Key, TablePlan
from tailrace_services.capture.snapshot.progress import Progress

__all__ = ["WAIT", "Span", "TableRead"]

WAIT_S = 0.5


@dataclass(frozen=True)
class Span:
    """A chunk's key range: after `after` (None: the table's start) up to and including
    `upto` (None: the last range, read `chunk_size` rows at most)."""

    number: int
    after: list[str] | None
    upto: list[str] | None

    @property
    def last(self) -> bool:
        return self.upto is None


WAIT = Span(0, None, None)
"""`claim`'s answer when no range can be handed out until an earlier chunk is done."""


class TableRead:
    """The state of one table's read that its readers share (module docstring).
    Thread-safe; the worker keeps `readers` under its own lock."""

    def __init__(self, entry: pb.SnapshotTable, plan: TablePlan, exclude: set[Key],
                 progress: Progress, max_readers: int) -> None:
        self.table = entry.table
        self.request_id = entry.request_id
        self.where = entry.where
        self.plan = plan
        self.exclude = exclude  # keys on the bus already (crash recovery), shared by chunks
        self.progress = progress
        self.max_readers = max_readers
        self.readers = 0
        self.first = entry.chunks_done + 1
        self.reset_pending = entry.reset and entry.chunks_done == 0  # chunk 1 not done yet
        self.stopping = False  # cancelled, failed or stopped: no more ranges
        self.failed = False  # a reader's error stopped it: what is done stays unstored
        self.stopped_as = ""  # the record's state that stopped it (cancelled, ...)
        self.ended = False  # the last range is done
        self.store_lock = threading.Lock()
        self._cond = threading.Condition()
        self._claim_lock = threading.Lock()  # one end-key query at a time
        self._after: list[str] | None = json.loads(entry.cursor) if entry.cursor else None
        self._next = self.first
        self._open: set[int] = set()  # claimed, not done
        self._last_open = False
        self._done: dict[int, pb.SnapshotChunk] = {}  # done, cursor not stored yet
        self._next_store = self.first

    def resets(self, span: Span) -> bool:
        """Whether the chunk publishes the table's TRUNCATE first (a reset read's chunk 1)."""
        return self.reset_pending and span.number == 1

    def joinable(self) -> bool:
        """Whether another reader could take ranges now."""
        with self._cond:
            return self.readers < self.max_readers and not self._blocked() \
                and not self.stopping and not self.ended

    def _blocked(self) -> bool:
        return self._last_open or (self.reset_pending and bool(self._open))

    def claim(self, find_end: Callable[[list[str] | None], list[str] | None],
              stopped: threading.Event, *, block: bool) -> Span | None:
        """The next range, its end found by `find_end(start)`; None when there is none
        (the read ended or stops); without `block`, WAIT when ranges must wait for an
        earlier chunk to be done (the caller first finishes the chunk it holds)."""
        while True:
            with self._cond:  # not waited on holding `_claim_lock`: its holder may hold a
                # chunk that must be done first, and be waiting for the lock to say so
                while self._blocked() and not self._over(stopped):
                    if not block:
                        return WAIT
                    self._cond.wait(WAIT_S)
                if self._over(stopped):
                    return None
            with self._claim_lock:
                with self._cond:
                    if self._blocked() or self._over(stopped):
                        continue  # another reader's claim came first
                    after, number = self._after, self._next
                upto = find_end(after)  # outside the condition: it is a query
                with self._cond:
                    self._after = upto
                    self._next += 1
                    self._open.add(number)
                    self._last_open = upto is None
                return Span(number, after, upto)

    def _over(self, stopped: threading.Event) -> bool:
        return self.stopping or self.ended or stopped.is_set()

    def wait_before(self, span: Span, stopped: threading.Event) -> bool:
        """Until every chunk before `span` is done (the last range: its read is the
        table's last); False when the read stops meanwhile."""
        with self._cond:
            while any(n < span.number for n in self._open):
                if self.stopping or stopped.is_set():
                    return False
                self._cond.wait(WAIT_S)
            return not self.stopping

    def done(self, span: Span, chunk: pb.SnapshotChunk) -> None:
        """The chunk's outcome is known (published, or nothing to publish): its cursor is
        stored in number order (`to_store`). A last range that found more rows than it
        read (inserted since its start was found) hands out ranges after them."""
        with self._cond:
            self._open.discard(span.number)
            self._done[span.number] = chunk
            if self.resets(span):
                self.reset_pending = False
            if span.last:
                self._last_open = False
                if chunk.last:
                    self.ended = True
                else:
                    self._after = json.loads(chunk.cursor) if chunk.cursor else span.after
            self._cond.notify_all()

    def release(self, span: Span) -> None:
        """A claimed chunk that will not be read (the read stops)."""
        with self._cond:
            self._open.discard(span.number)
            self.stopping = True
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopping = True
            self._cond.notify_all()

    def to_store(self, keep: int) -> pb.SnapshotChunk | None:
        """The next chunk whose cursor to store (hold `store_lock`; `stored` after it),
        while more than `keep` done chunks wait in number order; None otherwise."""
        with self._cond:
            waiting = 0
            while self._next_store + waiting in self._done:
                waiting += 1
            if waiting <= keep:
                return None
            return self._done[self._next_store]

    def stored(self, chunk: pb.SnapshotChunk) -> None:
        with self._cond:
            del self._done[chunk.chunk]
            self._next_store = chunk.chunk + 1
