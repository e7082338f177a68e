"""The stream reader: pgoutput messages -> whole, stamped transactions on the bus.

One transaction at a time is buffered (spilling to a file past
`spec.source.max_tx_memory_events`), and published at its Commit, followed by
an epoch marker (`BusPublisher`). Transactions whose commit is at or below the
resume position were already checkpointed by every sink and are skipped: a
transaction's Begin carries its commit LSN, and `commit LSN < resume` exactly
when its end LSN is `<= resume`.

Progress reported to the server (standby status updates): `write` is what was
received, `flush` is the minimum position every sink has checkpointed, re-read
from the control service about every second — so the slot keeps every change
not yet delivered everywhere. While the publisher waits for a slow bus the
reader stops reading (backpressure) but keeps sending status updates, so the
server does not time the connection out.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tailrace.control_client import ControlClient
from tailrace.errors import FatalError, RetryableError
from tailrace.events import Position, PostgresPosition
from tailrace.logs import get_logger
from tailrace.publisher import BusPublisher
from tailrace.txbuffer import TransactionBuffer
from tailrace_services.capture_postgres import metrics
from tailrace_services.capture_postgres.decoder import (
    Begin,
    Commit,
    Delete,
    Insert,
    PgOutputDecoder,
    Relation,
    Truncate,
    Update,
)
from tailrace_services.capture_postgres.events import EventFactory
from tailrace_services.capture_postgres.position import lsn_of, tx_seq_of
from tailrace_services.capture_postgres.replication import ReplicationConnection, lsn_to_str
from tailrace_services.capture_postgres.schema import SchemaTracker

__all__ = ["ChangeStream", "StreamStopped"]

log = get_logger(__name__)

FEEDBACK_INTERVAL_S = 1.0
READ_TIMEOUT_S = 0.2
_CHANGES = (Insert, Update, Delete)


class StreamStopped(Exception):  # noqa: N818 - a signal to unwind, not an error
    """Raised while the publisher waits for the bus, once a stop request has waited too long."""


class ChangeStream:
    """Reads one replication session until stopped or until the connection fails."""

    def __init__(self, repl: ReplicationConnection, control: ControlClient, *, source_id: str,
                 sink_ids: list[str], factory: EventFactory, schemas: SchemaTracker,
                 max_tx_memory_events: int, resume_lsn: int,
                 abandon: Callable[[], bool] = lambda: False) -> None:
        self.repl = repl
        self.control = control
        self.source_id = source_id
        self.sink_ids = sink_ids
        self.factory = factory
        self.schemas = schemas
        self.buffer = TransactionBuffer(max_tx_memory_events)
        self.resume_lsn = resume_lsn
        self.received = 0
        self.confirmed = resume_lsn
        self._abandon = abandon
        self._decoder = PgOutputDecoder()
        self._next_feedback = 0.0
        self._bytes = metrics.BYTES.labels(source_id)

    def keep_alive(self) -> None:
        """Send a status update when one is due (also while the publisher waits for the bus).

        Raises StreamStopped when `abandon()` says a stop request should not wait longer
        for the bus (nothing is lost: the next start publishes again from the checkpoint).
        """
        if self._abandon():
            raise StreamStopped
        now = time.monotonic()
        if now < self._next_feedback:
            return
        self._next_feedback = now + FEEDBACK_INTERVAL_S
        self.confirmed = self._confirmable(self.confirmed)
        self.repl.send_status(max(self.received, self.confirmed), self.confirmed)
        wal_end = self.repl.server_wal_end
        metrics.LAG_BYTES.labels(self.source_id).set(max(wal_end - self.received, 0))
        metrics.RETAINED_BYTES.labels(self.source_id).set(max(wal_end - self.confirmed, 0))

    def run(self, publisher: BusPublisher, stopped: Callable[[], bool],
            tick: Callable[[], None] | None = None) -> None:
        """Read, buffer and publish until `stopped()`; `tick` runs once per loop (cheap)."""
        buffer, factory, schemas = self.buffer, self.factory, self.schemas
        begin: Begin | None = None
        skipping = False
        while not stopped():
            self.keep_alive()
            if tick is not None:
                tick()
            data = self.repl.read(timeout=READ_TIMEOUT_S)
            if data is None:
                publisher.tick()
                continue
            self.received = max(self.received, data.wal_end)
            self._bytes.inc(len(data.payload))
            try:
                msg = self._decoder.decode(data.payload)
            except ValueError as e:
                raise FatalError(f"cannot decode the pgoutput message at "
                                 f"{lsn_to_str(data.data_start)}: {e}") from e
            if isinstance(msg, _CHANGES):
                if not skipping:
                    buffer.append(factory.from_change(msg, data.data_start,
                                                      schemas.of(msg.relation)))
            elif isinstance(msg, Begin):
                begin = msg
                skipping = msg.final_lsn < self.resume_lsn
                buffer.clear()
            elif isinstance(msg, Commit):
                if begin is None:
                    raise FatalError("the pgoutput stream sent a Commit without a Begin: "
                                     "restart the capture service")
                if not skipping and len(buffer):
                    self._publish(publisher, begin, msg)
                buffer.clear()
                begin = None
            elif isinstance(msg, Relation):
                schemas.on_relation(msg, self._seen_at(begin, data.data_start))
            elif isinstance(msg, Truncate) and not skipping:
                for rel in msg.relations:
                    buffer.append(factory.truncate(rel, data.data_start, schemas.of(rel)))

    def _publish(self, publisher: BusPublisher, begin: Begin, commit: Commit) -> None:
        sid, buffer, factory = self.source_id, self.buffer, self.factory
        size = len(buffer)
        tx_seq = tx_seq_of(factory.timelines.of(commit.commit_lsn), commit.end_lsn)
        metrics.SPILL_BYTES.labels(sid).set(buffer.spilled_bytes)
        if buffer.spilled_bytes:
            log.info("large transaction spilled to disk", xid=begin.xid, events=size,
                     spilled_bytes=buffer.spilled_bytes)
        publisher.publish_transaction(
            factory.stamp(event, xid=begin.xid, tx_seq=tx_seq, end_lsn=commit.end_lsn,
                          commit_ts_us=commit.commit_ts_us, index=i, size=size)
            for i, event in enumerate(buffer))
        metrics.EVENTS.labels(sid).inc(size)
        metrics.TRANSACTIONS.labels(sid).inc()
        metrics.LAG_SECONDS.labels(sid).set(max(time.time() - commit.commit_ts_us / 1e6, 0.0))

    def _seen_at(self, begin: Begin | None, lsn: int) -> Position | None:
        """Where a schema was first seen: just before the transaction that carries it."""
        if begin is None:
            return None
        timeline = self.factory.timelines.of(begin.final_lsn)
        return Position(tx_seq=tx_seq_of(timeline, begin.final_lsn), postgres=PostgresPosition(
            commit_lsn=begin.final_lsn, event_lsn=lsn, timeline=timeline))

    def _confirmable(self, current: int) -> int:
        """The LSN every sink has checkpointed; never moves backwards within a session."""
        try:
            checkpoint = self.control.minimum_checkpoint(self.source_id, self.sink_ids)
        except RetryableError as e:
            log.warning("cannot read checkpoints; the slot is not advanced", error=str(e))
            return current
        if checkpoint is None:
            return current
        return max(current, lsn_of(checkpoint.position.tx_seq))
