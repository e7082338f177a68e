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
- `identity`: the server identity fingerprint at the time (see connection.py);
- `tx_seq`: our own monotone transaction number. It is restored from the
  checkpoint on resume and counted up transaction by transaction from
  there, so a transaction that is re-read gets the same number again; it
  keeps positions totally ordered across binlog rotation and failover.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tailrace.errors import PositionLostError
from tailrace.events import Position
from tailrace.proto.event_pb2 import MysqlPosition
from tailrace_services.capture_mysql.gtid import (
    Flavor,
    MariadbGtidPosition,
    MysqlGtidSet,
    parse_state,
)

if TYPE_CHECKING:
    from tailrace_services.capture_mysql.connection import ServerFacts

__all__ = ["CapturePosition", "CheckpointFile", "check_reachable", "identity_in_proto",
           "loss_reason"]

# MysqlPosition has no identity field yet (see the report of issue 5): set it
# only when the generated code has it, so this keeps working before and after.
_HAS_IDENTITY = "identity" in MysqlPosition.DESCRIPTOR.fields_by_name


def identity_in_proto() -> bool:
    return _HAS_IDENTITY


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
    tx_seq: int = 0

    def state(self) -> MysqlGtidSet | MariadbGtidPosition:
        """The parsed GTID state; ValueError names the text when it is not of this flavour."""
        return parse_state(self.gtid_set, self.flavor)

    def after(self, *, gtid: str, gtid_set: str, file: str, offset: int,
              file_created_unix: int, server_id: int, identity: str) -> CapturePosition:
        """The position after the next transaction: tx_seq counts up by one."""
        return replace(self, gtid=gtid, gtid_set=gtid_set, file=file, offset=offset,
                       file_created_unix=file_created_unix, server_id=server_id,
                       identity=identity, tx_seq=self.tx_seq + 1)

    def to_proto(self, event_index: int = 0) -> Position:
        native = MysqlPosition(gtid_set=self.gtid_set, gtid=self.gtid, file=self.file,
                               offset=self.offset, server_id=self.server_id,
                               file_created_unix=self.file_created_unix)
        if _HAS_IDENTITY:
            native.identity = self.identity  # type: ignore[attr-defined]
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
                     server_id=m.server_id,
                     identity=getattr(m, "identity", "") if _HAS_IDENTITY else "",
                     tx_seq=position.tx_seq)
        result.state()  # validate the GTID text now, with the flavour named in the error
        return result

    def describe(self) -> str:
        where = f" ({self.file}:{self.offset})" if self.file else ""
        return f"{self.gtid_set or 'the start'}{where}, tx_seq {self.tx_seq}"


# -- is the history after a position still on the server? -----------------------------

@dataclass(frozen=True, slots=True)
class CheckpointFile:
    """What the server (the same one we read from) says about the checkpoint's binlog file."""

    exists: bool
    created_unix: int = 0
    gtid_pos: MariadbGtidPosition | None = None  # BINLOG_GTID_POS(file, offset)


def loss_reason(cp: CapturePosition, facts: ServerFacts, cp_file: CheckpointFile | None = None
                ) -> str | None:
    """Why the history after `cp` is gone from this server, or None when it is all there."""
    if facts.flavor == "mysql":
        return _mysql_loss(cp, facts)
    return _mariadb_loss(cp, facts, cp_file)


def check_reachable(cp: CapturePosition, facts: ServerFacts,
                    cp_file: CheckpointFile | None = None) -> None:
    reason = loss_reason(cp, facts, cp_file)
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


def _mariadb_loss(cp: CapturePosition, facts: ServerFacts, cp_file: CheckpointFile | None
                  ) -> str | None:
    ours = MariadbGtidPosition.parse(cp.gtid_set)
    if ours.is_empty():
        return None
    server_pos = facts.gtid_binlog_pos
    behind = ours.ahead_of(server_pos)
    if behind:
        ahead, theirs = behind[0]
        return (f"the server's binlog ends at {server_pos or 'nothing'} but our checkpoint is at "
                f"{ours} (domain {ahead.domain}: {theirs or 'none'} < {ahead}): the server is "
                "behind our checkpoint (a lagging replica, a restored backup, or RESET MASTER)")
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
                return (f"binlogs were purged past our checkpoint {ours}: the oldest binlog "
                        f"{header.file} starts after {before} (its Gtid_list is "
                        f"{header.gtid_list})")
    same_server = cp.file and cp.server_id == facts.server_id
    if not same_server or cp_file is None:
        return None
    if not cp_file.exists:
        if facts.binlogs and cp.file > facts.newest_binlog:
            return (f"binlog {cp.file} of our checkpoint is gone and the newest binlog is "
                    f"{facts.newest_binlog}: the binlog history was reset (RESET MASTER)")
        return None  # purged; the Gtid_list check above decided whether that lost anything
    if cp.file_created_unix and cp_file.created_unix and \
            cp.file_created_unix != cp_file.created_unix:
        return (f"binlog {cp.file} was created at {cp_file.created_unix}, but the one our "
                f"checkpoint was read from was created at {cp.file_created_unix}: the binlog "
                "history was reset (RESET MASTER)")
    at = cp_file.gtid_pos
    if at is None or any(at.get(g.domain) != g for g in ours):
        found = at or "none (not a transaction boundary)"
        return (f"the GTID position at {cp.file}:{cp.offset} is {found}, not our checkpoint's "
                f"{ours}: the binlog history was rewritten (RESET MASTER)")
    return None
