"""Our position in a PostgreSQL source, and whether the server still has what follows it.

A transaction's position is its commit's end LSN, qualified by the timeline the
commit was written on: `tx_seq = timeline << 48 | end_lsn` (`tx_seq_of`). A
promoted standby continues the LSNs of the timeline it came from, so without
the timeline a transaction of the new primary could get the number of one the
old primary wrote past the switch point (already published, lost in the
failover), and downstream dedup by position would drop the new one. With it,
positions stay totally ordered across failovers, and a transaction re-read
from the shared history (before the switch point) keeps its original number.

The resume position is the minimum checkpoint of the pipeline's sinks
(`Resume`). Capture resumes after it, skips transactions at or below it (the
slot's `confirmed_flush_lsn` can go backwards after a server crash) and never
lets the slot confirm past it.

Before streaming, on every (re)connect (DESIGN guarantee 9):

- the slot exists — unless nothing was ever checkpointed or published, in which
  case it is created;
- its `wal_status` is not `lost` (`max_slot_wal_keep_size` removed WAL it needed);
- its `confirmed_flush_lsn` is not past our checkpoint: a recreated (or
  externally advanced) slot starts later, and the changes in between are gone;
- our checkpoint is not past `pg_current_wal_lsn()` (another server, a restored
  backup);
- on a new timeline (a promoted standby) our checkpoint is not past the point
  where our timeline ended there: what the old primary wrote after it never
  reached this server.

Any of these raises `PositionLostError`, whose message is
`position lost: <reason>. Re-snapshot required.`
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from tailrace.errors import PositionLostError, SourceConfigurationError
from tailrace.proto.control_pb2 import Checkpoint, Epoch
from tailrace_services.capture_postgres.replication import lsn_to_str, str_to_lsn

__all__ = ["Resume", "SlotState", "Timelines", "check_slot", "check_timeline", "lsn_of",
           "read_slot", "tx_seq_of"]

LSN_BITS = 48  # 256 TB of WAL per timeline
LSN_MASK = (1 << LSN_BITS) - 1


def tx_seq_of(timeline: int, lsn: int) -> int:
    """The position number of a transaction whose commit ends at `lsn` on `timeline`."""
    return (timeline << LSN_BITS) | lsn


def lsn_of(tx_seq: int) -> int:
    return tx_seq & LSN_MASK


@dataclass(frozen=True, slots=True)
class Timelines:
    """Which timeline an LSN of this server belongs to (TIMELINE_HISTORY of `current`)."""

    current: int
    history: tuple[tuple[int, int], ...] = ()  # (ancestor timeline, LSN where it ended)

    def of(self, lsn: int) -> int:
        """Timeline of a WAL record starting at `lsn`."""
        for timeline, end in self.history:
            if lsn < end:
                return timeline
        return self.current


@dataclass(frozen=True, slots=True)
class Resume:
    """Where streaming resumes: after `lsn` (0 = from the slot), known to be on `timeline`."""

    lsn: int = 0
    timeline: int = 0
    published: bool = False  # an epoch was recorded: the slot existed and was streamed from

    @classmethod
    def of(cls, checkpoint: Checkpoint | None, latest_epoch: Epoch | None) -> Resume:
        if checkpoint is None:
            return cls(published=latest_epoch is not None)
        position = checkpoint.position
        return cls(lsn_of(position.tx_seq),
                   position.postgres.timeline or position.tx_seq >> LSN_BITS, True)


@dataclass(frozen=True, slots=True)
class SlotState:
    exists: bool
    wal_status: str = ""
    confirmed_flush_lsn: int = 0
    current_wal_lsn: int = 0


def read_slot(conn: psycopg.Connection[Any], slot: str) -> SlotState:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    current = str_to_lsn(row[0]) if row else 0
    found = conn.execute(
        "SELECT coalesce(wal_status, ''), coalesce(confirmed_flush_lsn::text, '')"
        " FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if found is None:
        return SlotState(exists=False, current_wal_lsn=current)
    confirmed = str_to_lsn(found[1]) if found[1] else 0
    return SlotState(True, found[0], confirmed, current)


def check_slot(state: SlotState, slot: str, resume: Resume, can_create: bool) -> None:
    """Raise PositionLostError when the history after `resume` is gone from the server."""
    at = lsn_to_str(resume.lsn)
    if not state.exists:
        if resume.lsn:
            raise PositionLostError(
                f"replication slot {slot!r} does not exist but the sinks have checkpointed up to "
                f"{at}: the slot was dropped (or this server never had it, like a promoted "
                "standby before PostgreSQL 17), and the changes after the checkpoint cannot be "
                "decoded any more")
        if resume.published:
            raise PositionLostError(
                f"replication slot {slot!r} does not exist but changes were already published "
                "from it: the slot was dropped and the changes since are gone")
        if not can_create:
            raise SourceConfigurationError(
                f"spec.source.slot: replication slot {slot!r} does not exist and "
                "spec.source.create_slot is false; create it with SELECT "
                f"pg_create_logical_replication_slot('{slot}', 'pgoutput') or allow creation")
        return
    if state.wal_status == "lost":
        raise PositionLostError(
            f"replication slot {slot!r} has wal_status=lost: the server removed WAL the slot "
            "still needed (max_slot_wal_keep_size)")
    if resume.lsn and state.confirmed_flush_lsn > resume.lsn:
        raise PositionLostError(
            f"replication slot {slot!r} confirmed_flush_lsn "
            f"{lsn_to_str(state.confirmed_flush_lsn)} is past our checkpoint {at}: the slot was "
            "recreated or advanced by someone else, and the changes in between are gone")
    if resume.lsn > state.current_wal_lsn:
        raise PositionLostError(
            f"our checkpoint {at} is past the server's WAL end "
            f"{lsn_to_str(state.current_wal_lsn)}: this is not the server we streamed from, or it "
            "was restored from an older backup")


def check_timeline(history: list[tuple[int, int]], timeline: int, resume: Resume) -> None:
    """On a new timeline, our checkpoint must be at or before where our old timeline ended.

    `history` is TIMELINE_HISTORY of the server's current `timeline`.
    """
    if not resume.lsn or not resume.timeline or resume.timeline == timeline:
        return
    ends = dict(history)
    if resume.timeline not in ends:
        raise PositionLostError(
            f"our checkpoint {lsn_to_str(resume.lsn)} is on timeline {resume.timeline}, which is "
            f"not an ancestor of this server's timeline {timeline}")
    switch = ends[resume.timeline]
    if resume.lsn > switch:
        raise PositionLostError(
            f"our checkpoint {lsn_to_str(resume.lsn)} on timeline {resume.timeline} is past "
            f"{lsn_to_str(switch)}, where that timeline ends on this promoted server: the "
            "sinks have changes this server never received")
