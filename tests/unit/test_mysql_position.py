"""The checkpointed MySQL/MariaDB position and the reachability decisions made from server facts."""

from __future__ import annotations

import pytest

from tailrace.errors import PositionLostError
from tailrace.proto.control_pb2 import Checkpoint, ServerIdentity
from tailrace_services.capture.resume import ResumePoint
from tailrace_services.capture_mysql.connection import ServerFacts
from tailrace_services.capture_mysql.gtid import (
    MariadbBinlogState,
    MariadbGtidPosition,
    MysqlGtidSet,
)
from tailrace_services.capture_mysql.identity import (
    accepted_of,
    describe_change,
    identity_fingerprint,
)
from tailrace_services.capture_mysql.position import (
    Accepted,
    CapturePosition,
    CheckpointProof,
    Sameness,
    check_reachable,
    loss_reason,
    resume_from,
)
from tailrace_services.capture_mysql.reader import BinlogHeader

U1 = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
U2 = "19d69c1e-ae97-4b8c-a1ef-9e12ba966457"


def test_position_round_trips_through_the_proto_and_counts_tx_seq() -> None:
    p = CapturePosition("mariadb", gtid_set="0-1-5", gtid="0-1-5", file="mysql-bin.000002",
                        offset=1044, file_created_unix=1700000000, server_id=1, tx_seq=41)
    nxt = p.after(gtid="0-1-6", gtid_set="0-1-6", file="mysql-bin.000002", offset=1200,
                  file_created_unix=1700000000, server_id=1, identity="abc")
    assert nxt.tx_seq == 42
    proto = nxt.to_proto(3)
    assert proto.tx_seq == 42 and proto.event_index == 3
    assert proto.mysql.gtid_set == "0-1-6" and proto.mysql.offset == 1200
    back = CapturePosition.from_proto(proto, "mariadb")
    assert (back.gtid_set, back.file, back.offset, back.tx_seq, back.server_id,
            back.file_created_unix) == ("0-1-6", "mysql-bin.000002", 1200, 42, 1, 1700000000)


def test_from_proto_refuses_the_other_flavor() -> None:
    proto = CapturePosition("mysql", gtid_set=f"{U1}:1-5", tx_seq=1).to_proto()
    assert CapturePosition.from_proto(proto, "mysql").state() == MysqlGtidSet.parse(f"{U1}:1-5")
    with pytest.raises(ValueError, match="MariaDB GTID"):
        CapturePosition.from_proto(proto, "mariadb")


# -- MySQL: GTID_SUBSET(checkpoint, gtid_executed) and gtid_purged ----------------------

def mysql(executed: str, purged: str = "") -> ServerFacts:
    return ServerFacts(flavor="mysql", version="8.4.0", server_id=1, binlogs=["binlog.000001"],
                       server_uuid=U1, gtid_executed=MysqlGtidSet.parse(executed),
                       gtid_purged=MysqlGtidSet.parse(purged))


def cp_mysql(gtids: str) -> CapturePosition:
    return CapturePosition("mysql", gtid_set=gtids, tx_seq=10)


def test_mysql_reachable_when_checkpoint_is_executed_and_nothing_after_it_purged() -> None:
    assert loss_reason(cp_mysql(f"{U1}:1-50"), mysql(f"{U1}:1-100", f"{U1}:1-40")) is None
    assert loss_reason(cp_mysql(f"{U1}:1-50"), mysql(f"{U1}:1-50")) is None


def test_mysql_server_behind_or_other_server_is_lost() -> None:
    reason = loss_reason(cp_mysql(f"{U1}:1-50"), mysql(f"{U1}:1-30"))
    assert reason and f"{U1}:31-50" in reason and "behind" in reason
    reason = loss_reason(cp_mysql(f"{U1}:1-50"), mysql(f"{U2}:1-500"))
    assert reason and "not the server" in reason


def test_mysql_purged_past_the_checkpoint_is_lost() -> None:
    reason = loss_reason(cp_mysql(f"{U1}:1-50"), mysql(f"{U1}:1-100", f"{U1}:1-60"))
    assert reason and f"{U1}:51-60" in reason and "purged" in reason
    # a promoted replica with its own purged history of another source
    assert loss_reason(cp_mysql(f"{U1}:1-50,{U2}:1-3"),
                       mysql(f"{U1}:1-80,{U2}:1-9", f"{U2}:1-3")) is None


def test_mysql_empty_checkpoint_with_purged_binlog() -> None:
    assert loss_reason(cp_mysql(""), mysql(f"{U1}:1-5")) is None
    assert "purged" in (loss_reason(cp_mysql(""), mysql(f"{U1}:1-5", f"{U1}:1-2")) or "")


# -- MariaDB ---------------------------------------------------------------------------

def maria(pos: str, state: str | None = None, oldest: str = "", binlogs: tuple[str, ...] = (
        "mysql-bin.000001", "mysql-bin.000002"), server_id: int = 1) -> ServerFacts:
    return ServerFacts(
        flavor="mariadb", version="10.11.6-MariaDB", server_id=server_id, binlogs=list(binlogs),
        gtid_binlog_pos=MariadbGtidPosition.parse(pos),
        gtid_binlog_state=MariadbBinlogState.parse(state if state is not None else pos),
        first_binlog=BinlogHeader(binlogs[0], 1_700_000_000,
                                  MariadbGtidPosition.parse(oldest)))


def cp(gtids: str, file: str = "mysql-bin.000002", offset: int = 900, prev: str = "",
       digest: int = 0xD1) -> CapturePosition:
    return CapturePosition("mariadb", gtid_set=gtids, gtid=gtids.split(",")[0], file=file,
                           offset=offset, server_id=1, prev_gtid=prev, tx_digest=digest,
                           tx_seq=7)


SAME = Sameness(True, "the same server")
OTHER = Sameness(False, "a different server (its data directory was created at T2, ...)")
UNKNOWN = Sameness(None, "a server whose identity was never stored")


def ours(gtid: str = "0-1-50") -> CheckpointProof:
    return CheckpointProof(gtid, 0xD1)


def test_before_is_the_state_just_before_the_transaction() -> None:
    p = cp("0-1-50,1-1-3", prev="0-1-49")
    assert str(p.before()) == "0-1-49,1-1-3"
    assert str(cp("1-1-3,0-1-50").before()) == "0-1-50"  # first of its domain: domain dropped


def test_mariadb_the_same_transaction_proves_continuity_on_any_server() -> None:
    assert loss_reason(cp("0-1-50"), maria("0-1-80"), ours(), SAME) is None
    # a promoted replica: applied 0-1-1..60 from server 1, then wrote 0-2-61..70
    facts = maria("0-2-70", state="0-1-60,0-2-70", server_id=2)
    assert loss_reason(cp("0-1-50"), facts, ours(), OTHER) is None


def test_mariadb_server_behind_is_lost_and_says_who_it_is() -> None:
    reason = loss_reason(cp("0-1-50"), maria("0-1-30"), ours(), SAME)
    assert reason and "binlog ends at 0-1-30 but our checkpoint is at 0-1-50" in reason
    assert "behind our checkpoint; this server's binlog was reset (RESET MASTER)" in reason
    reason = loss_reason(cp("0-1-50,1-1-3"), maria("0-1-60"), None, OTHER)
    assert reason and "domain 1" in reason and "this is a different server" in reason
    reason = loss_reason(cp("0-1-50"), maria(""), None, OTHER)
    assert reason and "binlog ends at nothing (an empty binlog) but" in reason


def test_mariadb_independent_server_is_lost_even_when_its_numbers_are_ahead() -> None:
    # another server wrote its own 0-7-1..500: our 0-1-50 was never in its history
    reason = loss_reason(cp("0-1-50"), maria("0-7-500", server_id=7), None, OTHER)
    assert reason and "never contained GTID 0-1-50" in reason


def test_mariadb_same_numbers_other_contents_is_lost() -> None:
    """A fresh server with server_id 1 reuses 0-1-N: the number matches, the contents not."""
    other = CheckpointProof("0-1-50", 0xBAD)
    reason = loss_reason(cp("0-1-50"), maria("0-1-153"), other, OTHER)
    assert reason and "does not contain our checkpoint's transaction 0-1-50" in reason
    assert "has other contents than ours; this is a different server" in reason
    reason = loss_reason(cp("0-1-50"), maria("0-1-153"), other, SAME)
    assert reason and "binlog was rewritten (RESET MASTER" in reason
    reason = loss_reason(cp("0-1-50", prev="0-1-49"), maria("0-1-153"),
                         CheckpointProof("0-2-50", 0xD1), UNKNOWN)
    assert reason and "after 0-1-49 it holds 0-2-50, not 0-1-50" in reason


def test_mariadb_unprovable_continuity_is_lost_unless_it_is_the_same_server() -> None:
    gone = CheckpointProof(None, why="the binlog that held it was purged")
    assert loss_reason(cp("0-1-50"), maria("0-1-80"), gone, SAME) is None
    reason = loss_reason(cp("0-1-50"), maria("0-1-80"), gone, OTHER)
    assert reason and reason.startswith("cannot prove that this server's history contains our "
                                        "checkpoint's transaction 0-1-50 (mysql-bin.000002:900)")
    assert "(the binlog that held it was purged), and this is a different server" in reason
    reason = loss_reason(cp("0-1-50", digest=0), maria("0-1-80"), None, UNKNOWN)
    assert reason and "no transaction digest" in reason


def test_mariadb_purged_past_the_checkpoint_is_lost() -> None:
    reason = loss_reason(cp("0-1-50"), maria("0-1-80", oldest="0-1-60"), None, SAME)
    assert reason and "purged past our checkpoint" in reason and "0-1-60" in reason
    assert loss_reason(cp("0-1-50"), maria("0-1-80", oldest="0-1-50"), None, SAME) is None
    reason = loss_reason(cp("0-1-50"), maria("0-1-80,3-1-9", oldest="0-1-10,3-1-2"), None, SAME)
    assert reason and "3-1-2" in reason  # a domain we never read was purged
    reason = loss_reason(cp("0-1-50"), maria("0-1-80", oldest="0-1-60"), None, OTHER)
    assert reason and reason.startswith("cannot prove that this server's history contains")
    assert "purged past it (the oldest binlog mysql-bin.000001 starts after 0-1-60" in reason
    assert reason.endswith("and this is a different server (its data directory was created "
                           "at T2, ...)")


def test_check_reachable_raises_the_exact_text() -> None:
    with pytest.raises(PositionLostError) as info:
        check_reachable(cp("0-1-50"), maria("0-1-30"), None, SAME)
    assert str(info.value).startswith("position lost: the server's binlog ends at 0-1-30")
    assert str(info.value).endswith(". Re-snapshot required.")


# -- a server accepted as it is now (`tailrace resnapshot`, snapshot.mode when_needed) ------

def _checkpoint(position: CapturePosition) -> Checkpoint:
    return Checkpoint(source_id="s", sink_id="k", position=position.to_proto())


def test_after_an_accept_the_lost_history_is_set_aside_and_numbering_goes_on_above_it() -> None:
    facts = ServerFacts(flavor="mariadb", version="10.11", server_id=1, binlogs=["b.1"],
                        gtid_binlog_pos=MariadbGtidPosition.parse("0-1-900"))
    old = CapturePosition("mariadb", gtid_set="0-1-30", gtid="0-1-30", tx_seq=22)
    accepted = Accepted(tx_seq=25, gtid_set="0-1-800")  # 23..25: cut short on the bus
    # nothing of the new history yet: its start, numbered after everything published
    checkpoint, start = resume_from(ResumePoint(_checkpoint(old), None, old.to_proto()), facts,
                                    accepted=accepted)
    assert checkpoint is None
    assert (start.gtid_set, start.tx_seq) == ("0-1-800", 25)
    # published in the new history, the sinks still in the old: from what was published
    new = CapturePosition("mariadb", gtid_set="0-1-850", gtid="0-1-850", tx_seq=70)
    checkpoint, start = resume_from(ResumePoint(_checkpoint(old), None, new.to_proto()), facts,
                                    accepted=accepted)
    assert checkpoint is None and (start.gtid_set, start.tx_seq) == ("0-1-850", 70)
    # the sinks checkpointed in the new history: the rule as always
    mid = CapturePosition("mariadb", gtid_set="0-1-820", gtid="0-1-820", tx_seq=40)
    checkpoint, start = resume_from(ResumePoint(_checkpoint(mid), None, new.to_proto()), facts,
                                    accepted=accepted)
    assert checkpoint is not None and checkpoint.tx_seq == 40 and start.tx_seq == 70


def test_the_accepted_boundary_is_kept_in_the_identity_but_not_in_its_fingerprint() -> None:
    attributes = {"server_id": "1", "gtid_domains": "0", "datadir_created": "1700000000"}
    with_boundary = {**attributes, "accepted_tx_seq": "25", "accepted_gtid_set": "0-1-800"}
    assert identity_fingerprint("mariadb", attributes) == \
        identity_fingerprint("mariadb", with_boundary)
    stored = ServerIdentity(flavor="mariadb", attributes=with_boundary)
    assert accepted_of(stored) == Accepted(25, "0-1-800")
    assert accepted_of(ServerIdentity(flavor="mariadb", attributes=attributes)) is None
    assert accepted_of(None) is None
    assert "accepted" not in describe_change(stored, attributes)
