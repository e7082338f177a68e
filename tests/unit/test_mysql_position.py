"""The checkpointed MySQL/MariaDB position and the reachability decisions made from server facts."""

from __future__ import annotations

import pytest

from tailrace.errors import PositionLostError
from tailrace_services.capture_mysql.connection import ServerFacts
from tailrace_services.capture_mysql.gtid import (
    MariadbBinlogState,
    MariadbGtidPosition,
    MysqlGtidSet,
)
from tailrace_services.capture_mysql.position import (
    CapturePosition,
    CheckpointFile,
    check_reachable,
    loss_reason,
)
from tailrace_services.capture_mysql.stream import BinlogHeader

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


def cp(gtids: str, file: str = "mysql-bin.000002", offset: int = 900, created: int = 1_700_000_100,
       server_id: int = 1) -> CapturePosition:
    return CapturePosition("mariadb", gtid_set=gtids, gtid=gtids.split(",")[0], file=file,
                           offset=offset, file_created_unix=created, server_id=server_id,
                           tx_seq=7)


def same_file(gtids: str, created: int = 1_700_000_100) -> CheckpointFile:
    return CheckpointFile(True, created, MariadbGtidPosition.parse(gtids))


def test_mariadb_reachable_on_the_same_server() -> None:
    assert loss_reason(cp("0-1-50"), maria("0-1-80"), same_file("0-1-50")) is None


def test_mariadb_server_behind_is_lost() -> None:
    reason = loss_reason(cp("0-1-50"), maria("0-1-30"), same_file("0-1-50"))
    assert reason and "behind our checkpoint" in reason and "0-1-30" in reason
    reason = loss_reason(cp("0-1-50,1-1-3"), maria("0-1-60"), None)
    assert reason and "domain 1" in reason


def test_mariadb_independent_server_is_lost_even_when_its_numbers_are_ahead() -> None:
    # another server wrote its own 0-7-1..500: our 0-1-50 was never in its history
    reason = loss_reason(cp("0-1-50"), maria("0-7-500", server_id=7), None)
    assert reason and "never contained GTID 0-1-50" in reason


def test_mariadb_promoted_replica_continues() -> None:
    # the replica applied 0-1-1..60 from the old primary (server 1), then wrote 0-2-61..70
    facts = maria("0-2-70", state="0-1-60,0-2-70", server_id=2)
    assert loss_reason(cp("0-1-50"), facts, None) is None


def test_mariadb_purged_past_the_checkpoint_is_lost() -> None:
    reason = loss_reason(cp("0-1-50"), maria("0-1-80", oldest="0-1-60"), None)
    assert reason and "purged past our checkpoint" in reason and "0-1-60" in reason
    assert loss_reason(cp("0-1-50"), maria("0-1-80", oldest="0-1-50"), None) is None
    reason = loss_reason(cp("0-1-50"), maria("0-1-80,3-1-9", oldest="0-1-10,3-1-2"), None)
    assert reason and "3-1-2" in reason  # a domain we never read was purged


def test_mariadb_reset_master_is_lost() -> None:
    # the checkpoint's file is gone and the newest binlog sorts before it
    reason = loss_reason(cp("0-1-50", file="mysql-bin.000007"),
                         maria("0-1-90", binlogs=("mysql-bin.000001",)), CheckpointFile(False))
    assert reason and "RESET MASTER" in reason
    # the same file name, created anew
    reason = loss_reason(cp("0-1-50"), maria("0-1-90"), same_file("0-1-50", created=1_800_000_000))
    assert reason and "was created at 1800000000" in reason
    # same second, but the offset is no longer our transaction's end
    reason = loss_reason(cp("0-1-50"), maria("0-1-90"), CheckpointFile(True, 1_700_000_100, None))
    assert reason and "not a transaction boundary" in reason
    reason = loss_reason(cp("0-1-50"), maria("0-1-90"), same_file("0-1-12"))
    assert reason and "rewritten" in reason


def test_mariadb_purged_file_but_history_kept_is_fine() -> None:
    facts = maria("0-1-90", oldest="0-1-40", binlogs=("mysql-bin.000003", "mysql-bin.000004"))
    assert loss_reason(cp("0-1-50", file="mysql-bin.000002"), facts, CheckpointFile(False)) is None


def test_check_reachable_raises_the_exact_text() -> None:
    with pytest.raises(PositionLostError) as info:
        check_reachable(cp("0-1-50"), maria("0-1-30"), None)
    assert str(info.value).startswith("position lost: the server's binlog ends at 0-1-30")
    assert str(info.value).endswith(". Re-snapshot required.")
