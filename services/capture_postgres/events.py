"""Decoded pgoutput changes -> `Change`s, transaction by transaction, for the assembler.

`ChangeFeed` reads one replication session and yields what the shared assembler
(`tailrace_services.capture.assembler`) buffers and publishes: BEGIN, the events of
each change, a Commit that stamps them, IDLE when nothing arrived. PostgreSQL's own
rules happen here, in order:

- transactions at or below the resume position were already checkpointed by every
  sink and are skipped: a transaction's Begin carries its commit LSN, and
  `commit LSN < resume` exactly when its end LSN is `<= resume` — in the history we
  read before;
- every commit, skipped or not, first goes through `HistoryCheck` (`history.py`),
  which stops with a lost position when the re-read WAL is another history that
  reuses our LSNs; each event's position names its transaction (xid, commit time)
  for that;
- the slot is confirmed by `position.SlotFeedback`, called before every read and
  while the publisher waits for the bus.

A transaction the server streams while it is open (`source.stream_transactions_over`,
protocol 2) is held here, one `TransactionBuffer` each, as its blocks arrive between
the others' messages; a rolled-back subtransaction's changes are cut from it (they
follow its first change: everything after it until the rollback is of it or of its
own subtransactions); at its StreamCommit it goes to the assembler whole, in the
Commit's `items`, at the place in commit order its Commit has — the resume and
history rules apply to it there, as to any other.

Keys: `key_columns` is the table's primary key, or its replica-identity index under
USING INDEX, whatever the replica identity (`schema.py`); never every column.

Before-images: with `REPLICA IDENTITY FULL` the server sends the whole old row of
an update or delete, and `before` has every column; otherwise (DEFAULT, USING
INDEX) it sends only the key columns — for an update only when the key changed —
and `before` holds just the key columns (taken from the new row when the server
sent no old one). A column the server did not send because its TOASTed value did
not change carries `unchanged_toast`, never NULL — except in the after-image of an
update under FULL, where the old row has the value and it is copied from there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tailrace.errors import FatalError
from tailrace.events import (
    ChangeEvent,
    EventIds,
    Op,
    Position,
    PostgresPosition,
    Row,
    idempotency_key,
)
from tailrace.events import event_id as make_event_id
from tailrace.events._wire import row_bytes, varint
from tailrace.logs import get_logger
from tailrace_services.capture.assembler import BEGIN, IDLE, Commit, FeedItem
from tailrace_services.capture.changes import Change, ChangeStamp, ChangeTemplate
from tailrace_services.capture.metrics import CaptureMetrics
from tailrace_services.capture.snapshot import WATERMARK_PREFIX, Watermark, parse_watermark
from tailrace_services.capture.txbuffer import MemoryBudget, TransactionBuffer
from tailrace_services.capture_postgres.connection import ReplicationConnection, lsn_to_str
from tailrace_services.capture_postgres.history import HistoryCheck
from tailrace_services.capture_postgres.position import (
    HEARTBEAT_PREFIX,
    SlotFeedback,
    Timelines,
    tx_seq_of,
)
from tailrace_services.capture_postgres.reader import (
    UNCHANGED_VALUE,
    Begin,
    Delete,
    Insert,
    LogicalMessage,
    PgOutputDecoder,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Update,
)
from tailrace_services.capture_postgres.reader import Commit as PgCommit
from tailrace_services.capture_postgres.schema import SchemaTracker, choose_key

__all__ = ["ChangeFeed", "EventFactory", "KeyOf", "encoded_row", "fill_unchanged_toast"]

log = get_logger(__name__)

READ_TIMEOUT_S = 0.2  # the longest a read waits for the server before IDLE
_CHANGES = (Insert, Update, Delete)

_INSERT, _UPDATE, _DELETE, _TRUNCATE = Op.OP_INSERT, Op.OP_UPDATE, Op.OP_DELETE, Op.OP_TRUNCATE

KeyOf = Callable[[Relation], list[str]]
"""The key columns of a table's events (`schema.KeyCatalog.key_of`)."""


def fill_unchanged_toast(new: list[bytes], old: list[bytes]) -> list[bytes]:
    """`new` with each unchanged-TOAST value replaced by the old row's value, where the
    server sent one (a whole old row: REPLICA IDENTITY FULL). `new` itself if it has none."""
    if UNCHANGED_VALUE not in new:
        return new
    return [o if n == UNCHANGED_VALUE and o != UNCHANGED_VALUE else n
            for n, o in zip(new, old, strict=True)]


def encoded_row(relation: Relation, values: list[bytes], only: set[str] | None = None
                ) -> bytes:
    """The columns (all, or those named in `only`) of a decoded tuple, serialized as a
    `Row`."""
    if only is None:
        return row_bytes(relation.prefixes, values)
    kept = [(prefix, value) for col, prefix, value
            in zip(relation.columns, relation.prefixes, values, strict=True) if col.name in only]
    return row_bytes([p for p, _ in kept], [v for _, v in kept])


_POSTGRES = Position.DESCRIPTOR.fields_by_name["postgres"].number


class EventFactory:
    """Builds the events of one transaction; ids and positions stamped when the commit is known."""

    def __init__(self, source_id: str, tenant: str, database: str, timelines: Timelines,
                 key_of: KeyOf) -> None:
        self.source_id = source_id
        self.tenant = tenant
        self.database = database
        self.timelines = timelines
        self.key_of = key_of
        self._keys: dict[int, tuple[Relation, list[str], set[str]]] = {}
        # per (relation oid, op): (relation, schema, keys, its changes' template)
        self._templates: dict[tuple[int, int], tuple[Relation, tuple[str, int], list[str],
                                                     ChangeTemplate]] = {}

    def key_columns(self, relation: Relation) -> list[str]:
        return self._key_columns(relation)[0]

    def _key_columns(self, relation: Relation) -> tuple[list[str], set[str]]:
        cached = self._keys.get(relation.oid)
        if cached is None or cached[0] is not relation:
            keys = self.key_of(relation)
            cached = (relation, keys, set(keys))
            self._keys[relation.oid] = cached
        return cached[1], cached[2]

    def from_change(self, msg: Insert | Update | Delete, event_lsn: int,
                    schema: tuple[str, int], keys: list[str] | None = None) -> Change:
        """The change as bytes (`capture/changes.py`): the fields all of a relation's
        events share, serialized once (`template`), its own position fields, rows and bus
        key. A row is there exactly when it was filled. `keys`: instead of `key_of`'s."""
        rel = msg.relation
        keys, key_set = self._key_columns(rel) if keys is None else (keys, set(keys))
        before: bytes | None = None
        after: bytes | None = None
        if isinstance(msg, Insert):
            op, after = _INSERT, encoded_row(rel, msg.new)
        elif isinstance(msg, Update):
            op, before = _UPDATE, self._before(rel, msg.old, msg.new, msg.old_is_key_only,
                                               key_set)
            new = msg.new
            if msg.old is not None and not msg.old_is_key_only:  # a whole old row: FULL
                new = fill_unchanged_toast(new, msg.old)
            after = encoded_row(rel, new)
        else:
            op, before = _DELETE, self._before(rel, msg.old, None, msg.old_is_key_only,
                                               key_set)
        at = (b"\x10" + varint(event_lsn) if event_lsn else b"") + \
            (b"\x18" + varint(timeline) if (timeline := self.timelines.of(event_lsn)) else b"")
        return self.template(rel, op, schema, keys).change(at, before, after)

    def template(self, relation: Relation, op: Op, schema: tuple[str, int], keys: list[str]
                 ) -> ChangeTemplate:
        cached = self._templates.get((relation.oid, op))
        if cached is None or cached[0] is not relation or cached[1] != schema or \
                cached[2] is not keys:
            template = ChangeTemplate.of(ChangeEvent(
                source_id=self.source_id, tenant=self.tenant, database=self.database,
                schema=relation.namespace, table=relation.name, op=op, key_columns=keys,
                schema_version=schema[0], schema_sequence=schema[1]), _POSTGRES)
            cached = self._templates[(relation.oid, op)] = (relation, schema, keys, template)
        return cached[3]

    @staticmethod
    def _before(relation: Relation, old: list[bytes] | None, new: list[bytes] | None,
                key_only: bool, keys: set[str]) -> bytes | None:
        """Full before-image with REPLICA IDENTITY FULL, key columns otherwise; None: none."""
        if old is not None:
            return encoded_row(relation, old, keys if key_only else None)
        if new is not None:
            return encoded_row(relation, new, keys)
        return None

    def change(self, relation: Relation, op: Op, before: Row | None, after: Row | None,
               event_lsn: int, schema: tuple[str, int] = ("", 0), keys: list[str] | None = None
               ) -> ChangeEvent:
        event = ChangeEvent(
            source_id=self.source_id, tenant=self.tenant, database=self.database,
            schema=relation.namespace, table=relation.name, op=op, before=before, after=after,
            key_columns=keys if keys is not None else self._key_columns(relation)[0],
            schema_version=schema[0], schema_sequence=schema[1])
        postgres = event.position.postgres
        postgres.event_lsn = event_lsn
        postgres.timeline = self.timelines.of(event_lsn)
        return event

    def truncate(self, relation: Relation, event_lsn: int, schema: tuple[str, int] = ("", 0),
                 keys: list[str] | None = None) -> ChangeEvent:
        return self.change(relation, _TRUNCATE, None, None, event_lsn, schema, keys)

    def stamp(self, event: ChangeEvent, *, xid: int, tx_seq: int, end_lsn: int,
              commit_ts_us: int, index: int, size: int, ids: EventIds | None = None,
              captured_us: int = 0) -> ChangeEvent:
        """Fill the transaction fields once the commit is known (`tx_seq`: see position.py);
        `captured_us`, when it was read (now if 0), is the transaction's, as `ChangeStamp`'s.

        The id depends only on the source id, `tx_seq` and the index, so a transaction
        re-read after a restart gets the same ids. The position names its transaction
        (xid, commit time), so a checkpoint can be recognised on re-read (`history.py`).
        """
        event.tx_id = str(xid)
        event.tx_index = index
        event.tx_size = size
        event.tx_end = index == size - 1
        position = event.position
        position.tx_seq = tx_seq
        position.event_index = index
        postgres = position.postgres
        postgres.commit_lsn = end_lsn
        postgres.xid = xid
        postgres.commit_ts_us = commit_ts_us
        event.ts_source_micros = commit_ts_us
        event.ts_captured_micros = captured_us or time.time_ns() // 1000
        event.id = ids(index) if ids is not None else \
            make_event_id(self.source_id, f"{tx_seq:X}", index, commit_ts_us // 1000)
        event.idempotency_key = idempotency_key(
            self.tenant, self.database,
            f"{event.schema}.{event.table}" if event.schema else event.table, event.tx_id,
            event.id)
        return event


@dataclass(frozen=True, slots=True)
class _HeldRelation:
    """A Relation of a streamed transaction, with the schema its changes carry (sequence
    None: a structure registered only at the commit) and, for those, the key columns its
    flags give until then (one list: the factory's template cache holds to it)."""

    relation: Relation
    lsn: int
    schema: tuple[str, int | None]
    keys: list[str] | None


@dataclass(slots=True)
class _Streamed:
    """A transaction the server streams while it is open: what came of it so far.

    Its Relations are kept with the schema its changes carry: one the registry holds, or a
    structure it does not hold yet (a DDL in the transaction, which may still roll back),
    registered at the commit, when its changes are made again (`provisional`)."""

    xid: int
    items: TransactionBuffer
    relations: list[_HeldRelation] = field(default_factory=list)  # in order
    subxacts: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    """Each subtransaction that sent something: how many items, relations and TRUNCATE
    events came before its first."""
    provisional: dict[bytes, str] = field(default_factory=dict)
    """The templates of changes made under a structure not registered yet: its fingerprint."""
    truncates: int = 0  # TRUNCATE events among its items (`rows` counts row changes)

    def note(self, xid: int) -> None:
        if xid != self.xid and xid not in self.subxacts:
            self.subxacts[xid] = (len(self.items), len(self.relations), self.truncates)

    def add(self, item: Change | ChangeEvent, xid: int) -> None:
        self.note(xid)
        self.items.append(item)

    def held(self, relation: Relation) -> _HeldRelation | None:
        """The relation as held here (its latest Relation message)."""
        for held in reversed(self.relations):
            if held.relation is relation:
                return held
        return None

    def abort(self, subxid: int) -> bool:
        """Drop the subtransaction's changes and Relations, and those of the subtransactions
        after its first: its own, rolled back with it. False: none of it was sent."""
        first = self.subxacts.get(subxid)
        if first is None:
            return False
        self.items.truncate(first[0])
        del self.relations[first[1]:]
        self.truncates = first[2]
        self.subxacts = {xid: at for xid, at in self.subxacts.items() if at < first}
        return True


@dataclass
class ChangeFeed:
    """One replication session's pgoutput messages as the assembler's feed. `history`:
    what the re-read must show (nothing by default); `tick` runs before every read (cheap:
    the table watcher); `idle_s`: how long a read waits for the server before the feed
    yields IDLE (`publisher.idle_report_s`); `max_in_memory`: of the transactions
    streamed while open, the items held in memory, all together
    (`source.max_tx_memory_events`; the rest is spilled)."""

    repl: ReplicationConnection
    factory: EventFactory
    schemas: SchemaTracker
    feedback: SlotFeedback
    metrics: CaptureMetrics
    resume_lsn: int
    history: HistoryCheck | None = None
    tick: Callable[[], None] | None = None
    idle_s: float = READ_TIMEOUT_S
    max_in_memory: int = 10_000
    _decoder: PgOutputDecoder = field(default_factory=PgOutputDecoder, init=False)
    _budget: MemoryBudget = field(init=False)  # the streamed transactions', together

    def __post_init__(self) -> None:
        self._budget = MemoryBudget(self.max_in_memory)

    def items(self) -> Iterator[FeedItem | Watermark]:
        """Read until the connection fails (the assembler stops pulling when stopped)."""
        streams: dict[int, _Streamed] = {}  # transactions streamed while open, by xid
        try:
            yield from self._items(streams)
        finally:
            for held in streams.values():
                held.items.clear()  # its spill file

    def _items(self, streams: dict[int, _Streamed]) -> Iterator[FeedItem | Watermark]:
        repl, decoder, factory, schemas = self.repl, self._decoder, self.factory, self.schemas
        decode = decoder.decode
        history = self.history or HistoryCheck(self.resume_lsn, [])
        feedback, tick, idle_s = self.feedback, self.tick, self.idle_s
        log_bytes, rows = self.metrics.log_bytes, self.metrics.rows
        begin: Begin | None = None
        skipping = False
        changes = events = 0
        heartbeat = 0  # LSN of the open transaction's heartbeat message, if it has one
        block: _Streamed | None = None  # the transaction of the open stream block
        read_bytes = 0  # counted in `log_bytes` once a transaction, not once a message
        while True:
            feedback.keep_alive()
            if tick is not None:
                tick()
            data = repl.read(timeout=idle_s)
            if data is None:
                if read_bytes:
                    log_bytes.inc(read_bytes)
                    read_bytes = 0
                if history.pending:  # everything sent before that point is handled
                    history.on_wal_end(repl.server_wal_end)
                yield IDLE
                continue
            if data.wal_end > feedback.received:
                feedback.received = data.wal_end
            read_bytes += len(data.payload)
            try:
                msg = decode(data.payload)
            except ValueError as e:
                raise FatalError(f"cannot decode the pgoutput message at "
                                 f"{lsn_to_str(data.data_start)}: {e}") from e
            if isinstance(msg, _CHANGES):
                if block is not None:
                    block.add(self._streamed_change(block, msg, data.data_start, decoder.xid),
                              decoder.xid)
                elif not skipping:
                    changes += 1
                    yield factory.from_change(msg, data.data_start, schemas.of(msg.relation))
            elif isinstance(msg, Begin):
                begin, changes, events, heartbeat = msg, 0, 0, 0
                skipping = msg.final_lsn < self.resume_lsn
                yield BEGIN
            elif isinstance(msg, PgCommit):
                if begin is None:
                    raise FatalError("the pgoutput stream sent a Commit without a Begin: "
                                     "restart the capture service")
                history.on_commit(begin.xid, begin.final_lsn, msg.end_lsn, msg.commit_ts_us)
                log_bytes.inc(read_bytes)
                read_bytes = 0
                if not skipping:
                    rows.inc(changes)
                    yield self._commit(begin, msg, 0 if changes or events else heartbeat)
                    if changes or events or heartbeat:  # published, or an epoch may close
                        # there: the slot may be confirmed up to it
                        feedback.published = max(feedback.published, msg.end_lsn)
                begin = None
            elif isinstance(msg, Relation) and block is not None:
                block.note(decoder.xid)
                block.relations.append(self._hold(msg, data.data_start))
            elif isinstance(msg, Relation):
                schemas.on_relation(msg, self._seen_at(begin, data.data_start))
            elif isinstance(msg, Truncate) and block is not None:
                for rel in msg.relations:
                    held_rel = self._streamed_relation(block, rel, decoder.xid)
                    fp, sequence = held_rel.schema
                    block.add(factory.truncate(rel, data.data_start, (fp, sequence or 0),
                                               held_rel.keys), decoder.xid)
                    block.truncates += 1
            elif isinstance(msg, Truncate) and not skipping:
                for rel in msg.relations:
                    events += 1
                    yield factory.truncate(rel, data.data_start, schemas.of(rel))
            elif isinstance(msg, StreamStart):
                block = self._block(streams, msg)
            elif isinstance(msg, StreamStop):
                block = None
            elif isinstance(msg, StreamCommit):
                held = streams.get(msg.xid)
                if held is None:
                    raise FatalError(f"the pgoutput stream committed transaction {msg.xid}, "
                                     "none of whose changes this session read: restart the "
                                     "capture service")
                history.on_commit(msg.xid, msg.commit_lsn, msg.end_lsn, msg.commit_ts_us)
                log_bytes.inc(read_bytes)
                read_bytes = 0
                streamed = Begin(msg.commit_lsn, msg.commit_ts_us, msg.xid)
                if msg.commit_lsn >= self.resume_lsn:  # else published before: Begin's rule
                    items = self._settle(held, streamed)
                    size = len(items)
                    rows.inc(size - held.truncates)
                    yield self._commit(streamed, PgCommit(msg.flags, msg.commit_lsn, msg.end_lsn,
                                                          msg.commit_ts_us), items=items)
                    items.clear()  # (the assembler did, once it was published)
                    if size:
                        feedback.published = max(feedback.published, msg.end_lsn)
                del streams[msg.xid]
                held.items.clear()
            elif isinstance(msg, StreamAbort):
                held = streams.get(msg.xid)
                if held is not None and msg.subxid == msg.xid:
                    del streams[msg.xid]
                    held.items.clear()
                elif held is not None and held.abort(msg.subxid):
                    decoder.keep_stream_relations(msg.xid, (one.relation for one in held.relations))
            elif isinstance(msg, LogicalMessage) and begin is not None and \
                    msg.prefix == HEARTBEAT_PREFIX and msg.transactional:
                heartbeat = data.data_start
            elif isinstance(msg, LogicalMessage) and begin is None and \
                    msg.prefix == WATERMARK_PREFIX and not msg.transactional:
                mark = self._watermark(msg)
                if mark is not None:
                    yield mark
                    if mark.published:  # a read transaction sits at it
                        feedback.published = max(feedback.published, msg.lsn + 1)

    def _hold(self, relation: Relation, lsn: int) -> _HeldRelation:
        schema = self.schemas.registered(relation)
        keys = choose_key(relation, None) if schema[1] is None else None  # the flags alone
        return _HeldRelation(relation, lsn, schema, keys)

    def _streamed_relation(self, held: _Streamed, relation: Relation, xid: int
                           ) -> _HeldRelation:
        """How a streamed change of `relation` is made. The server sends a Relation before a
        table's first change in each streamed transaction (again after a subtransaction
        rolled back), so the fallback, a Relation from before the transaction, is not
        expected."""
        found = held.held(relation)
        if found is None:
            held.note(xid)
            found = self._hold(relation, 0)
            held.relations.append(found)
        return found

    def _streamed_change(self, held: _Streamed, msg: Insert | Update | Delete, lsn: int,
                         xid: int) -> Change:
        made_as = self._streamed_relation(held, msg.relation, xid)
        fp, sequence = made_as.schema
        if sequence is not None:
            return self.factory.from_change(msg, lsn, (fp, sequence))
        change = self.factory.from_change(msg, lsn, (fp, 0), made_as.keys)
        held.provisional[change.template] = fp
        return change

    def _settle(self, held: _Streamed, begin: Begin) -> TransactionBuffer:
        """At a streamed transaction's commit: register the structures it brought (a drift
        is met here, as in a transaction sent whole), then remake the changes made under a
        structure the registry did not hold, with their registered schema and the key the
        catalog now gives. The transaction's items, remade or not."""
        schemas, factory = self.schemas, self.factory
        # each new structure, by fingerprint: a Relation of it and its registered schema
        pending: dict[str, tuple[Relation, tuple[str, int]]] = {}
        for one in held.relations:
            registered = schemas.on_relation(one.relation, self._seen_at(begin, one.lsn))
            if one.schema[1] is None:
                pending[one.schema[0]] = (one.relation, registered)
        if not pending:
            return held.items
        log.info("a transaction streamed while open changed a table's structure: its changes "
                 "are made again with the schema registered at its commit", xid=held.xid,
                 events=len(held.items))
        remade = TransactionBuffer(budget=self._budget)
        try:
            for item in held.items:
                if isinstance(item, Change):
                    fp = held.provisional.get(item.template)
                    if fp is not None:
                        relation, schema = pending[fp]
                        event = item.event()
                        before = event.before.SerializeToString() \
                            if event.HasField("before") else None
                        after = event.after.SerializeToString() \
                            if event.HasField("after") else None
                        item = factory.template(relation, event.op, schema,
                                                factory.key_columns(relation)
                                                ).change(item.at, before, after)
                elif item.schema_version in pending and item.schema_sequence == 0:  # TRUNCATE
                    relation, schema = pending[item.schema_version]
                    item.schema_sequence = schema[1]
                    item.key_columns[:] = factory.key_columns(relation)
                remade.append(item)
        except BaseException:
            remade.clear()
            raise
        held.items.clear()
        return remade

    def _block(self, streams: dict[int, _Streamed], start: StreamStart) -> _Streamed:
        """The transaction a stream block is of: a new one at its first block."""
        held = streams.get(start.xid)
        if start.first:
            if held is not None:
                raise FatalError(f"the pgoutput stream started transaction {start.xid} twice: "
                                 "restart the capture service")
            held = streams[start.xid] = _Streamed(start.xid,
                                                  TransactionBuffer(budget=self._budget))
        elif held is None:
            raise FatalError(f"the pgoutput stream went on with transaction {start.xid}, whose "
                             "first changes this session did not read: restart the capture "
                             "service")
        return held

    def _commit(self, begin: Begin, commit: PgCommit, heartbeat: int = 0,
                items: TransactionBuffer | None = None) -> Commit:
        """`heartbeat`: the LSN of the heartbeat message of a transaction without changes
        (`position.Heartbeat`): the commit then `advances` to it, as if it were a change.
        `items`: a streamed transaction's (the feed held them)."""
        factory, xid, end_lsn, ts = self.factory, begin.xid, commit.end_lsn, commit.commit_ts_us
        timeline = factory.timelines.of(commit.commit_lsn)
        tx_seq = tx_seq_of(timeline, end_lsn, factory.timelines.era)
        captured_us = time.time_ns() // 1000  # one capture time for the whole transaction
        # what `factory.stamp` sets, for the changes (their own LSN and timeline they hold)
        records = ChangeStamp(factory.source_id, str(xid), Position(
            tx_seq=tx_seq, postgres=PostgresPosition(commit_lsn=end_lsn, xid=xid,
                                                     commit_ts_us=ts)),
            f"{tx_seq:X}", ts, captured_us)

        ids: list[EventIds] = []  # made at the first event, when the size is known

        def stamp(event: ChangeEvent, index: int, size: int) -> ChangeEvent:
            if not ids:
                ids.append(EventIds(factory.source_id, f"{tx_seq:X}", ts // 1000, size))
            return factory.stamp(event, xid=xid, tx_seq=tx_seq, end_lsn=end_lsn,
                                 commit_ts_us=ts, index=index, size=size, ids=ids[0],
                                 captured_us=captured_us)

        position = Position(tx_seq=tx_seq, postgres=PostgresPosition(
            commit_lsn=end_lsn, timeline=timeline, xid=xid, commit_ts_us=ts))
        advances = None
        if heartbeat:
            advances = Position()
            advances.CopyFrom(position)
            advances.postgres.event_lsn = heartbeat
        return Commit(stamp, position, ts, str(xid), advances, records, items)

    def _watermark(self, msg: LogicalMessage) -> Watermark | None:
        """A snapshot watermark; a read transaction placed at it ends one byte after the
        message's LSN: no commit ends there (WAL records start 8-byte aligned), so it sits
        between the transactions before and after the message."""
        parsed = parse_watermark(msg.content)
        if parsed is None or msg.lsn < self.resume_lsn:
            return None
        timeline = self.factory.timelines.of(msg.lsn)
        end = msg.lsn + 1
        tx_seq = tx_seq_of(timeline, end, self.factory.timelines.era)
        position = Position(tx_seq=tx_seq, postgres=PostgresPosition(
            commit_lsn=end, event_lsn=msg.lsn, timeline=timeline))
        return Watermark(parsed[0], parsed[1], position)

    def _seen_at(self, begin: Begin | None, lsn: int) -> Position | None:
        """Where a schema was first seen: just before the transaction that carries it."""
        if begin is None:
            return None
        timeline = self.factory.timelines.of(begin.final_lsn)
        tx_seq = tx_seq_of(timeline, begin.final_lsn, self.factory.timelines.era)
        return Position(tx_seq=tx_seq, postgres=PostgresPosition(
            commit_lsn=begin.final_lsn, event_lsn=lsn, timeline=timeline))
