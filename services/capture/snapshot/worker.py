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


class Reading(NamedTuple):
    """A chunk handed to the merger, and its token there."""

    token: str
    chunk: Chunk


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
    """Reads the tables the snapshot record asks for, one chunk at a time (module
    docstring). Runs for one capture session; `stop()` ends it.

    One reader thread per source in `sources` (`snapshot.parallelism`, each with its own
    connection): readers take different tables; a table is read by one reader, chunk
    after chunk, so its cursor stays one key."""

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
        self._threads = [threading.Thread(target=self._run, args=(source,),
                                          name=f"snapshot-{n}", daemon=True)
                         for n, source in enumerate(self.sources)]
        self._lock = threading.Lock()
        self._reading: set[str] = set()  # tables a reader has taken
        self._all_done = False
        self._added: deque[str] = deque()
        # keys on the bus already, per table: (request id, keys), kept until the table's
        # read ends (a retry in this process still needs them)
        self._exclude: dict[str, tuple[int, set[Key]]] = {}
        self._scan = BusScan(pipeline)

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
        """One reader: tables one after the other, each one no other reader has taken; a
        table whose reading fails FAILURES_BEFORE_FAILED times in a row is marked failed
        with the error (streaming goes on)."""
        failures: dict[tuple[str, int], int] = {}
        while not self._stopped.is_set():
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
                            and t.table in self.selected and t.table not in self._reading]
                    if todo:
                        self._reading.add(todo[0].table)
                    elif not self._reading and self.mode == "initial_only" and \
                            not self._all_done:
                        self._all_done = True
                        log.info("initial snapshot complete; stopping (snapshot.mode "
                                 "initial_only)")
                        self.on_all_done()
                        return
                if not todo:
                    self._stopped.wait(IDLE_POLL_S)
                    continue
                entry = todo[0]
            except Exception as e:  # noqa: BLE001 - the control service, briefly away
                log.warning("snapshot reader waits for the control service", error=str(e))
                self._stopped.wait(RETRY_S)
                continue
            try:
                self._read_table(entry, source)
            except Exception as e:  # noqa: BLE001 - counted, then the table is failed
                if self._stopped.is_set():
                    return
                ident = (entry.table, entry.request_id)
                failures[ident] = failures.get(ident, 0) + 1
                log.error("snapshot of table failed", table=entry.table, error=str(e),
                          attempt=failures[ident])
                if failures[ident] >= FAILURES_BEFORE_FAILED:
                    with contextlib.suppress(Exception):
                        self._set(entry.table, entry.request_id, state=pb.SNAPSHOT_FAILED,
                                  reason=f"{type(e).__name__}: {e}")
                self._stopped.wait(RETRY_S)
            finally:
                with self._lock:
                    self._reading.discard(entry.table)

    def _read_table(self, entry: pb.SnapshotTable, source: ChunkSource) -> None:
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
        ahead: Reading | None = None  # read, merging: its outcome not known yet
        try:
            source.begin_table(plan)
            now = int(time.time() * 1000)
            self._set(table, request_id, state=pb.SNAPSHOT_RUNNING, rows_estimated=plan.estimate,
                      **({"started_unix_ms": now} if entry.state == pb.SNAPSHOT_PENDING else {}))
            progress = Progress(entry.rows_done, plan.estimate)
            cursor = json.loads(entry.cursor) if entry.cursor else None
            number = entry.chunks_done
            pending: deque[pb.SnapshotChunk] = deque()  # on their way to the bus
            read_again = 0  # times in a row the next chunk was discarded
            while not self._stopped.is_set():
                current = self.progress.table(self.progress.read(), table)
                if current is None or current.request_id != request_id or \
                        current.state not in ACTIVE:
                    if current is not None and current.request_id == request_id:
                        if ahead is not None and (chunk := self._outcome(ahead)) is not None \
                                and chunk.published_rows:
                            pending.append(_stored(chunk, number + 1, cursor))
                        self._settle(table, request_id, pending, 0, progress)  # on the bus
                    log.info("snapshot of table stopped", table=table,
                             state=pb.SnapshotTableState.Name(current.state) if current else None)
                    return
                if ahead is None:
                    ahead = self._start(source, plan, cursor, request_id, number + 1,
                                        entry.where, exclude, entry.reset and number == 0)
                # the next chunk is read while this one merges: it starts where this one
                # ends, and is discarded with it (`SnapshotMerger.open`). Not after a
                # TRUNCATE: what it may exclude is known once the TRUNCATE is on its way.
                after = None
                if ahead is not None and not ahead.chunk.last and ahead.chunk.cleared is None:
                    after = self._start(source, plan, ahead.chunk.cursor, request_id,
                                        number + 2, entry.where, exclude, False, ahead)
                chunk = self._outcome(ahead) if ahead is not None else None
                if chunk is None:  # discarded: read it again (the next one went with it)
                    if after is not None:
                        self._outcome(after)
                    ahead = None
                    # e.g. a commit a synchronous standby holds back: not visible until it
                    # lets it go
                    self._stopped.wait(min(READ_AGAIN_BACKOFF_S[0] * 2 ** read_again,
                                           READ_AGAIN_BACKOFF_S[1]))
                    read_again = min(read_again + 1, 10)
                    continue
                read_again = 0
                ahead = after
                number += 1
                if chunk.cleared is not None:  # a TRUNCATE: what the bus held is gone
                    exclude.clear()
                # else `exclude` stays: rows inserted since may end this chunk before the
                # keys found on the bus do
                cursor = chunk.cursor if chunk.cursor is not None else cursor
                if chunk.published_rows:
                    pending.append(_stored(chunk, number, cursor))
                else:  # nothing published: done once those before it are
                    self._settle(table, request_id, pending, 0, progress)
                    if chunk.cleared_at is not None:  # and its TRUNCATE
                        self._wait_on_bus(chunk.cleared_at.tx_seq)
                    self._done(table, request_id, _stored(chunk, number, cursor), progress)
                    if chunk.last:
                        return
                    continue
                # the next chunks are read while this one travels
                self._settle(table, request_id, pending,
                             PENDING_CHUNKS if not chunk.last else 0, progress)
                if chunk.last and not pending:
                    return
        finally:
            if ahead is not None:  # its high watermark is written: its merge needs the
                self._outcome(ahead)  # table's recorded transactions, and a retry its record
            self.merger.forget(table)

    def _settle(self, table: str, request_id: int, pending: deque[pb.SnapshotChunk],
                keep: int, progress: Progress | None = None) -> None:
        """Store the cursor of pending chunks once an epoch covers them, until at most
        `keep` are left pending."""
        while len(pending) > keep:
            self._wait_on_bus(pending[0].tx_seq)
            self._done(table, request_id, pending.popleft(), progress)

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

    def _start(self, source: ChunkSource, plan: TablePlan, cursor: list[str] | None,
               request_id: int, number: int, where: str, exclude: set[Key], reset: bool,
               after: Reading | None = None) -> Reading | None:
        """Read one chunk and hand it to the merger, between its watermarks; None when
        `after` (the table's chunk before it, still merging) was discarded already. With
        `reset`, the table's TRUNCATE goes first, at the low watermark: every row is then
        read after it."""
        token = f"{self.pipeline.spec.source.id}:{request_id}:{plan.table}:{number}:" \
                f"{time.time_ns()}"
        chunk = Chunk(plan.table, plan.key_columns, request_id, number, exclude=exclude,
                      cleared=source.cleared(plan) if reset else None)
        if not self.merger.open(token, chunk, after.chunk if after is not None else None):
            return None
        try:
            rows = source.read_chunk(plan, cursor, self.chunk_size, where, token)
            chunk.last = not rows.more
            chunk.cursor = rows.cursor

            def in_flight(chunk: Chunk, position: Position) -> None:
                """Before the read transaction is published: what a restart looks for."""
                record = _stored(chunk, number, cursor, position)
                self._set(plan.table, request_id, lambda entry: entry.inflight.append(record))

            chunk.before_publish = in_flight
            self.merger.fill(token, rows)
            source.write_high(token)
        except BaseException:
            self.merger.abandon(token)
            raise
        return Reading(token, chunk)

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
