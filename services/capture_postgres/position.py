"""Our position in a PostgreSQL source, and whether the server still has what follows it.

A transaction's position is its commit's end LSN, qualified by the timeline the
commit was written on: `tx_seq = timeline << 48 | end_lsn` (`tx_seq_of`). A
promoted standby continues the LSNs of the timeline it came from, so without
the timeline a transaction of the new primary could get the number of one the
old primary wrote past the switch point (already published, lost in the
failover), and downstream dedup by position would drop the new one. With it,
positions stay totally ordered across failovers, and a transaction re-read
from the shared history (before the switch point) keeps its original number.
A position also names its transaction (`xid`, `commit_ts_us`): an LSN alone is
only a byte offset, which any copy of the cluster reuses for its own WAL.

Above the timeline sits the era (`tx_seq = era << 56 | timeline << 48 | end_lsn`). A
lost position accepted by `tailrace resnapshot` (or `snapshot.mode: when_needed`)
starts a new era on the server as it is now (`identity.py`): its LSNs may be lower than
the ones we published from the lost history, its positions still sort after them, so
the bus, the delivery and the sinks' checkpoints go on unchanged. Checkpoints and
epochs of an earlier era say nothing about this server and are ignored (`Resume.of`,
`SlotFeedback`).

The resume position is the minimum checkpoint of the pipeline's sinks (`Resume`,
PostgreSQL's view of the shared rule's `ResumePoint`, `tailrace_services.capture.resume`).
Capture resumes after it, skips transactions at or below it (the slot's
`confirmed_flush_lsn` can go backwards after a server crash) and never lets the
slot confirm past it (`SlotFeedback`, `confirmable_lsn`). It confirms up to the
checkpoint transaction's last change (`confirm_point`), so that on every reconnect
the server sends that transaction again and `history.py` can check it is still the
same one.

Before streaming, on every (re)connect (DESIGN guarantee 9), in this order so the
reason names the first thing that is wrong (`check_position`):

- on a new timeline (a promoted standby, a point-in-time restore) our checkpoint
  is on an ancestor timeline and not past the point where that timeline ended
  here: what followed it on the old timeline never reached this server;
- the server's WAL is not behind our checkpoint, nor behind the latest
  transaction we published on its timeline (a backup restored from before them,
  another copy of the cluster);
- the slot exists — unless nothing was ever checkpointed or published, in which
  case it is created — and is a logical pgoutput slot of this database;
- its `wal_status` is not `lost` and it has a `restart_lsn` (not invalidated);
- its `confirmed_flush_lsn` is not past our checkpoint (or, with no checkpoint
  yet, past the latest transaction we published): a recreated (or externally
  advanced) slot starts later, and the changes in between are gone; nor is its
  `restart_lsn`, from where it decodes.

Any of these raises `PositionLostError`, whose message is
`position lost: <reason>. Re-snapshot required.`

The slot only moves with the sinks' checkpoints, which move with published transactions.
While the captured tables are idle and other databases of the server write, it would hold
their WAL for ever. With `source.heartbeat_ms`, a `Heartbeat` writes a transactional
logical message into the captured database that often; the stream publishes no event for
it, but an epoch closes at its position (`assembler.Commit.advances`), the checkpoints
follow, and the slot with them — never past an undelivered change: the heartbeat's
position comes after every change before it, and a checkpoint reaches it only once those
are delivered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from tailrace.control_client import ControlClient
from tailrace.errors import (
    FatalError,
    PositionLostError,
    RetryableError,
    SourceConfigurationError,
)
from tailrace.logs import get_logger, redact
from tailrace.proto.control_pb2 import Checkpoint, Epoch
from tailrace.proto.event_pb2 import Position
from tailrace_services.capture.metrics import CaptureMetrics
from tailrace_services.capture_postgres.connection import (
    ReplicationConnection,
    ServerFacts,
    SlotState,
    SystemIdentity,
    connect,
    lsn_to_str,
)
from tailrace_services.capture_postgres.errors import StreamStopped

__all__ = ["HEARTBEAT_PREFIX", "Heartbeat", "Resume", "SlotFeedback", "Timelines", "TxMark",
           "check_numbering", "check_position", "check_slot", "check_timeline", "check_wal_end",
           "confirm_point", "confirmable_lsn", "describe_server", "era_of", "lsn_of", "tx_seq_of"]

log = get_logger(__name__)

FEEDBACK_INTERVAL_S = 1.0

LSN_BITS = 48  # 256 TB of WAL per timeline
LSN_MASK = (1 << LSN_BITS) - 1
TIMELINE_BITS = 8
MAX_TIMELINE = (1 << TIMELINE_BITS) - 1
ERA_SHIFT = LSN_BITS + TIMELINE_BITS
MAX_ERA = 127  # tx_seq stays below 2**63 (a signed 64-bit column holds it)
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def tx_seq_of(timeline: int, lsn: int, era: int = 0) -> int:
    """The position number of a transaction whose commit ends at `lsn` on `timeline`."""
    return (era << ERA_SHIFT) | (timeline << LSN_BITS) | lsn


def lsn_of(tx_seq: int) -> int:
    return tx_seq & LSN_MASK


def era_of(tx_seq: int) -> int:
    return tx_seq >> ERA_SHIFT


def timeline_of(position: Position) -> int:
    return position.postgres.timeline or (position.tx_seq >> LSN_BITS) & MAX_TIMELINE


def check_numbering(timeline: int, era: int) -> None:
    """Positions of `timeline` in `era` fit in tx_seq's bits, or capture cannot number them."""
    if timeline > MAX_TIMELINE:
        raise FatalError(f"the server is on timeline {timeline}; capture numbers positions of "
                         f"timelines up to {MAX_TIMELINE} only")
    if era > MAX_ERA:
        raise FatalError(f"this source had {era} accepted resnapshots; positions number at "
                         f"most {MAX_ERA}: start a new pipeline (new source id)")


def confirm_point(position: Position) -> int:
    """How far the slot may be confirmed for a checkpoint at `position`: up to its
    transaction's last change, so that the server sends that transaction again."""
    end, last_change = lsn_of(position.tx_seq), position.postgres.event_lsn
    return last_change if 0 < last_change < end else end


@dataclass(frozen=True, slots=True)
class Timelines:
    """Which timeline an LSN of this server belongs to (TIMELINE_HISTORY of `current`)."""

    current: int
    history: tuple[tuple[int, int], ...] = ()  # (ancestor timeline, LSN where it ended)
    era: int = 0  # of the positions numbered on this server (module docstring)

    def of(self, lsn: int) -> int:
        """Timeline of a WAL record starting at `lsn`."""
        for timeline, end in self.history:
            if lsn < end:
                return timeline
        return self.current


@dataclass(frozen=True, slots=True)
class TxMark:
    """A transaction we published, as a server holding our history must show it again."""

    end_lsn: int
    xid: int
    commit_ts_us: int
    timeline: int
    last_change_lsn: int

    @classmethod
    def of(cls, position: Position) -> TxMark | None:
        """None for positions written before transactions were named (no commit time)."""
        postgres = position.postgres
        if not postgres.commit_ts_us:
            return None
        return cls(lsn_of(position.tx_seq), postgres.xid, postgres.commit_ts_us,
                   timeline_of(position), postgres.event_lsn)

    def describe(self) -> str:
        return (f"xid {self.xid} committed at {commit_time(self.commit_ts_us)}, ending at "
                f"{lsn_to_str(self.end_lsn)} on timeline {self.timeline}")


def commit_time(ts_us: int) -> str:
    return (_UNIX_EPOCH + timedelta(microseconds=ts_us)).isoformat(timespec="microseconds")


@dataclass(frozen=True, slots=True)
class Resume:
    """Where streaming resumes: after `lsn` (0 = from the slot), known to be on `timeline`.

    `published_lsn` is the end of the latest transaction we published (the latest
    recorded epoch), which may be past the checkpoint; `checkpoint` and `latest` name
    those two transactions when their positions carry a commit time.
    """

    lsn: int = 0
    timeline: int = 0
    published: bool = False  # an epoch was recorded: the slot existed and was streamed from
    published_lsn: int = 0
    published_timeline: int = 0
    checkpoint: TxMark | None = None
    latest: TxMark | None = None
    confirm_lsn: int = 0  # `confirm_point` of the checkpoint

    @classmethod
    def of(cls, checkpoint: Checkpoint | None, latest_epoch: Epoch | None, era: int = 0
           ) -> Resume:
        """From the sinks' checkpoint and the latest epoch, when they are of `era` (earlier
        ones are the lost history an accepted resnapshot left behind: not on this server)."""
        if checkpoint is not None and era_of(checkpoint.position.tx_seq) < era:
            checkpoint = None
        if latest_epoch is not None and era_of(latest_epoch.position.tx_seq) < era:
            latest_epoch = None
        resume = cls()
        if checkpoint is not None:
            position = checkpoint.position
            resume = cls(lsn_of(position.tx_seq), timeline_of(position), True,
                         checkpoint=TxMark.of(position), confirm_lsn=confirm_point(position))
        if latest_epoch is None:
            return resume
        position = latest_epoch.position
        return replace(resume, published=True, published_lsn=lsn_of(position.tx_seq),
                       published_timeline=timeline_of(position), latest=TxMark.of(position))

    @property
    def has_position(self) -> bool:
        """Something was checkpointed or published: the slot's history matters."""
        return bool(self.lsn) or self.published

    def describe(self) -> str:
        if self.lsn:
            return f"our checkpoint {lsn_to_str(self.lsn)} on timeline {self.timeline}"
        return (f"the latest transaction we published, ending at "
                f"{lsn_to_str(self.published_lsn)} on timeline {self.published_timeline} "
                "(no sink has checkpointed yet)")


def describe_server(system: SystemIdentity) -> str:
    return f"the server (system_identifier {system.system_id}, timeline {system.timeline})"


def check_position(facts: ServerFacts, system: SystemIdentity, slot: str, resume: Resume,
                   can_create: bool) -> None:
    """Raise PositionLostError when this server cannot continue `resume` (module docstring)."""
    check_timeline(list(facts.history), system, resume)
    check_wal_end(facts.slot.current_wal_lsn, system, resume)
    check_slot(facts.slot, slot, resume, can_create, system.dbname)


def check_timeline(history: list[tuple[int, int]], system: SystemIdentity, resume: Resume
                   ) -> None:
    """On a new timeline, our checkpoint must be at or before where our old timeline ended.

    `history` is TIMELINE_HISTORY of the server's current timeline.
    """
    if not resume.lsn or not resume.timeline or resume.timeline == system.timeline:
        return
    at = lsn_to_str(resume.lsn)
    ends = dict(history)
    if resume.timeline not in ends:
        ancestors = ", ".join(f"{t} (ended at {lsn_to_str(end)})" for t, end in history)
        raise PositionLostError(
            f"our checkpoint {at} is on timeline {resume.timeline}, which is not in the "
            f"history of {describe_server(system)}: its ancestors are "
            f"{ancestors or 'none'}; it never had our changes (a backup restored from before "
            "a failover, or a standby that followed another primary)")
    switch = ends[resume.timeline]
    if resume.lsn > switch:
        raise PositionLostError(
            f"{describe_server(system)} left timeline {resume.timeline} at "
            f"{lsn_to_str(switch)}, before our checkpoint {at} on that timeline: the sinks "
            "have changes this server never received (a standby promoted before it caught "
            "up, or a backup restored to an earlier point in time)")


def check_wal_end(wal_end: int, system: SystemIdentity, resume: Resume) -> None:
    """The server's WAL must reach our checkpoint, and the latest transaction we published
    when it is on the server's timeline (past a switch point it is a failover's loss)."""
    server, end = describe_server(system), lsn_to_str(wal_end)
    if resume.lsn > wal_end:
        raise PositionLostError(
            f"{server} has written WAL only up to {end}, but our checkpoint is "
            f"{lsn_to_str(resume.lsn)} on timeline {resume.timeline}: it is not the server we "
            "streamed from (a backup restored from before the checkpoint, or another copy of "
            "this cluster)")
    if resume.published_lsn > wal_end and resume.published_timeline == system.timeline:
        raise PositionLostError(
            f"{server} has written WAL only up to {end}, but we already published a "
            f"transaction ending at {lsn_to_str(resume.published_lsn)} on timeline "
            f"{resume.published_timeline}: the server lost transactions we published (a "
            "backup restored from before them, or another copy of this cluster)")


def check_slot(state: SlotState, slot: str, resume: Resume, can_create: bool,
               database: str = "") -> None:
    """Raise PositionLostError when the history after `resume` is gone from the slot."""
    if not state.exists:
        if resume.has_position:
            raise PositionLostError(
                f"replication slot {slot!r} does not exist, but {resume.describe()} was read "
                "from it: the slot was dropped (or this server never had it: a promoted "
                "standby before PostgreSQL 17, a restored backup, another server), and the "
                "changes after it cannot be decoded any more")
        if not can_create:
            raise SourceConfigurationError(
                f"spec.source.slot: replication slot {slot!r} does not exist and "
                "spec.source.create_slot is false; create it with SELECT "
                f"pg_create_logical_replication_slot('{slot}', 'pgoutput') or allow creation")
        return
    _check_slot_kind(state, slot, resume, database)
    if state.wal_status == "lost" or not state.restart_lsn:
        invalid = (f"replication slot {slot!r} has wal_status={state.wal_status or 'NULL'} and "
                   f"restart_lsn={lsn_to_str(state.restart_lsn) if state.restart_lsn else 'NULL'}"
                   ": the server invalidated it and removed WAL it still needed "
                   "(max_slot_wal_keep_size)")
        if not resume.has_position:
            raise SourceConfigurationError(
                f"spec.source.slot: {invalid}; nothing was read from it yet: drop it with "
                f"SELECT pg_drop_replication_slot('{slot}') and start again")
        raise PositionLostError(f"{invalid}, so {resume.describe()} cannot be continued")
    if not resume.has_position:
        return
    reference = resume.lsn or resume.published_lsn
    confirmed = lsn_to_str(state.confirmed_flush_lsn)
    if state.confirmed_flush_lsn > reference:
        raise PositionLostError(
            f"replication slot {slot!r} confirmed_flush_lsn {confirmed} is past "
            f"{resume.describe()}: the slot was recreated or advanced by someone else, and "
            "the changes in between are gone")
    if resume.lsn and state.restart_lsn > resume.lsn:
        raise PositionLostError(
            f"replication slot {slot!r} restart_lsn {lsn_to_str(state.restart_lsn)} is past "
            f"{resume.describe()} (confirmed_flush_lsn {confirmed}): the slot was moved by "
            "someone else and no longer decodes the changes after the checkpoint")


def _check_slot_kind(state: SlotState, slot: str, resume: Resume, database: str) -> None:
    wrong = []
    if state.slot_type != "logical":
        wrong.append(f"slot_type {state.slot_type!r}")
    if state.plugin != "pgoutput":
        wrong.append(f"plugin {state.plugin!r}")
    if database and state.database != database:
        wrong.append(f"database {state.database!r}")
    if not wrong:
        return
    what = f"replication slot {slot!r} has " + ", ".join(wrong)
    if resume.has_position:
        raise PositionLostError(
            f"{what}: it is not the logical pgoutput slot of database {database!r} that "
            f"{resume.describe()} was read from")
    raise SourceConfigurationError(
        f"spec.source.slot: {what}, but capture needs a logical pgoutput slot of database "
        f"{database!r}: drop it, or set spec.source.slot to another name")


# -- confirming the slot --------------------------------------------------------------------

def confirmable_lsn(current: int, checkpoint: int, published: int, server_wal_end: int) -> int:
    """How far the slot may be confirmed: the sinks' `checkpoint`, but never past what this
    capture `published` (or resumed from), and never backwards from `current`.

    A checkpoint past the server's WAL end names changes the server never wrote: the
    server is not the one the checkpoint came from, or the checkpoint was forged. Raises
    PositionLostError rather than confirm anything.
    """
    if server_wal_end and checkpoint > server_wal_end:
        raise PositionLostError(
            f"the sinks' checkpoint {lsn_to_str(checkpoint)} is past the server's WAL end "
            f"{lsn_to_str(server_wal_end)}: the server is behind our checkpoint (restored from "
            "a backup, or another server), or the checkpoint was not written by Tailrace")
    return max(current, min(checkpoint, published))


class SlotFeedback:
    """The standby status updates of one session: `write` is what was received, `flush` the
    minimum position every sink has checkpointed, re-read from the control service about
    every second — up to that transaction's last change (`confirm_point`), so the slot keeps
    every change not yet delivered everywhere and sends the checkpoint's transaction again
    on reconnect. `flush` never passes what this capture published (or resumed from).

    `keep_alive` also runs while the publisher waits for a slow bus: the reader stops reading
    (backpressure) but the server does not time the connection out. It raises
    StreamStopped when `abandon()` says a stop request should not wait longer for the bus
    (nothing is lost: the next start publishes again from the checkpoint).
    """

    def __init__(self, repl: ReplicationConnection, control: ControlClient, source_id: str,
                 sink_ids: list[str], metrics: CaptureMetrics, *, resume_lsn: int,
                 confirmed_lsn: int, era: int = 0, abandon: Callable[[], bool] = lambda: False,
                 slot: str = "") -> None:
        self.repl = repl
        self.slot = slot
        self.control = control
        self.source_id = source_id
        self.sink_ids = sink_ids
        self.metrics = metrics
        self.received = 0
        self.published = resume_lsn  # the end LSN of the last transaction on the bus
        self.confirmed = confirmed_lsn
        self.era = era
        self._abandon = abandon
        self._next = 0.0

    def keep_alive(self) -> None:
        """Send a status update when one is due."""
        if self._abandon():
            raise StreamStopped
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + FEEDBACK_INTERVAL_S
        self.confirmed = self._confirmable(self.confirmed)
        self.repl.send_status(max(self.received, self.confirmed), self.confirmed)
        wal_end = self.repl.server_wal_end
        self.metrics.lag_bytes.set(max(wal_end - self.received, 0))
        self.metrics.retained_bytes.set(max(wal_end - self.confirmed, 0))

    def retained(self) -> tuple[int, str] | None:
        """The WAL the server keeps for the slot: from the position it confirmed to the
        server's WAL end (`retained.RetainedLog`); None before the server said where it ends."""
        wal_end = self.repl.server_wal_end
        if not wal_end:
            return None
        return max(wal_end - self.confirmed, 0), f"slot {self.slot}"

    def _confirmable(self, current: int) -> int:
        """The LSN every sink has checkpointed; never moves backwards within a session."""
        try:
            checkpoint = self.control.minimum_checkpoint(self.source_id, self.sink_ids)
        except RetryableError as e:
            log.warning("cannot read checkpoints; the slot is not advanced", error=str(e))
            return current
        if checkpoint is None or era_of(checkpoint.position.tx_seq) < self.era:
            return current  # (a sink still delivering the lost history: nothing of this server)
        target = lsn_of(checkpoint.position.tx_seq)
        if target > self.published:
            log.debug("a sink checkpoint is ahead of what this capture published; the slot "
                      "is confirmed only up to what was published",
                      checkpoint=lsn_to_str(target), published=lsn_to_str(self.published))
        return confirmable_lsn(current, confirm_point(checkpoint.position), self.published,
                               self.repl.server_wal_end)


HEARTBEAT_PREFIX = "tailrace.heartbeat"
HEARTBEAT_TIMEOUT_S = 5


class Heartbeat:
    """Writes a transactional logical message (`HEARTBEAT_PREFIX`) into the captured
    database every `interval_s` (module docstring); 0 writes none. Called before every read
    of the stream (`poll`): cheap until one is due. A failure is logged and tried again at
    the next one; streaming never waits longer than HEARTBEAT_TIMEOUT_S for it."""

    def __init__(self, dsn: str, interval_s: float) -> None:
        self.dsn = dsn
        self.interval_s = interval_s
        self._conn: psycopg.Connection[Any] | None = None
        self._next = time.monotonic()
        self.written = 0

    def poll(self) -> None:
        if not self.interval_s:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval_s
        try:
            if self._conn is None:
                self._conn = connect(self.dsn, timeout=HEARTBEAT_TIMEOUT_S)
                self._conn.execute(f"SET statement_timeout = {HEARTBEAT_TIMEOUT_S * 1000}")
            self._conn.execute("SELECT pg_logical_emit_message(true, %s, '')",
                               (HEARTBEAT_PREFIX,))
            self.written += 1
        except psycopg.Error as e:
            log.warning("heartbeat not written; trying again at the next one",
                        error=redact(str(e)), retry_in_s=self.interval_s)
            self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
