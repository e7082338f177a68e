"""The transaction loop both capture sources run: buffer -> stamp -> publish -> epoch.

A source's feed (`events.py` of each connector) yields, in source order:

- `BEGIN`: a transaction starts (anything still buffered is dropped);
- a `Change` (`changes.py`), a `ChangeEvent`, or a list of them: changes of the open
  transaction, not yet stamped — row changes as bytes, the rare rest (TRUNCATE, DDL) as
  events;
- a `Commit`: the transaction committed (its changes yielded before it, or held by the
  feed in its `items`). `records` stamps its `Change`s into bus records,
  `stamp(event, index, size)` its events: both fill the transaction fields (id,
  position, `tx_index/tx_size/tx_end`, idempotency key); `position` is where the
  transaction ends, `commit_ts_us` its source commit time;
- `IDLE`: nothing new right now (a server heartbeat, a read timeout);
  a `Commit` with `advances` (a source heartbeat's transaction, with no event) publishes
  nothing but lets the next epoch close at that position, so the sinks' checkpoints, and
  with them what the source may release, move while the captured tables are idle;
- a `Prepared` transaction: whole, stamped and in bus form already (a snapshot chunk's
  read transaction, `snapshot/records.py`), published as it is.

The assembler holds the open transaction in a `TransactionBuffer` (spilling to disk
past `spec.source.max_tx_memory_events`, so a 1 GB transaction needs no 1 GB of RAM),
and at its Commit stamps every event and hands the whole transaction to the
`BusPublisher`, which blocks while the bus is slow (backpressure; nothing is dropped)
and closes an epoch after it at most every `epoch_ms`; `IDLE` closes a pending epoch.
A transaction with no events (nothing of it selected) publishes nothing. Every
Commit is reported to the `ResumeRule` as published.

What is a source's own stays in its feed, before it yields or after a yielded
Commit returns (by then the transaction is with the publisher): PostgreSQL skips
transactions at or below its resume LSN, checks re-read transactions against its
history (`history.py`) and confirms its slot (`position.SlotFeedback`); MySQL refuses
statement-based changes to captured tables and turns DDL into events.

The session ends through the context manager: a clean end, or a `SourceLostError`
(the source's connection broke; what was read is good), closes the publisher, which
waits until the bus acknowledged everything and the last epoch is recorded, so the
next session can continue after it. Any other error aborts: what the bus did not
acknowledge is dropped, and the resume rule forgets what this process published
(the next session asks the bus).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from tailrace.config import PipelineSpec
from tailrace.control_client import ControlClient
from tailrace.errors import SourceLostError
from tailrace.events import bus_key, encode_event
from tailrace.logs import get_logger
from tailrace.proto.event_pb2 import ChangeEvent, Position
from tailrace_services.capture.changes import CHANGE_ITEMS, Change, ChangeStamp
from tailrace_services.capture.metrics import CaptureMetrics
from tailrace_services.capture.publisher import BusPublisher
from tailrace_services.capture.resume import ResumeRule
from tailrace_services.capture.txbuffer import TransactionBuffer

__all__ = ["BEGIN", "IDLE", "Assembler", "Begin", "Commit", "FeedItem", "Idle", "Prepared",
           "Stamp", "transaction_records"]

log = get_logger(__name__)

RUN = 512  # changes stamped per C call: a spilled transaction is streamed, never held whole

Stamp = Callable[[ChangeEvent, int, int], ChangeEvent]
"""(event, index, size) -> the event with its transaction fields filled."""


class Begin:
    """A transaction starts."""


class Idle:
    """Nothing new from the source right now."""


BEGIN = Begin()
IDLE = Idle()


@dataclass(frozen=True, slots=True)
class Commit:
    stamp: Stamp
    position: Position  # where the transaction ends (its events' position, event_index 0)
    commit_ts_us: int
    tx_id: str = ""  # for messages
    # a transaction without events whose position an epoch may still close at (the
    # source's heartbeat), as an event's: where its last change is
    advances: Position | None = None
    records: ChangeStamp | None = None  # for its `Change`s (a feed that yields them)
    # the transaction's items when the feed held them itself (a PostgreSQL transaction
    # streamed while open, interleaved with others): published instead of what the
    # assembler buffered, which is nothing then
    items: TransactionBuffer | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A whole transaction in bus form: (bus key, serialized `BusRecord`) per event."""

    records: list[tuple[bytes, bytes]]
    position: Position  # where the transaction ends, as `Commit.position`
    last: Position  # its last event's position
    commit_ts_us: int
    tx_id: str = ""


FeedItem = (Begin | Change | ChangeEvent | list[Change] | list[ChangeEvent] | Commit | Idle
            | Prepared)


def transaction_records(items: Iterable[Change | ChangeEvent], commit: Commit, size: int
                        ) -> Iterator[tuple[bytes, bytes]]:
    """A committed transaction's `size` items as bus records, in order: its changes in runs
    of at most RUN by `commit.records`, its events one by one by `commit.stamp`."""
    run: list[Change] = []
    for index, item in enumerate(items):
        if isinstance(item, Change):
            run.append(item)
            if len(run) == RUN:
                yield from _stamped(commit, run, index + 1 - RUN, size)
                run = []
            continue
        if run:
            yield from _stamped(commit, run, index - len(run), size)
            run = []
        event = commit.stamp(item, index, size)
        yield bus_key(event), encode_event(event)
    if run:
        yield from _stamped(commit, run, size - len(run), size)


def _stamped(commit: Commit, run: list[Change], first: int, size: int
             ) -> list[tuple[bytes, bytes]]:
    if commit.records is None:
        raise TypeError("a capture feed yielded a Change, but its Commit has no `records` "
                        "to stamp it")
    return commit.records.records(run, first, size)


class Assembler:
    """One session's transaction loop over a source's feed (module docstring)."""

    def __init__(self, pipeline: PipelineSpec, control: ControlClient, metrics: CaptureMetrics,
                 resume: ResumeRule, *, idle: Callable[[], None] | None = None) -> None:
        """`idle` is called while the publisher waits for the bus (keep the source's
        connection alive)."""
        source, bus = pipeline.spec.source, pipeline.spec.bus
        self.metrics = metrics
        self.resume = resume
        self.buffer = TransactionBuffer(source.max_tx_memory_events)
        self.publisher = BusPublisher(bus.brokers, pipeline.bus_topic, bus.partitions, source.id,
                                      control, source.epoch_ms, idle=idle,
                                      client_config=bus.client_config,
                                      heartbeat_ms=source.heartbeat_ms)

    def run(self, feed: Iterable[FeedItem], stopped: Callable[[], bool]) -> None:
        """Buffer, stamp and publish the feed's transactions until `stopped()` or it ends."""
        buffer = self.buffer
        append = buffer.append
        for item in feed:
            if isinstance(item, CHANGE_ITEMS):
                append(item)
            elif isinstance(item, list):
                for event in item:
                    append(event)
            elif isinstance(item, Commit):
                self._commit(item)
            elif isinstance(item, Begin):
                buffer.clear()
            elif isinstance(item, Idle):
                self.publisher.tick()
            elif isinstance(item, Prepared):
                self._publish_prepared(item)
            else:
                raise TypeError(f"a capture feed yielded {type(item).__name__}, not a feed item")
            if stopped():
                return

    def _commit(self, commit: Commit) -> None:
        metrics, publisher = self.metrics, self.publisher
        buffer = self.buffer if commit.items is None else commit.items
        size = len(buffer)
        if size:
            metrics.spill_bytes.set(buffer.spilled_bytes)
            if buffer.spilled_bytes:
                log.info("large transaction spilled to disk", tx_id=commit.tx_id, events=size,
                         spilled_bytes=buffer.spilled_bytes)
            sent = publisher.bytes_published
            publisher.publish_records(transaction_records(buffer, commit, size))
            metrics.events.inc(size)
            metrics.transactions.inc()
            metrics.event_bytes.inc(publisher.bytes_published - sent)
            buffer.clear()
        elif commit.advances is not None:
            publisher.advance(commit.advances, commit.commit_ts_us // 1000)
        else:
            publisher.tick()
        metrics.lag_seconds.set(max(time.time() - commit.commit_ts_us / 1e6, 0.0))
        self.resume.published_up_to(commit.position)

    def _publish_prepared(self, prepared: Prepared) -> None:
        metrics, publisher = self.metrics, self.publisher
        sent = publisher.bytes_published
        publisher.publish_records(prepared.records, prepared.last,
                                  prepared.commit_ts_us // 1000)
        metrics.events.inc(len(prepared.records))
        metrics.transactions.inc()
        metrics.event_bytes.inc(publisher.bytes_published - sent)
        metrics.lag_seconds.set(max(time.time() - prepared.commit_ts_us / 1e6, 0.0))
        self.resume.published_up_to(prepared.position)

    # -- the session's end ------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.buffer.clear()
        if exc is not None and not isinstance(exc, SourceLostError):
            self._abort()
            return
        if exc is not None:
            self.publisher.idle = None  # no keep-alives: the source is gone
        try:
            self.publisher.close()
        except BaseException:
            self._abort()
            raise

    def _abort(self) -> None:
        self.resume.forget()
        with contextlib.suppress(Exception):
            self.publisher.abort()
