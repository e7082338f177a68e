"""The checkpointed position of a MySQL/MariaDB source, and its mapping to the bus `Position`.

What a position holds, after one source transaction:

- `gtid_set`: the GTID state of *all* domains (MariaDB) or the whole executed
  set (MySQL) once this transaction is applied — what a reconnect asks for;
- `gtid`: this transaction's own GTID (the event ids are made from it);
- `file`, `offset`: the binlog file and the end offset of the transaction in
  it, `file_created_unix` the file's creation time (its Format_description
  event) and `server_id` the server read from — together they tell, on the
  same server, whether the file we read is still the file we read (RESET
  MASTER recreates `mysql-bin.000001` with a new time);
- `identity`: the server identity fingerprint at the time (see identity.py);
- `prev_gtid`, `tx_digest` (MariaDB): the GTID before this transaction in its
  domain and a digest of the transaction's binlog contents (reader.py). They
  let a reconnect read this very transaction again on whatever server answers
  and tell whether it is ours or another one under the same GTID;
- `tx_seq`: our own monotone transaction number. It is restored from the
  checkpoint on resume and counted up transaction by transaction from
  there, so a transaction that is re-read gets the same number again; it
  keeps positions totally ordered across binlog rotation and failover.

Where a session starts is the shared resume rule's (`tailrace_services.capture.resume`):
the furthest of the sinks' minimum checkpoint and what the bus already holds
(`resume_from`); with neither, the server's oldest binlog — or, when the pipeline starts
with an initial snapshot (`snapshot.mode` initial/initial_only) and no table's snapshot
has got anywhere yet (`service.MysqlCapture._snapshot_covers_the_past`), the server's
current GTID position: the snapshot reads the rows that are there, so replaying the
binlog's history before it would only publish them again.

After a lost position, a server accepted as it is now (`identity.ServerCheck._accept`:
an operator's `tailrace resnapshot`, or `snapshot.mode: when_needed`) starts a new
history: streaming starts at the server's current GTID state (`Accepted.gtid_set`), and
numbering continues after `Accepted.tx_seq`, the highest tx_seq anything downstream may
hold (`ResumeRule.highest_published`: checkpoints, epochs, and every event on the bus after
the latest epoch, a transaction cut short included). The stored identity keeps both
(`identity.py`). Positions at or below `Accepted.tx_seq` belong to the lost history: a
sinks' checkpoint there is not checked against the server (`resume_from` sets it aside),
and a session with nothing of the new history on the bus or checkpointed starts at
`Accepted.gtid_set` again.

No era is needed, unlike PostgreSQL (whose tx_seq is derived from the LSN, and a new
server's LSNs may be lower than ours): tx_seq here is our own counter, never derived from
the server's coordinates. Every session continues it from a position we published or
checkpointed (or from the accept's `tx_seq`), so a replaced server, one whose GTIDs reuse
our numbers, or one whose binlogs were purged, gets numbers above everything already
published, and a delivery's forward-only dedup keeps its transactions.

A snapshot's read transaction takes the position of its high watermark, a transaction of
its own in the binlog (`events.py`): it counts in tx_seq like any other, and the
checkpoint after it is the GTID state after the watermark.

Continuity (MariaDB), decided by `loss_reason` from facts read on connect:
the server must not be behind the checkpoint, must still hold everything
after it, and must hold the checkpoint's own transaction with the same
digest. When that transaction is no longer in its binlog (purged), only the
same server (identity.py: server_id, GTID domains, data directory) is
trusted. GTID numbers alone never prove shared history: MariaDB reuses
`server_id` 1 and domain 0 on every fresh server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from tailrace.errors import PositionLostError
from tailrace.events import Position
from tailrace.logs import get_logger
from tailrace.proto.event_pb2 import MysqlPosition
from tailrace_services.capture.resume import ResumePoint
from tailrace_services.capture_mysql.connection import ServerFacts
from tailrace_services.capture_mysql.gtid import (
    Flavor,
    MariadbGtid,
    MariadbGtidPosition,
    MysqlGtidSet,
    parse_state,
)

__all__ = ["Accepted", "CapturePosition", "CheckpointProof", "accepts", "check_reachable",
           "loss_reason", "resume_from"]

log = get_logger(__name__)

@dataclass(frozen=True, slots=True)
class CapturePosition:
    flavor: Flavor
    gtid_set: str = ""
    gtid: str = ""
    file: str = ""
    offset: int = 0
    file_created_unix: int = 0
    server_id: int = 0
    identity: str = ""
    prev_gtid: str = ""
    tx_digest: int = 0
    tx_seq: int = 0

    def state(self) -> MysqlGtidSet | MariadbGtidPosition:
        """The parsed GTID state; ValueError names the text when it is not of this flavour."""
        return parse_state(self.gtid_set, self.flavor)

    def before(self) -> MariadbGtidPosition:
        """MariaDB: the state just before this transaction, to read it again from there."""
        domain = MariadbGtid.parse(self.gtid).domain
        prev = [MariadbGtid.parse(self.prev_gtid)] if self.prev_gtid else []
        return MariadbGtidPosition(
            [g for g in MariadbGtidPosition.parse(self.gtid_set) if g.domain != domain] + prev)

    def after(self, *, gtid: str, gtid_set: str, file: str, offset: int,
              file_created_unix: int, server_id: int, identity: str, prev_gtid: str = "",
              tx_digest: int = 0) -> CapturePosition:
        """The position after the next transaction: tx_seq counts up by one."""
        return replace(self, gtid=gtid, gtid_set=gtid_set, file=file, offset=offset,
                       file_created_unix=file_created_unix, server_id=server_id,
                       identity=identity, prev_gtid=prev_gtid, tx_digest=tx_digest,
                       tx_seq=self.tx_seq + 1)

    def to_proto(self, event_index: int = 0) -> Position:
        native = MysqlPosition(gtid_set=self.gtid_set, gtid=self.gtid, file=self.file,
                               offset=self.offset, server_id=self.server_id,
                               file_created_unix=self.file_created_unix,
                               identity=self.identity, prev_gtid=self.prev_gtid,
                               tx_digest=self.tx_digest)
        return Position(tx_seq=self.tx_seq, event_index=event_index, mysql=native)

    @classmethod
    def from_proto(cls, position: Position, flavor: Flavor) -> CapturePosition:
        """A checkpoint's position; ValueError when it is not a MySQL position of this flavour."""
        if position.WhichOneof("native") != "mysql":
            raise ValueError(f"the checkpoint holds a {position.WhichOneof('native')} position, "
                             "not a MySQL/MariaDB one: was the source's id reused?")
        m = position.mysql
        result = cls(flavor=flavor, gtid_set=m.gtid_set, gtid=m.gtid, file=m.file,
                     offset=m.offset, file_created_unix=m.file_created_unix,
                     server_id=m.server_id, identity=m.identity, prev_gtid=m.prev_gtid,
                     tx_digest=m.tx_digest, tx_seq=position.tx_seq)
        result.state()  # validate the GTID text now, with the flavour named in the error
        return result

    def describe(self) -> str:
        where = f" ({self.file}:{self.offset})" if self.file else ""
        return f"{self.gtid_set or 'the start'}{where}, tx_seq {self.tx_seq}"


# -- where a session starts ----------------------------------------------------------------

def accepts(flavor: Flavor) -> Callable[[Position], bool]:
    """The resume rule's hook: a published position (the bus tail) is used only when it is a
    position of this flavour; otherwise the checkpoint decides."""

    def accept(position: Position) -> bool:
        try:
            CapturePosition.from_proto(position, flavor)
        except ValueError as e:
            log.warning("the bus tail holds an unusable position", error=str(e))
            return False
        return True

    return accept


@dataclass(frozen=True, slots=True)
class Accepted:
    """Where the history of a server accepted as it is now starts (module docstring): its
    GTID state then, and the highest tx_seq published before it."""

    tx_seq: int
    gtid_set: str


def resume_from(point: ResumePoint, facts: ServerFacts, *, from_now: bool = False,
                accepted: Accepted | None = None
                ) -> tuple[CapturePosition | None, CapturePosition]:
    """(the sinks' checkpoint, where streaming starts): the rule's start, or with none yet
    the server's oldest binlog (`from_now`: its current position). A checkpoint of another
    flavour is a lost position. After an accept, positions at or below `accepted.tx_seq`
    are of the lost history: set aside, and with nothing after them the accepted state is
    the start."""
    if accepted is not None:
        after = accepted.tx_seq
        cp = point.checkpoint
        point = replace(point, checkpoint=cp if cp and cp.position.tx_seq > after else None,
                        published=point.published if point.published and
                        point.published.tx_seq > after else None)
    checkpoint = None
    cp = point.checkpoint
    if cp is not None and cp.position.HasField("mysql"):
        try:
            checkpoint = CapturePosition.from_proto(cp.position, facts.flavor)
        except ValueError as e:
            raise PositionLostError(f"the sinks' checkpoint cannot be used with this "
                                    f"{facts.flavor} server: {e}") from None
    start = point.start
    if start is not None and start.HasField("mysql"):
        if checkpoint is not None and start.tx_seq <= checkpoint.tx_seq:
            return checkpoint, checkpoint
        return checkpoint, CapturePosition.from_proto(start, facts.flavor)
    if checkpoint is not None:
        return checkpoint, checkpoint
    if accepted is not None:
        return None, CapturePosition(facts.flavor, gtid_set=accepted.gtid_set,
                                     tx_seq=accepted.tx_seq)
    if from_now:
        now = facts.gtid_binlog_pos if facts.flavor == "mariadb" else facts.gtid_executed
        return None, CapturePosition(facts.flavor, gtid_set=str(now))
    if facts.flavor == "mariadb":
        first = facts.first_binlog
        state = first.gtid_list if first and first.gtid_list else MariadbGtidPosition()
        return None, CapturePosition("mariadb", gtid_set=str(state))
    return None, CapturePosition("mysql", gtid_set=str(facts.gtid_purged))


# -- is the history after a position still on the server? -----------------------------

@dataclass(frozen=True, slots=True)
class CheckpointProof:
    """What this server holds where our checkpoint's transaction should be (MariaDB).

    `gtid`/`digest`: the transaction found after the checkpoint's `before()` state in its
    domain; `gtid` None when none could be read, `why` then says why (purged, binlog end).
    """

    gtid: str | None
    digest: int = 0
    why: str = ""


@dataclass(frozen=True, slots=True)
class Sameness:
    """Whether this server is the one the checkpoint was read from, with the facts shown."""

    same: bool | None  # None: no identity was stored to compare with
    who: str  # e.g. "a different server (server_id 1 -> 7)"


def loss_reason(cp: CapturePosition, facts: ServerFacts, proof: CheckpointProof | None = None,
                sameness: Sameness | None = None) -> str | None:
    """Why the history after `cp` is gone from this server, or None when it is all there."""
    if facts.flavor == "mysql":
        return _mysql_loss(cp, facts)
    return _mariadb_loss(cp, facts, proof, sameness or Sameness(None, "a server we cannot tell"))


def check_reachable(cp: CapturePosition, facts: ServerFacts,
                    proof: CheckpointProof | None = None, sameness: Sameness | None = None
                    ) -> None:
    reason = loss_reason(cp, facts, proof, sameness)
    if reason is not None:
        raise PositionLostError(reason)


def _mysql_loss(cp: CapturePosition, facts: ServerFacts) -> str | None:
    """`GTID_SUBSET(checkpoint, @@gtid_executed)` and `GTID_SUBSET(@@gtid_purged, checkpoint)`."""
    ours = MysqlGtidSet.parse(cp.gtid_set)
    if ours.is_empty():
        missing = facts.gtid_purged
        if not missing.is_empty():
            return (f"the server purged {missing} from its binlog and we have read nothing yet "
                    "(empty checkpoint)")
        return None
    if not ours.issubset(facts.gtid_executed):
        return (f"the server's gtid_executed {facts.gtid_executed or 'is empty and'} lacks "
                f"{ours.difference(facts.gtid_executed)} of our checkpoint {ours}: the server is "
                "behind our checkpoint, or is not the server our checkpoint came from")
    if not facts.gtid_purged.issubset(ours):
        return (f"transactions {facts.gtid_purged.difference(ours)} that follow our checkpoint "
                f"{ours} were purged from the server's binlog (gtid_purged "
                f"{facts.gtid_purged})")
    return None


def _mariadb_loss(cp: CapturePosition, facts: ServerFacts, proof: CheckpointProof | None,
                  sameness: Sameness) -> str | None:
    ours = MariadbGtidPosition.parse(cp.gtid_set)
    if ours.is_empty():
        return None
    server_pos = str(facts.gtid_binlog_pos) or "nothing (an empty binlog)"
    where = f" ({cp.file}:{cp.offset})" if cp.file else ""
    behind = ours.ahead_of(facts.gtid_binlog_pos)
    if behind:
        ahead, theirs = behind[0]
        cause = {True: "this server's binlog was reset (RESET MASTER) or the server was "
                       "restored from an older backup",
                 False: f"this is {sameness.who}; a replica that has not caught up, or "
                        "another server altogether",
                 None: "a lagging replica, a restored backup, a different server or "
                       "RESET MASTER"}[sameness.same]
        return (f"the server's binlog ends at {server_pos} but our checkpoint is at {ours}"
                f"{where} (domain {ahead.domain}: {theirs or 'none'} < {ahead}): the server is "
                f"behind our checkpoint; {cause}")
    for g in ours:
        if not facts.gtid_binlog_state.has_seen(g):
            return (f"the server's binlog history never contained GTID {g} of our checkpoint "
                    f"(gtid_binlog_state {facts.gtid_binlog_state}): it is a different server, "
                    "not one that replicated from ours")
    header = facts.first_binlog
    if header is not None and header.gtid_list is not None:
        for before in header.gtid_list:
            mine = ours.get(before.domain)
            if mine is None or mine.seq < before.seq:
                purged = (f"the oldest binlog {header.file} starts after {before} (its "
                          f"Gtid_list is {header.gtid_list})")
                if sameness.same is False:
                    return (f"cannot prove that this server's history contains our "
                            f"checkpoint's transaction {cp.gtid}{where}: its binlogs were "
                            f"purged past it ({purged}), and this is {sameness.who}")
                return f"binlogs were purged past our checkpoint {ours}{where}: {purged}"
    return _mariadb_transaction_loss(cp, proof, sameness, where)


def _mariadb_transaction_loss(cp: CapturePosition, proof: CheckpointProof | None,
                              sameness: Sameness, where: str) -> str | None:
    """Is the checkpoint's own transaction on this server the one we read?"""
    if proof is None or not cp.tx_digest or not cp.gtid:
        unproven = "our checkpoint carries no transaction digest (written by an older Tailrace)"
    elif proof.gtid is None:
        unproven = f"its binlog no longer holds it ({proof.why})"
    elif proof.gtid != cp.gtid or proof.digest != cp.tx_digest:
        found = (f"its transaction {proof.gtid} has other contents than ours" if
                 proof.gtid == cp.gtid else
                 f"after {cp.prev_gtid or 'the start'} it holds {proof.gtid}, not {cp.gtid}")
        cause = {True: "this server's binlog was rewritten (RESET MASTER, then new writes "
                       "that reuse the GTID numbers)",
                 False: f"this is {sameness.who} whose GTID numbers merely match ours",
                 None: "a different server reusing our GTID numbers, or RESET MASTER"}
        return (f"this server's history does not contain our checkpoint's transaction "
                f"{cp.gtid}{where}: {found}; {cause[sameness.same]}")
    else:
        return None  # the same transaction: continuity proven, on any server
    if sameness.same:
        return None  # the same server: the purge checks above are enough
    return (f"cannot prove that this server's history contains our checkpoint's transaction "
            f"{cp.gtid}{where}: {unproven}, and this is {sameness.who}")
