"""The reading side of a snapshot: tables in chunks, progress, and recovery after a
restart (the package docstring; docs/snapshots.md)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from tailrace.config import PipelineSpec
from tailrace.control_client import ControlClient
from tailrace.errors import ConfigError, RetryableError
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import Position
from tailrace_services.capture.metrics import CaptureMetrics
from tailrace_services.capture.snapshot.chunks import ChunkSource, Key, TablePlan
from tailrace_services.capture.snapshot.merger import Chunk, SnapshotMerger
from tailrace_services.capture.snapshot.progress import ACTIVE, Progress, SnapshotProgress
from tailrace_services.capture.snapshot.ranges import WAIT, Span, TableRead
from tailrace_services.capture.snapshot.recovery import (
    BusScan,
    read_lost_again,
    settle,
    still_in_flight,
)

__all__ = ["SnapshotWorker"]

log = get_logger(__name__)

EPOCH_POLL_S = 0.1
IDLE_POLL_S = 1.0
RETRY_S = 2.0
FAILURES_BEFORE_FAILED = 3
# chunks published but not yet in a recorded epoch: reading goes on meanwhile (an epoch
# every `epoch_ms` would otherwise pause it); a restart scans the bus for them
PENDING_CHUNKS = 4
READ_AGAIN_BACKOFF_S = (0.05, 2.0)  # a chunk read again and again waits from, up to
RECENT_CHUNKS = 256  # done chunks a table's record keeps (`_read_again_after_bus_lost`)


def _no_key(table: str) -> str:
    return (f"{table} has no primary key to read it in chunks by: add one, or name its key in "
            "spec.source.snapshot.key_columns")


class Recovered(NamedTuple):
    """What `_recover` settled: the table's entry as stored, and the keys the bus holds
    already (not to be read again)."""

    entry: pb.SnapshotTable
    exclude: set[Key]


class _SettingUp:
    """A table's place in `SnapshotWorker._active` while its first reader sets it up; each
    claim its own, so a reader that gave up clears only its own."""


class Reading(NamedTuple):
    """A chunk handed to the merger, its token there, and its key range."""

    token: str
    chunk: Chunk
    span: Span


def _stored(chunk: Chunk, number: int, before: list[str] | None,
            position: Position | None = None) -> pb.SnapshotChunk:
    """A chunk as the record keeps it: in flight (`position`: where it is about to be
    published), then done. `before`: the table's cursor before it, kept if the chunk read
    no row."""
    cursor = chunk.cursor if chunk.cursor is not None else before
    at = position or chunk.position
    return pb.SnapshotChunk(chunk=number, cursor=json.dumps(cursor) if cursor else "",
                            tx_seq=at.tx_seq if at else 0, rows=chunk.published_rows,
                            last=chunk.last,
                            cleared_tx_seq=chunk.cleared_at.tx_seq if chunk.cleared_at else 0)


class SnapshotWorker:
    """Reads the tables the snapshot record asks for, in chunks (module docstring). Runs for
    one capture session; `stop()` ends it.

    One reader thread per source in `sources` (`snapshot.parallelism`, each with its own
    connection). A reader takes a table nobody reads yet; with none left, it joins a table
    being read and reads key ranges of it beside the others (`ranges.TableRead`). Each
    reader reads its next chunk while the one before merges with the stream."""

    def __init__(self, pipeline: PipelineSpec, control: ControlClient,
                 sources: Sequence[ChunkSource], merger: SnapshotMerger,
                 progress: SnapshotProgress, selected: dict[str, tuple[str, ...]],
                 metrics: CaptureMetrics, *, on_all_done: Callable[[], None]) -> None:
        self.pipeline = pipeline
        self.control = control
        self.sources = list(sources)
        self.source = self.sources[0]  # for what any reader may answer (keys, plans)
        self.merger = merger
        self.progress = progress
        self.selected = selected
        self.mode = pipeline.spec.source.snapshot.mode
        self.chunk_size = pipeline.spec.source.snapshot.chunk_size
        self.on_all_done = on_all_done
        self.metrics = metrics
        self._stopped = threading.Event()
        self._wake = threading.Event()  # a table's read was set up: idle readers may join
        self._threads = [threading.Thread(target=self._run, args=(source,),
                                          name=f"snapshot-{n}", daemon=True)
                         for n, source in enumerate(self.sources)]
        self._lock = threading.Lock()
        # tables being read: a `_SettingUp` while the first reader sets the read up
        self._active: dict[str, TableRead | _SettingUp] = {}
        self._failures: dict[tuple[str, int], int] = {}  # failed reads in a row, any reader
        self._all_done = False
        self._added: deque[str] = deque()
        # keys on the bus already, per table: (request id, keys), kept until the table's
        # read ends (a retry in this process still needs them)
        self._exclude: dict[str, tuple[int, set[Key]]] = {}
        self._scan = BusScan(pipeline, control)

    def start(self, resnapshot: str = "", bus_lost: bool = False) -> None:
        """Report the tables, settle what an earlier process left in flight, then read.
        Call it before this session publishes anything: the bus after the latest epoch
        must hold only what earlier processes wrote (`_recover`). With `resnapshot` (why:
        the server was accepted as it is now) every selected table is read again, and the
        request is marked as taken in the same change. With `bus_lost` (this session
        publishes onto a new bus generation), chunks the sinks had not received are read
        again (`_read_again_after_bus_lost`)."""
        self._report_selected(resnapshot)
        if bus_lost:
            self._read_again_after_bus_lost()
        for entry in self.progress.read().tables:
            if entry.inflight and entry.table in self.selected:
                try:
                    plan = self.source.plan(entry.table)
                except ConfigError:
                    continue  # the table's reading reports it
                recovered = self._recover(entry, plan)
                self._exclude[entry.table] = (entry.request_id, recovered.exclude)
        for thread in self._threads:
            thread.start()

    def add_tables(self, tables: list[str]) -> None:
        """Tables selected while streaming (thread-safe): reported, and under `initial`
        snapshotted, by the worker's thread."""
        self._added.extend(tables)

    def _recover(self, entry: pb.SnapshotTable, plan: TablePlan) -> Recovered:
        """Chunks were handed to the bus when capture stopped (`inflight`; a chunk read
        again after a restart is another attempt of the same number): store those done,
        keep those found part-way, and exclude the keys the bus holds (`recovery.settle`)."""
        epoch = self.control.latest_epoch(self.pipeline.spec.source.id)
        covered = epoch.position.tx_seq if epoch is not None else 0
        found = self._scan.find(entry, plan, epoch)
        settled = settle(entry, covered, found)
        for chunk in settled.done:
            log.info("snapshot chunk found whole after a restart", table=entry.table,
                     chunk=chunk.chunk, in_recorded_epoch=chunk.tx_seq <= covered)
        for chunk in settled.partial:
            log.info("snapshot chunk found part-way after a restart: read again without "
                     "its keys on the bus", table=entry.table, chunk=chunk.chunk,
                     rows_on_bus=len(found.reads[chunk.tx_seq].keys))
        fields: dict[str, object] = {"inflight": [],
                                     "rows_done": entry.rows_done + settled.newly_found
                                     + sum(c.rows for c in settled.done)}
        if settled.done:
            last = settled.done[-1]
            fields.update(cursor=last.cursor, chunks_done=last.chunk)
            if last.last:
                fields["state"] = pb.SNAPSHOT_DONE
        def edit(stored: pb.SnapshotTable) -> None:
            stored.inflight.extend(settled.partial)
            stored.recent.extend(settled.done)  # for `recovery.read_lost_again`
            del stored.recent[:-RECENT_CHUNKS]

        updated = self._set(entry.table, entry.request_id, edit, **fields)
        return Recovered(updated or entry, settled.exclude)

    def _read_again_after_bus_lost(self) -> None:
        """A chunk's rows are not in the source's log (only its watermarks are): chunks the
        bus lost before every sink had them are not published again by streaming. Each
        table goes back to the last chunk the sinks' checkpoint covers (`recent`), or to
        its start when that one is no longer known; chunks in flight are read again."""
        sinks = [s.id for s in self.pipeline.spec.sinks]
        checkpoint = self.control.minimum_checkpoint(self.pipeline.spec.source.id, sinks)
        covered = checkpoint.position.tx_seq if checkpoint is not None else 0
        rewound: list[tuple[str, int]] = []

        def edit(state: pb.SnapshotState) -> None:
            for entry in state.tables:
                if entry.state in (*ACTIVE, pb.SNAPSHOT_DONE) and read_lost_again(entry, covered):
                    rewound.append((entry.table, entry.chunks_done))

        self.progress.change(edit)
        for table, chunks in rewound:
            log.warning("snapshot chunks lost with the bus are read again", table=table,
                        from_chunk=chunks + 1, sinks_checkpoint_tx_seq=covered)

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        for thread in self._threads:
            if thread.ident is not None:  # not started when the session failed before
                thread.join(10.0)
        for source in self.sources:
            source.close()

    def _report_selected(self, resnapshot: str = "") -> None:
        """Tell the control service what capture selects (what requests are checked
        against); under `initial` (and `when_needed`) queue every selected table never
        snapshotted, and with `resnapshot` every selected table."""
        now = int(time.time() * 1000)

        def edit(state: pb.SnapshotState) -> None:
            del state.selected[:]
            for table, keys in sorted(self.selected.items()):
                state.selected.add(table=table, key_columns=list(keys))
            if resnapshot:
                kept = [t for t in state.tables if t.table not in self.selected]
                del state.tables[:]
                state.tables.extend(kept)
                state.resnapshot_requested = False
                state.resnapshot_reason = ""
            if resnapshot or self.mode in ("initial", "initial_only", "when_needed"):
                known = {t.table for t in state.tables}
                for table, keys in sorted(self.selected.items()):
                    if table in known:
                        continue
                    if not keys:
                        state.tables.add(table=table, state=pb.SNAPSHOT_FAILED,
                                         updated_unix_ms=now,
                                         reason=_no_key(table))
                        continue
                    state.tables.add(table=table, state=pb.SNAPSHOT_PENDING,
                                     requested_unix_ms=now, updated_unix_ms=now,
                                     reason=f"resnapshot: {resnapshot}" if resnapshot
                                     else f"snapshot.mode {self.mode}", reset=bool(resnapshot),
                                     request_id=state.next_request_id)
                    state.next_request_id += 1

        self.progress.change(edit)

    def _run(self, source: ChunkSource) -> None:
        """One reader: a table no other reader has taken, else ranges of one being read; a
        table whose reading fails FAILURES_BEFORE_FAILED times in a row is marked failed
        with the error (streaming goes on)."""
        while not self._stopped.is_set():
            joined: TableRead | None = None
            setting_up: _SettingUp | None = None
            try:
                with self._lock:
                    added = [self._added.popleft() for _ in range(len(self._added))]
                if added:
                    for table in added:
                        try:
                            keys = source.key_columns(table)
                            with self._lock:
                                self.selected = {**self.selected, table: keys}
                        except ConfigError as e:  # gone again (dropped, renamed away)
                            log.info("table no longer there to snapshot", table=table,
                                     reason=str(e))
                    self._report_selected()
                state = self.progress.read()
                with self._lock:
                    todo = [t for t in state.tables if t.state in ACTIVE
                            and t.table in self.selected and t.table not in self._active]
                    if todo:
                        setting_up = self._active[todo[0].table] = _SettingUp()
                    else:
                        joined = next((r for r in self._active.values()
                                       if isinstance(r, TableRead) and r.joinable()), None)
                        if joined is not None:
                            joined.readers += 1
                        elif not self._active and self.mode == "initial_only" and \
                                not self._all_done:
                            self._all_done = True
                            log.info("initial snapshot complete; stopping (snapshot.mode "
                                     "initial_only)")
                            self.on_all_done()
                            return
                if not todo and joined is None:
                    self._wake.wait(IDLE_POLL_S)
                    self._wake.clear()
                    continue
            except Exception as e:  # noqa: BLE001 - the control service, briefly away
                log.warning("snapshot reader waits for the control service", error=str(e))
                self._stopped.wait(RETRY_S)
                continue
            if joined is not None:
                table, request_id = joined.table, joined.request_id
            else:
                table, request_id = todo[0].table, todo[0].request_id
            try:
                if joined is None:
                    self._read_table(todo[0], source)
                else:
                    log.info("snapshot reader joins a table's read: ranges of it on "
                             "another connection", table=table, readers=joined.readers)
                    source.plan(table)  # its catalog as it is now, on this connection
                    self._take_part(joined, source)
            except Exception as e:  # noqa: BLE001 - counted, then the table is failed
                if self._stopped.is_set():
                    return
                ident = (table, request_id)
                with self._lock:
                    failures = self._failures[ident] = self._failures.get(ident, 0) + 1
                log.error("snapshot of table failed", table=table, error=str(e),
                          attempt=failures)
                if failures >= FAILURES_BEFORE_FAILED:
                    with contextlib.suppress(Exception):
                        self._set(table, request_id, state=pb.SNAPSHOT_FAILED,
                                  reason=f"{type(e).__name__}: {e}")
                self._stopped.wait(RETRY_S)
            finally:
                if joined is not None:
                    self._leave(joined)
                elif todo:
                    with self._lock:
                        if self._active.get(table) is setting_up:  # never set up
                            del self._active[table]

    def _read_table(self, entry: pb.SnapshotTable, source: ChunkSource) -> None:
        """Set the table's read up (what an earlier read left in flight settled first),
        then take part in it."""
        table, request_id = entry.table, entry.request_id
        fresh = self.progress.table(self.progress.read(), table)  # another reader may have
        if fresh is None or fresh.request_id != request_id or fresh.state not in ACTIVE:
            return  # finished it since `entry` was read
        entry = fresh
        try:
            plan = source.plan(table)
        except ConfigError as e:
            self._set(table, request_id, state=pb.SNAPSHOT_FAILED, reason=str(e))
            return
        kept = self._exclude.get(table)
        exclude: set[Key] = kept[1] if kept is not None and kept[0] == request_id else set()
        self._exclude[table] = (request_id, exclude)
        own = [c.tx_seq for c in entry.inflight if not c.partial_from]
        if own:  # this process's own, left by a failed read of the table:
            # handed to this session's publisher, so an epoch will cover them
            self._wait_on_bus(max(own))
            recovered = self._recover(entry, plan)
            entry = recovered.entry
            exclude |= recovered.exclude
            if entry.state not in ACTIVE:
                return
        self.merger.record(table, plan.key_columns,
                           remember_before=source.visible_after_streamed)
        try:
            source.begin_table(plan)
            now = int(time.time() * 1000)
            self._set(table, request_id, state=pb.SNAPSHOT_RUNNING, rows_estimated=plan.estimate,
                      **({"started_unix_ms": now} if entry.state == pb.SNAPSHOT_PENDING else {}))
        except BaseException:
            self.merger.forget(table)
            raise
        read = TableRead(entry, plan, exclude, Progress(entry.rows_done, plan.estimate),
                         len(self.sources))
        with self._lock:
            read.readers = 1
            self._active[table] = read
        self._wake.set()
        try:
            self._take_part(read, source)
        finally:
            self._leave(read)

    def _take_part(self, read: TableRead, source: ChunkSource) -> None:
        """Read ranges of the table until none is left: the next range is read while the
        one before merges; a chunk discarded at its high watermark is read again."""
        def find_end(after: list[str] | None) -> list[str] | None:
            return source.boundary(read.plan, after, self.chunk_size, read.where)

        held: Reading | None = None  # read, merging: its outcome not known yet
        reading: Reading | None = None  # read after it, while it merges
        try:
            while not self._stopped.is_set():
                current = self.progress.table(self.progress.read(), read.table)
                if current is None or current.request_id != read.request_id or \
                        current.state not in ACTIVE:
                    if not read.ended:  # (done: its last chunk is stored)
                        read.stopped_as = pb.SnapshotTableState.Name(current.state) \
                            if current is not None else "gone"
                    read.stop()
                    break
                span = read.claim(find_end, self._stopped, block=held is None)
                if span is WAIT:  # until an earlier chunk is done: this reader's, maybe
                    if held is not None:
                        self._finish(read, source, held)
                        held = None
                    continue
                if span is None:
                    break
                alone = span.last or read.resets(span)
                if alone and held is not None:
                    self._finish(read, source, held)
                    held = None
                if span.last and not read.wait_before(span, self._stopped):
                    read.release(span)
                    break
                reading = self._start(source, read, span)
                if held is not None:
                    self._finish(read, source, held)
                held, reading = reading, None
                if alone:  # before any range after it is handed out
                    self._finish(read, source, held)
                    held = None
            if held is not None:
                self._finish(read, source, held)
                held = None
        except BaseException:
            read.failed = True
            read.stop()
            for started in (held, reading):  # high watermarks written: their merges need
                if started is not None:  # the table's recorded transactions, a retry
                    self._outcome(started)  # their records
            raise

    def _leave(self, read: TableRead) -> None:
        """A reader is done with the table; the last one out stores the cursor of what is
        on the bus and ends the table's recording."""
        with self._lock:
            read.readers -= 1
            last = read.readers == 0
        if not last:
            return
        try:
            if not (self._stopped.is_set() or read.failed):  # else the next read settles it
                self._store(read, 0)
                if read.stopped_as:  # what was read is on the bus and counted
                    log.info("snapshot of table stopped", table=read.table,
                             state=read.stopped_as)
        except Exception as e:  # noqa: BLE001 - the next read of the table settles them
            log.warning("snapshot chunks done but their cursor not stored", table=read.table,
                        error=str(e))
        finally:
            self.merger.forget(read.table)
            with self._lock:
                if self._active.get(read.table) is read:
                    del self._active[read.table]

    def _finish(self, read: TableRead, source: ChunkSource, reading: Reading) -> None:
        """Wait for the chunk's outcome, reading its range again while it is discarded (e.g.
        a commit a synchronous standby holds back: not visible until it lets it go); then
        its cursor is stored in order once the bus has it."""
        read_again = 0  # times in a row the chunk was discarded
        while (chunk := self._outcome(reading)) is None:
            if self._stopped.is_set() or read.stopping:
                read.release(reading.span)
                return
            self._stopped.wait(min(READ_AGAIN_BACKOFF_S[0] * 2 ** read_again,
                                   READ_AGAIN_BACKOFF_S[1]))
            read_again = min(read_again + 1, 10)
            reading = self._start(source, read, reading.span)
        if chunk.cleared is not None:  # a TRUNCATE: what the bus held is gone
            read.exclude.clear()
        # else `exclude` stays: rows inserted since may end a chunk before the keys found
        # on the bus do
        read.done(reading.span, _stored(chunk, reading.span.number, reading.span.after))
        self._wake.set()  # ranges may be handed out again (after a reset's first chunk)
        with self._lock:  # failures count in a row
            self._failures.pop((read.table, read.request_id), None)
        self._store(read, 0 if chunk.last or not chunk.published_rows else PENDING_CHUNKS)

    def _store(self, read: TableRead, keep: int) -> None:
        """Store the cursor of done chunks, in order, once an epoch covers each, until at
        most `keep` are left (another reader storing meanwhile stores them)."""
        if not read.store_lock.acquire(blocking=keep == 0):
            return
        try:
            while (chunk := read.to_store(keep)) is not None:
                on_bus = max(chunk.tx_seq, chunk.cleared_tx_seq)
                if on_bus:
                    self._wait_on_bus(on_bus)
                self._done(read.table, read.request_id, chunk, read.progress)
                read.stored(chunk)
        finally:
            read.store_lock.release()

    def _done(self, table: str, request_id: int, chunk: pb.SnapshotChunk,
              progress: Progress | None) -> None:
        if progress is not None:
            progress.add(chunk.rows)
        fields: dict[str, object] = {"cursor": chunk.cursor, "chunks_done": chunk.chunk}
        if progress is not None:
            fields.update(rows_done=progress.rows, rows_per_s=progress.rate)
            self.metrics.snapshot_progress(table, chunk.rows, progress.estimate, progress.rate)
        if chunk.last:
            fields["state"] = pb.SNAPSHOT_DONE

        def edit(entry: pb.SnapshotTable) -> None:
            kept = still_in_flight(entry.inflight, chunk)
            del entry.inflight[:]
            entry.inflight.extend(kept)
            entry.recent.append(chunk)
            del entry.recent[:-RECENT_CHUNKS]

        self._set(table, request_id, edit, **fields)
        if progress is not None and (progress.log_due() or chunk.last):
            log.info("snapshot progress", table=table, rows_done=progress.rows,
                     rows_estimated=progress.estimate, rows_per_s=round(progress.rate),
                     chunks=chunk.chunk, done=chunk.last)

    def _start(self, source: ChunkSource, read: TableRead, span: Span) -> Reading:
        """Read one chunk and hand it to the merger, between its watermarks. A reset read's
        first chunk publishes the table's TRUNCATE first, at the low watermark: every row
        is then read after it."""
        plan = read.plan
        token = f"{self.pipeline.spec.source.id}:{read.request_id}:{plan.table}:" \
                f"{span.number}:{time.time_ns()}"
        chunk = Chunk(plan.table, plan.key_columns, read.request_id, span.number,
                      exclude=read.exclude,
                      cleared=source.cleared(plan) if read.resets(span) else None)
        self.merger.open(token, chunk)
        try:
            rows = source.read_chunk(plan, span.after, self.chunk_size, read.where, token,
                                     upto=span.upto)
            chunk.last = not rows.more
            chunk.cursor = span.upto if span.upto is not None else rows.cursor

            def in_flight(chunk: Chunk, position: Position) -> None:
                """Before the read transaction is published: what a restart looks for."""
                record = _stored(chunk, span.number, span.after, position)
                self._set(plan.table, read.request_id,
                          lambda entry: entry.inflight.append(record))

            chunk.before_publish = in_flight
            self.merger.fill(token, rows)
            source.write_high(token)
        except BaseException:
            self.merger.abandon(token)
            raise
        return Reading(token, chunk, span)

    def _outcome(self, reading: Reading) -> Chunk | None:
        """The chunk once the stream passed its high watermark, or None when it was
        discarded (read it again)."""
        chunk = reading.chunk
        while not chunk.done.wait(0.5):
            if self._stopped.is_set():
                self.merger.abandon(reading.token)
                return None
        if chunk.outcome == "discarded":
            self.metrics.chunks_read_again.inc()
            return None
        return chunk

    def _wait_on_bus(self, tx_seq: int) -> None:
        """Until an epoch recorded in the control service covers `tx_seq` (the read
        transaction is on the bus whole)."""
        source_id = self.pipeline.spec.source.id
        while not self._stopped.is_set():
            epoch = self.control.latest_epoch(source_id)
            if epoch is not None and epoch.position.tx_seq >= tx_seq:
                return
            self._stopped.wait(EPOCH_POLL_S)
        raise RetryableError("capture stopped before a snapshot chunk was on the bus")

    def _set(self, table: str, request_id: int,
             edit: Callable[[pb.SnapshotTable], None] | None = None, /,
             **fields: object) -> pb.SnapshotTable | None:
        """Change the table's entry (not its state once an operator cancelled it; nothing
        once the table was requested again); returns it as stored."""
        now = int(time.time() * 1000)

        def change(state: pb.SnapshotState) -> None:
            entry = self.progress.table(state, table)
            if entry is None or entry.request_id != request_id:
                return
            cancelled = entry.state not in ACTIVE  # meanwhile: keep the operator's word
            for name, value in fields.items():
                if name == "inflight":
                    del entry.inflight[:]
                elif not (cancelled and name == "state"):
                    setattr(entry, name, value)
            if edit is not None:
                edit(entry)
            entry.updated_unix_ms = now

        return self.progress.table(self.progress.change(change), table)
