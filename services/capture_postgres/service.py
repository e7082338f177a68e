"""The capture-postgres lifecycle: connect -> select tables -> slot -> stream -> publish.

One transaction at a time is buffered whole (spilling past a bound), stamped
and published to the bus; then the publisher closes an epoch. The slot is
told it may discard WAL only up to the minimum position every sink has
checkpointed, and a restart skips transactions at or below that minimum.
"""

from __future__ import annotations

import time

import psycopg

from tailrace.bus import ensure_topic
from tailrace.config import PipelineSpec, PostgresSourceSpec
from tailrace.control_client import ControlClient
from tailrace.errors import FatalError, RetryableError, SourceConfigurationError
from tailrace.events import Op
from tailrace.logs import get_logger
from tailrace.publisher import BusPublisher
from tailrace.txbuffer import TransactionBuffer
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
from tailrace_services.capture_postgres.events import EventFactory, key_columns, make_row
from tailrace_services.capture_postgres.replication import ReplicationConnection, lsn_to_str
from tailrace_services.capture_postgres.tables import ensure_publication, resolve_tables

log = get_logger(__name__)

FEEDBACK_INTERVAL_S = 1.0


class PostgresCapture:
    def __init__(self, pipeline: PipelineSpec, control: ControlClient) -> None:
        source = pipeline.spec.source
        assert isinstance(source, PostgresSourceSpec)
        self.pipeline = pipeline
        self.source = source
        self.control = control
        self.dsn = source.dsn.get_secret_value()
        self.slot = source.slot or f"tailrace_{pipeline.name.replace('-', '_').replace('.', '_')}"
        self.publication = source.publication or self.slot
        self.sink_ids = [s.id for s in pipeline.spec.sinks]
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    def run(self) -> None:
        """Run until stopped; transient failures reconnect with backoff, fatal ones raise."""
        bus = self.pipeline.spec.bus
        delay = 0.5
        while not self._stop:
            try:
                ensure_topic(bus.brokers, self.pipeline.bus_topic, bus.partitions)
                self._run_once()
                return
            except (RetryableError, psycopg.OperationalError) as e:
                log.warning("capture interrupted; reconnecting", error=str(e), retry_in_s=delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _prepare(self) -> str:
        """Check the server, select tables and keep the publication in step; returns the db name."""
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
            wal_level = conn.execute("SHOW wal_level").fetchone()[0]  # type: ignore[index]
            if wal_level != "logical":
                raise SourceConfigurationError(
                    f"source {self.source.id}: wal_level is {wal_level!r}; set wal_level=logical "
                    "in postgresql.conf and restart PostgreSQL")
            tables = resolve_tables(conn, self.source.tables)
            ensure_publication(conn, self.publication, tables, create=self.source.create_slot)
            log.info("tables selected", tables=[f"{s}.{t}" for s, t in tables],
                     publication=self.publication)
            return conn.info.dbname

    def _run_once(self) -> None:
        database = self._prepare()
        resume = self.control.minimum_checkpoint(self.source.id, self.sink_ids)
        skip_upto = resume.position.tx_seq if resume is not None else 0
        publisher = BusPublisher(self.pipeline.spec.bus.brokers, self.pipeline.bus_topic,
                                 self.pipeline.spec.bus.partitions, self.source.id, self.control,
                                 self.source.epoch_ms)
        with ReplicationConnection(self.dsn) as repl:
            identity = repl.identify_system()
            if self.source.create_slot:
                created = repl.create_slot(self.slot)
                if created is not None:
                    log.info("replication slot created", slot=self.slot,
                             consistent_lsn=lsn_to_str(created))
            repl.start(self.slot, self.publication, 0)
            log.info("streaming", slot=self.slot, system_id=identity.system_id,
                     timeline=identity.timeline, resume_after=lsn_to_str(skip_upto))
            try:
                self._stream(repl, publisher, database, identity.timeline, skip_upto)
            finally:
                publisher.close()

    def _stream(self, repl: ReplicationConnection, publisher: BusPublisher, database: str,
                timeline: int, skip_upto: int) -> None:
        decoder = PgOutputDecoder()
        factory = EventFactory(self.source.id, self.pipeline.tenant, database, timeline)
        buffer = TransactionBuffer(self.source.max_tx_memory_events)
        begin: Begin | None = None
        received = 0
        flushed = skip_upto
        next_feedback = 0.0
        while not self._stop:
            now = time.monotonic()
            if now >= next_feedback:
                flushed = self._confirmable(flushed)
                repl.send_status(max(received, flushed), flushed)
                next_feedback = now + FEEDBACK_INTERVAL_S
            data = repl.read(timeout=0.2)
            if data is None:
                publisher.tick()
                continue
            received = max(received, data.wal_end)
            msg = decoder.decode(data.payload)
            if isinstance(msg, Begin):
                begin = msg
                buffer.clear()
            elif isinstance(msg, Insert):
                buffer.append(factory.change(msg.relation, Op.OP_INSERT, make_row(msg.relation,
                                             None), make_row(msg.relation, msg.new),
                                             data.data_start))
            elif isinstance(msg, Update):
                buffer.append(factory.change(msg.relation, Op.OP_UPDATE,
                                             self._before(msg.relation, msg.old, msg.new,
                                                          msg.old_is_key_only),
                                             make_row(msg.relation, msg.new), data.data_start))
            elif isinstance(msg, Delete):
                buffer.append(factory.change(msg.relation, Op.OP_DELETE,
                                             self._before(msg.relation, msg.old, None,
                                                          msg.old_is_key_only),
                                             make_row(msg.relation, None), data.data_start))
            elif isinstance(msg, Truncate):
                for rel in msg.relations:
                    buffer.append(factory.truncate(rel, data.data_start))
            elif isinstance(msg, Commit):
                if begin is None:
                    raise FatalError("pgoutput stream sent a Commit without a Begin")
                if msg.end_lsn > skip_upto and len(buffer):
                    size = len(buffer)
                    publisher.publish_transaction(
                        factory.stamp(ev, xid=begin.xid, end_lsn=msg.end_lsn,
                                      commit_ts_us=msg.commit_ts_us, index=i, size=size)
                        for i, ev in enumerate(buffer))
                buffer.clear()
                begin = None
            elif isinstance(msg, Relation):
                log.debug("relation", table=f"{msg.namespace}.{msg.name}",
                          columns=[c.name for c in msg.columns])

    @staticmethod
    def _before(relation: Relation, old: list | None, new: list | None, key_only: bool):
        """Full before-image with REPLICA IDENTITY FULL, key columns otherwise."""
        if old is not None:
            only = set(key_columns(relation)) if key_only else None
            return make_row(relation, old, only)
        if new is not None:
            return make_row(relation, new, set(key_columns(relation)))
        return make_row(relation, None)

    def _confirmable(self, current: int) -> int:
        """The LSN every sink has checkpointed; never moves backwards within a session."""
        try:
            cp = self.control.minimum_checkpoint(self.source.id, self.sink_ids)
        except RetryableError as e:
            log.warning("cannot read checkpoints; slot not advanced", error=str(e))
            return current
        return max(current, cp.position.tx_seq) if cp is not None else current
