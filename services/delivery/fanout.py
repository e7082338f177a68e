"""Deliver one slice's batches to every sink concurrently, each with its own retries.

Every sink sees the same batches in the same order; each skips what it already
has (its high-water mark). A sink's outcome is `acked` only if every batch
reached it. A sink raises Tailrace errors (`sinks/base.py`): a `RetryableError` is
retried with backoff and jitter (the sink's policy); after the last attempt, or on a
`NonRetryableError`, the sink stops here for this slice and its checkpoint stays where
it was; a `FatalError` or a `ConfigError` stops the pipeline.

An exactly-once sink's own stored checkpoint must not be behind what it acknowledged
storing (`acked`, kept in the control service's checkpoint, then each batch it wrote):
checked when the slice starts and inside each write (`BatchCommit.floor`). Behind, the sink
lost writes it had acknowledged, and going on would leave the gap for good: the pipeline
stops with both positions and the way back (`exactly_once.SinkLostWrites`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import islice
from operator import lt
from typing import TypeVar

from tailrace.errors import ConfigError, FatalError, RetryableError
from tailrace.events import PositionKey, position_key
from tailrace.logs import get_logger
from tailrace.proto.event_pb2 import ChangeEvent, Position
from tailrace.retry import call_with_retry
from tailrace_services.delivery.sinks.base import (
    BatchCommit,
    PerEventError,
    Sink,
    class_name,
    error_class,
)
from tailrace_services.delivery.sinks.exactly_once import ExactlyOnceSink, SinkLostWrites

log = get_logger(__name__)
T = TypeVar("T")


@dataclass
class SinkOutcome:
    sink_id: str
    required: bool
    acked: bool = True
    delivered: int = 0
    skipped: int = 0
    error_class: str = ""
    error: str = ""
    write_s: float = 0.0        # time spent writing (incl. retries)
    e2e_ms_max: float = 0.0     # source commit -> sink ack, worst event
    # exactly-once sinks: the position key the sink's stored checkpoint is at once the
    # slice is written (what the control checkpoint keeps as `sink_stored`)
    stored: tuple[int, int] | None = None
    dead_letters: list[tuple[ChangeEvent, str]] = field(default_factory=list)


def _pending(batch: Sequence[ChangeEvent], hwm: PositionKey,
             keys: Sequence[PositionKey] | None = None) -> list[ChangeEvent]:
    """Events past the high-water mark `hwm`, in bus order, each position once; `keys`:
    theirs, when known. The usual batch, ascending past `hwm`, is taken whole."""
    if keys is None:
        keys = [position_key(e.position) for e in batch]
    elif len(keys) != len(batch):
        raise ValueError(f"{len(keys)} position keys for a batch of {len(batch)}")
    if keys and keys[0] > hwm and all(map(lt, keys, islice(keys, 1, None))):
        return list(batch)
    out = []
    for event, key in zip(batch, keys, strict=True):
        if key > hwm:
            out.append(event)
            hwm = key
    return out


def deliver_to_sink(sink: Sink, batches: Sequence[Sequence[ChangeEvent]], after: Position | None,
                    commit_for: Callable[[Sink, Position], BatchCommit],
                    dead_letter: bool, sleep: Callable[[float], None] | None = None,
                    partition: int = 0, rewind: int = 0,
                    acked: Position | None = None,
                    keys: Sequence[Sequence[PositionKey]] | None = None) -> SinkOutcome:
    """All batches to one sink, in order; never raises except FatalError and ConfigError.
    `rewind`: the rewind generation of the sink's control checkpoint (which stored checkpoint
    to read); `acked`: where the control checkpoint says the sink's stored checkpoint is, at
    least, in this partition (exactly-once sinks); `keys`: each batch's position keys, when
    known."""
    outcome = SinkOutcome(sink.id, sink.required)
    hwm = position_key(after) if after is not None else (-1, -1)
    started = time.monotonic()
    try:
        stored = _retry(sink, lambda: _open(sink, partition, rewind), sleep)
    except Exception as e:  # noqa: BLE001 - classified in _give_up
        return _give_up(sink, outcome, e)
    floor: Position | None = None
    if isinstance(sink, ExactlyOnceSink):
        if acked is not None:
            SinkLostWrites.check(sink.id, replace(commit_for(sink, acked), floor=acked), stored)
        floor = stored
    if stored is not None and position_key(stored) > hwm:
        # the sink committed further than the control service knows
        if dead_letter:
            _dead_letters_again(sink, batches, hwm, position_key(stored), outcome)
        hwm = position_key(stored)
    try:
        return _deliver_batches(sink, batches, hwm, floor, commit_for, dead_letter, sleep,
                                outcome, keys)
    finally:
        outcome.write_s = time.monotonic() - started


def _dead_letters_again(sink: Sink, batches: Sequence[Sequence[ChangeEvent]],
                        after: tuple[int, int], upto: tuple[int, int],
                        outcome: SinkOutcome) -> None:
    """The sink holds events the control service's checkpoint does not cover: written by a
    task whose result did not reach the commit (a crash, a refused dead-letter append). The
    dead letters of that write went with the result, and the events are skipped now: found
    again by the sink's per-event checks, which give the same answer (the queue may then
    hold an entry twice, never none)."""
    skipped = [e for batch in batches for e in batch
               if after < position_key(e.position) <= upto]
    for i, reason in sink.per_event_failures(skipped) if skipped else []:
        outcome.dead_letters.append((skipped[i], f"sink {sink.id}: {reason}"))
    if outcome.dead_letters:
        log.warning("dead letters found again in events the sink held past the control "
                    "service's checkpoint", sink=sink.id, events=len(outcome.dead_letters))


def _open(sink: Sink, partition: int, rewind: int = 0) -> Position | None:
    """Open once per worker (connect, check the destination), then read its stored checkpoint.

    Asked on every slice: Spark may run the previous batch of this partition in another
    Python worker, which may have written past what this worker last saw. (The Kafka sink
    answers from memory while this worker delivered the partition's last batch:
    `handoff.BatchHandoff`.)"""
    if not getattr(sink, "_opened", False):
        sink.open()
        sink._opened = True
    return sink.stored_position(partition, rewind)


def _retry(sink: Sink, fn: Callable[[], T], sleep: Callable[[float], None] | None) -> T:
    return call_with_retry(
        fn, base_s=sink.retry.base_s, max_s=sink.retry.max_s, attempts=sink.retry.attempts,
        retryable=lambda e: error_class(e) is RetryableError,
        on_retry=lambda n, e, d: log.warning("sink call failed; retrying", sink=sink.id,
                                             attempt=n, error=str(e), retry_in_s=round(d, 3)),
        sleep=sleep or time.sleep)


def _give_up(sink: Sink, outcome: SinkOutcome, error: Exception) -> SinkOutcome:
    cls = error_class(error)
    if cls is ConfigError:
        raise error  # names the sink and the setting already
    if isinstance(error, SinkLostWrites):
        raise error  # names the sink and the way back already
    if cls is FatalError:
        raise FatalError(f"sink {sink.id}: {error}") from error
    outcome.acked = False
    outcome.error_class = class_name(cls)
    outcome.error = f"{type(error).__name__}: {error}"
    log.error("sink gave up on this batch", sink=sink.id, required=sink.required,
              error_class=outcome.error_class, error=outcome.error)
    return outcome


def _deliver_batches(sink: Sink, batches: Sequence[Sequence[ChangeEvent]], hwm: tuple[int, int],
                     floor: Position | None, commit_for: Callable[[Sink, Position], BatchCommit],
                     dead_letter: bool, sleep: Callable[[float], None] | None,
                     outcome: SinkOutcome, keys: Sequence[Sequence[PositionKey]] | None = None
                     ) -> SinkOutcome:
    """`floor`: an exactly-once sink's stored checkpoint, as read when the slice started,
    then moved by each batch it wrote (None: it stores none, or not yet)."""
    for n, batch in enumerate(batches):
        todo = _pending(batch, hwm, keys[n] if keys is not None else None)
        outcome.skipped += len(batch) - len(todo)
        if not todo:
            continue
        commit = replace(commit_for(sink, todo[-1].position), floor=floor, ascending=True)
        try:
            written = _retry(sink, partial(_write, sink, todo, commit, dead_letter, outcome),
                             sleep)
        except Exception as e:  # noqa: BLE001 - classified in _give_up
            return _give_up(sink, outcome, e)
        if written and isinstance(sink, ExactlyOnceSink):
            floor = commit.position
        outcome.stored = position_key(floor) if floor is not None else None
        outcome.delivered += len(todo)
        hwm = position_key(todo[-1].position)
        acked_us = time.time() * 1e6
        oldest = min((e.ts_source_micros for e in todo if e.ts_source_micros), default=0)
        if oldest:
            outcome.e2e_ms_max = max(outcome.e2e_ms_max, (acked_us - oldest) / 1000)
    return outcome


def _write(sink: Sink, events: list[ChangeEvent], commit: BatchCommit, dead_letter: bool,
           outcome: SinkOutcome) -> bool:
    """One write; per-event failures go to the dead letters (when allowed) and the rest is
    resent. False when nothing was written (every event a dead letter)."""
    try:
        sink.write(events, commit)
    except PerEventError as e:
        if not dead_letter:
            raise
        bad = {i for i, _ in e.failures}
        outcome.dead_letters.extend((events[i], f"sink {sink.id}: {reason}")
                                    for i, reason in e.failures)
        rest = [ev for i, ev in enumerate(events) if i not in bad]
        if not rest:
            return False
        sink.write(rest, commit)
    return True


def fan_out(sinks: Sequence[Sink], batches: Sequence[Sequence[ChangeEvent]],
            checkpoints: dict[str, Position | None],
            commit_for: Callable[[Sink, Position], BatchCommit], dead_letter: bool,
            partition: int = 0, rewinds: dict[str, int] | None = None,
            acked: dict[str, Position] | None = None,
            keys: Sequence[Sequence[PositionKey]] | None = None) -> list[SinkOutcome]:
    """Every sink concurrently; returns outcomes in sink order; re-raises a FatalError or a
    ConfigError.
    `rewinds`: each sink's rewind generation (default 0); `acked`: what each exactly-once
    sink acknowledged storing in this partition (`deliver_to_sink`); `keys`: each batch's
    position keys, when known."""
    rewinds, acked = rewinds or {}, acked or {}

    def one(sink: Sink) -> SinkOutcome:
        return deliver_to_sink(sink, batches, checkpoints.get(sink.id), commit_for, dead_letter,
                               partition=partition, rewind=rewinds.get(sink.id, 0),
                               acked=acked.get(sink.id), keys=keys)

    if len(sinks) == 1:
        return [one(sinks[0])]
    with ThreadPoolExecutor(max_workers=len(sinks), thread_name_prefix="sink") as pool:
        return list(pool.map(one, sinks))
