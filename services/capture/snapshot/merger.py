"""The stream side of a snapshot: chunk reads merged into a source's feed at their
watermarks (the package docstring)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from tailrace.events import event_id, idempotency_key
from tailrace.logs import get_logger
from tailrace.proto.event_pb2 import ChangeEvent, Op, Position
from tailrace_services.capture.assembler import BEGIN, Commit, FeedItem
from tailrace_services.capture.changes import CHANGE_ITEMS, Change
from tailrace_services.capture.snapshot.chunks import (
    ChunkRows,
    Key,
    ReadRow,
    Watermark,
    key_of,
    table_of,
)
from tailrace_services.capture.snapshot.records import read_transaction

__all__ = ["Chunk", "SnapshotMerger"]

log = get_logger(__name__)

# the commits a table's recording looks back on (`_start_recording`): at most this many,
# streamed at most this long ago (older ids could wrap around and look new)
RECENT_COMMITS = 8_192
RECENT_S = 3600.0


@dataclass
class Chunk:
    """One chunk from its announcement to its outcome, shared by the worker and the
    stream."""

    table: str
    key_columns: tuple[str, ...]
    request_id: int
    number: int
    last: bool = False
    cursor: list[str] | None = None
    rows: ChunkRows | None = None
    low_seen: bool = False
    dirty: set[Key] = field(default_factory=set)
    exclude: set[Key] = field(default_factory=set)  # on the bus already (crash recovery)
    cleared: ChangeEvent | None = None  # a TRUNCATE to publish at the low watermark (reset)
    cleared_at: Position | None = None  # where it was published
    before_publish: Callable[[Chunk, Position], None] | None = None
    outcome: str = ""  # published | empty | discarded
    position: Position | None = None
    # the merger's clock when the chunk was announced and when its rows came: a chunk
    # announced after another's rows came reads a later snapshot (`_forgettable`)
    opened_at: int = 0
    filled_at: int = 0
    # until its rows come: what the chunk filled last before it was announced could forget
    # (its read's snapshot is older, and a snapshot's xmin only grows), None: nothing
    horizon: Callable[[str], bool] | None = None
    published_rows: int = 0
    done: threading.Event = field(default_factory=threading.Event)


class SnapshotMerger:
    """Merges chunk reads into a source's feed (package docstring). Thread-safe: the
    worker opens and fills chunks while the stream runs `items`."""

    def __init__(self, source_id: str, tenant: str) -> None:
        self.source_id = source_id
        self.tenant = tenant
        self._lock = threading.Lock()
        self._chunks: dict[str, Chunk] = {}
        # per recorded table: the transactions seen since it started (tx id -> keys), kept
        # until no chunk can name them as hidden any more (`ChunkRows.forgettable`)
        self._recorded: dict[str, dict[str, set[Key]]] = {}
        self._keys: dict[str, tuple[str, ...]] = {}
        # per recorded table: transactions whose keys the recording may lack (committed
        # before it began, or under way then), kept and forgotten like `_recorded`'s
        self._unrecorded: dict[str, set[str]] = {}
        # the last commits streamed: (time.monotonic(), tx id)
        self._recent: deque[tuple[float, str]] = deque(maxlen=RECENT_COMMITS)
        # recorded, not yet by the stream: table -> (keys, remember the commits before)
        self._starting: dict[str, tuple[tuple[str, ...], bool]] = {}
        self._clock = 0  # `Chunk.opened_at`, `Chunk.filled_at`
        self._last_filled: Callable[[str], bool] | None = None  # `Chunk.horizon`

    # worker side
    def record(self, table: str, key_columns: tuple[str, ...], *,
               remember_before: bool = True) -> None:
        """Record the table's streamed transactions from the stream's next item on: before
        any watermark written from now (`_start_recording`). `remember_before`: the source
        may stream a commit before a read sees it (`ChunkSource.visible_after_streamed`)."""
        with self._lock:
            if table in self._keys:
                self._keys[table] = key_columns
            else:
                self._starting[table] = (key_columns, remember_before)

    def forget(self, table: str) -> None:
        with self._lock:
            self._starting.pop(table, None)
            self._recorded.pop(table, None)
            self._keys.pop(table, None)
            self._unrecorded.pop(table, None)

    def open(self, token: str, chunk: Chunk) -> None:
        """Announce a chunk, before its low watermark is written. Chunks of one table cover
        key ranges apart, so several may be open at once (readers on several connections)."""
        with self._lock:
            self._clock += 1
            chunk.opened_at = self._clock
            chunk.horizon = self._last_filled
            self._chunks[token] = chunk

    def fill(self, token: str, rows: ChunkRows) -> None:
        with self._lock:
            chunk = self._chunks.get(token)
            if chunk is not None:  # else discarded meanwhile (`_discard`)
                self._clock += 1
                chunk.filled_at = self._clock
                chunk.rows = rows
                self._last_filled = rows.forgettable

    def abandon(self, token: str) -> None:
        with self._lock:
            chunk = self._chunks.pop(token, None)
        if chunk is not None and not chunk.outcome:
            chunk.outcome = "discarded"
            chunk.done.set()

    # stream side
    def items(self, feed: Iterable[FeedItem | Watermark]) -> Iterator[FeedItem]:
        """The feed with watermarks replaced by read transactions."""
        tx_keys: dict[str, set[Key]] = {}
        in_transaction = False
        joined_midway: list[str] = []  # tables recorded from inside the open transaction
        for item in feed:
            if self._starting:
                joined_midway += self._start_recording(in_transaction)
            if isinstance(item, CHANGE_ITEMS):
                if self._recorded:
                    self._note(tx_keys, item)
                yield item
            elif isinstance(item, list):
                if self._recorded:
                    for event in item:
                        self._note(tx_keys, event)
                yield item
            elif isinstance(item, Commit):
                self._recent.append((time.monotonic(), item.tx_id))
                if item.items is not None and self._recorded:  # a transaction streamed
                    for held in item.items:  # while open: its changes come with its commit
                        self._note(tx_keys, held)
                if tx_keys:
                    self._on_commit(item.tx_id, tx_keys)
                    tx_keys = {}
                if joined_midway:
                    self._on_partly_recorded(item.tx_id, joined_midway)
                    joined_midway = []
                in_transaction = False
                yield item
            elif isinstance(item, Watermark):
                tx_keys = {}
                yield from self._on_watermark(item)
            else:
                if item is BEGIN:
                    tx_keys = {}
                    joined_midway = []
                    in_transaction = True
                yield item

    def _start_recording(self, in_transaction: bool) -> list[str]:
        """Take up the tables `record` asked for, between two items of the feed. What the
        recording cannot know: the keys of transactions that committed before it (the last
        RECENT_COMMITS of them are named), and of the one under way, if any (returned: it
        is named at its commit)."""
        with self._lock:
            tables = list(self._starting)
            before: set[str] | None = None
            for table in tables:
                self._keys[table], remember = self._starting.pop(table)
                self._recorded.setdefault(table, {})
                if remember and before is None:
                    since = time.monotonic() - RECENT_S
                    before = {tx_id for at, tx_id in self._recent if at >= since}
                self._unrecorded[table] = set(before) if remember and before else set()
        return tables if in_transaction else []

    def _on_partly_recorded(self, tx_id: str, tables: list[str]) -> None:
        with self._lock:
            for table in tables:
                unrecorded = self._unrecorded.get(table)
                if unrecorded is not None:
                    unrecorded.add(tx_id)

    def _note(self, tx_keys: dict[str, set[Key]], item: Change | ChangeEvent) -> None:
        event = item.event() if isinstance(item, Change) else item
        table = table_of(event)
        columns = self._keys.get(table)
        if columns is None:
            return
        keys = tx_keys.setdefault(table, set())
        if event.HasField("after") and event.after.columns:
            keys.add(key_of(event.after, columns))
        if event.HasField("before") and event.before.columns:
            keys.add(key_of(event.before, columns))
        if event.op == Op.OP_TRUNCATE:
            keys.add(())  # every key: see _on_commit

    def _on_commit(self, tx_id: str, tx_keys: dict[str, set[Key]]) -> None:
        with self._lock:
            for table, keys in tx_keys.items():
                recorded = self._recorded.get(table)
                if recorded is not None:
                    recorded.setdefault(tx_id, set()).update(keys)
                for chunk in self._chunks.values():
                    if chunk.table == table and chunk.low_seen:
                        chunk.dirty.update(keys)

    def _on_watermark(self, mark: Watermark) -> Iterator[FeedItem]:
        with self._lock:
            chunk = self._chunks.get(mark.token)
            if chunk is None:
                return  # another session's, or replayed after a restart: read again
            if not mark.high:
                chunk.low_seen = True
            else:
                del self._chunks[mark.token]
        if not mark.high:
            if chunk.cleared is not None:
                yield from self._publish([chunk.cleared], mark,
                                         f"snapshot-{chunk.request_id}-{chunk.number}-reset")
                chunk.cleared_at = mark.position
            return
        if not chunk.low_seen or chunk.rows is None:
            self._discard(chunk)
            return
        rows = chunk.rows
        with self._lock:
            seen = self._recorded.get(chunk.table, {})
            hidden = {tx_id: keys for tx_id, keys in seen.items() if rows.hidden(tx_id)}
            unrecorded = self._unrecorded.get(chunk.table, set())
            forgettable = self._forgettable(chunk)
            unknown = []
            for tx_id in list(unrecorded):  # one pass: hidden, or forgettable (not both)
                if forgettable is not None and forgettable(tx_id):
                    unrecorded.discard(tx_id)
                elif rows.hidden(tx_id):
                    unknown.append(tx_id)
            if forgettable is not None:
                for tx_id in [t for t in seen if forgettable(t)]:
                    del seen[tx_id]
        if unknown:
            log.warning("snapshot chunk read again: a transaction not visible to its read "
                        "was streamed before the table's recording began (its keys are "
                        "not known)", table=chunk.table, chunk=chunk.number, tx_id=min(unknown))
            self._discard(chunk)
            return
        for tx_id, keys in hidden.items():
            if chunk.cleared is not None and keys - chunk.dirty:
                # streamed before the low watermark, so before the TRUNCATE, and not
                # visible to the read: its rows would be in neither
                log.info("snapshot chunk read again: a transaction before its TRUNCATE "
                         "was not visible to its read", table=chunk.table,
                         chunk=chunk.number, tx_id=tx_id)
                self._discard(chunk)
                return
            chunk.dirty.update(keys)
        if () in chunk.dirty:  # a TRUNCATE of the table between the watermarks
            kept: list[ReadRow] = []
        else:  # (a reset chunk cleared the table: what was on the bus is gone)
            skip = chunk.dirty | (chunk.exclude if chunk.cleared is None else set())
            kept = [row for key, row in rows.rows.items() if key not in skip]
        if not kept:
            self._finish(chunk, "empty")
            return
        chunk.published_rows = len(kept)
        if chunk.before_publish is not None:
            chunk.before_publish(chunk, mark.position)
        yield read_transaction(rows.template, kept, source_id=self.source_id,
                               tenant=self.tenant, request_id=chunk.request_id,
                               chunk=chunk.number, last=chunk.last, position=mark.position,
                               tx_id=f"snapshot-{chunk.request_id}-{chunk.number}",
                               ts_us=time.time_ns() // 1000)
        mark.published.append(True)
        chunk.position = mark.position
        self._finish(chunk, "published")

    def _publish(self, events: list[ChangeEvent], mark: Watermark, tx_id: str
                 ) -> Iterator[FeedItem]:
        """`events` as one transaction at the watermark's position."""
        now_us = time.time_ns() // 1000
        position = mark.position

        def stamp(event: ChangeEvent, index: int, n: int) -> ChangeEvent:
            return self._stamp(event, index, n, position, tx_id, now_us)

        yield BEGIN
        yield events
        yield Commit(stamp, position, now_us, tx_id)
        mark.published.append(True)

    def _forgettable(self, chunk: Chunk) -> Callable[[str], bool] | None:
        """Which recorded transactions no chunk of the table still merging can name as hidden,
        now that `chunk` reached its high watermark (the lock held); None: none for now.
        A chunk announced after `chunk`'s rows came reads a later snapshot, which hides
        nothing `chunk`'s does not; one announced before may read an earlier one (readers
        on several connections): its own answer counts once its rows came, until then the
        answer of the chunk filled last before it was announced (`Chunk.horizon`)."""
        assert chunk.rows is not None
        answers = [chunk.rows.forgettable]
        for other in self._chunks.values():
            if other.table == chunk.table and other.opened_at < chunk.filled_at:
                answers.append(other.rows.forgettable if other.rows is not None
                               else other.horizon)
        if any(answer is None for answer in answers):
            return None
        if len(answers) == 1:
            return answers[0]
        known = [answer for answer in answers if answer is not None]
        return lambda tx_id: all(answer(tx_id) for answer in known)

    def _discard(self, chunk: Chunk) -> None:
        """The chunk is read again (its reader reads the same key range anew). Other chunks
        of the table cover other ranges: they go on."""
        with self._lock:
            self._finish(chunk, "discarded")

    @staticmethod
    def _finish(chunk: Chunk, outcome: str) -> None:
        chunk.outcome = outcome
        chunk.done.set()

    def _stamp(self, event: ChangeEvent, index: int, size: int, position: Position,
               tx_id: str, ts_us: int) -> ChangeEvent:
        """Transaction fields of a read event: ids depend on the watermark's position and the
        index only, like those of the source's own transactions."""
        event.tx_id = tx_id
        event.tx_index = index
        event.tx_size = size
        event.tx_end = index == size - 1
        event.position.CopyFrom(position)
        event.position.event_index = index
        event.ts_source_micros = ts_us
        event.ts_captured_micros = ts_us
        event.id = event_id(self.source_id, f"{position.tx_seq:X}", index, ts_us // 1000)
        event.idempotency_key = idempotency_key(
            self.tenant, event.database,
            f"{event.schema}.{event.table}" if event.schema else event.table, tx_id, event.id)
        return event
