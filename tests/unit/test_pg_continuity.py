"""How capture-postgres decides identity and continuity, without servers (issue 11.2, the
PostgreSQL audit): which check names the cause, what is lost, and how the re-read WAL is
compared with the transactions we published."""

from __future__ import annotations

import pytest

from tailrace.errors import PositionLostError, SourceConfigurationError
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import Position, PostgresPosition
from tailrace_services.capture_postgres.connection import ServerFacts, SlotState, SystemIdentity
from tailrace_services.capture_postgres.history import (
    Expected,
    HistoryCheck,
    expected_transactions,
)
from tailrace_services.capture_postgres.identity import describe_change, different_cluster
from tailrace_services.capture_postgres.position import (
    Resume,
    TxMark,
    check_position,
    check_slot,
    check_wal_end,
    confirm_point,
    tx_seq_of,
)

SYSTEM = "7300000000000000001"
TS = 1_795_000_000_000_000  # a commit time in Unix microseconds
CHECKPOINT = TxMark(end_lsn=0x5000, xid=740, commit_ts_us=TS, timeline=1,
                    last_change_lsn=0x4F00)
LATEST = TxMark(end_lsn=0x7000, xid=760, commit_ts_us=TS + 9_000, timeline=1,
                last_change_lsn=0x6F00)
AT = Resume(0x5000, 1, True, published_lsn=0x7000, published_timeline=1,
            checkpoint=CHECKPOINT, latest=LATEST, confirm_lsn=0x4F00)


def server(timeline: int = 1, system_id: str = SYSTEM) -> SystemIdentity:
    return SystemIdentity(system_id, timeline, 0x9000, "shop")


def slot(confirmed: int = 0x4F00, *, wal_status: str = "reserved", restart_lsn: int = 0x3000,
         slot_type: str = "logical", plugin: str = "pgoutput", database: str = "shop"
         ) -> SlotState:
    return SlotState(True, wal_status, confirmed, 0x9000, restart_lsn, slot_type, plugin,
                     database)


def lost(fn: object, *args: object) -> str:
    with pytest.raises(PositionLostError) as e:
        fn(*args)  # type: ignore[operator]
    message = str(e.value)
    assert message.startswith("position lost: ") and message.endswith(". Re-snapshot required.")
    return message


def position(end: int, last_change: int, xid: int, ts: int, timeline: int = 1) -> Position:
    return Position(tx_seq=tx_seq_of(timeline, end), postgres=PostgresPosition(
        commit_lsn=end, event_lsn=last_change, timeline=timeline, xid=xid, commit_ts_us=ts))


# -- positions name their transaction ------------------------------------------------------


def test_resume_names_the_checkpoint_and_the_latest_published_transaction() -> None:
    checkpoint = pb.Checkpoint(position=position(0x5000, 0x4F00, 740, TS))
    epoch = pb.Epoch(position=position(0x7000, 0x6F00, 760, TS + 9_000))
    assert Resume.of(checkpoint, epoch) == AT
    assert confirm_point(checkpoint.position) == 0x4F00, "the slot re-sends the checkpoint"
    legacy = Position(tx_seq=tx_seq_of(1, 0x5000))  # written before positions named their tx
    assert confirm_point(legacy) == 0x5000 and TxMark.of(legacy) is None
    assert Resume.of(None, epoch).describe() == (
        "the latest transaction we published, ending at 0/7000 on timeline 1 (no sink has "
        "checkpointed yet)")
    assert CHECKPOINT.describe() == ("xid 740 committed at 2026-11-18T11:06:40.000000+00:00, "
                                     "ending at 0/5000 on timeline 1")


# -- the checks at connect, in the order that names the real cause --------------------------


def test_a_timeline_forked_before_the_checkpoint_is_named_first() -> None:
    facts = ServerFacts(SlotState(False, current_wal_lsn=0x4000), ((1, 0x4800),))
    message = lost(check_position, facts, server(2), "s", AT, True)
    assert (f"the server (system_identifier {SYSTEM}, timeline 2) left timeline 1 at 0/4800, "
            "before our checkpoint 0/5000 on that timeline") in message


def test_a_server_behind_our_checkpoint_is_named_before_its_missing_slot() -> None:
    facts = ServerFacts(SlotState(False, current_wal_lsn=0x4000))
    message = lost(check_position, facts, server(1), "s", AT, True)
    assert (f"the server (system_identifier {SYSTEM}, timeline 1) has written WAL only up to "
            "0/4000, but our checkpoint is 0/5000 on timeline 1") in message


def test_a_server_behind_what_we_published_lost_those_transactions() -> None:
    assert ("has written WAL only up to 0/6000, but we already published a transaction ending "
            "at 0/7000 on timeline 1") in lost(check_wal_end, 0x6000, server(1), AT)
    check_wal_end(0x7000, server(1), AT)
    # published past the switch point of a failover: lost with the old primary, not here
    check_wal_end(0x6000, server(2), AT)


def test_a_healthy_slot_passes() -> None:
    check_position(ServerFacts(slot()), server(1), "s", AT, True)
    check_position(ServerFacts(slot(confirmed=0x4000)), server(1), "s", AT, True)
    check_slot(SlotState(False, current_wal_lsn=0x9000), "s", Resume(), True)  # first start


def test_a_recreated_slot_is_a_gap_even_before_any_checkpoint() -> None:
    published = Resume(published=True, published_lsn=0x7000, published_timeline=1)
    assert ("slot 's' confirmed_flush_lsn 0/8000 is past the latest transaction we published, "
            "ending at 0/7000") in lost(check_slot, slot(confirmed=0x8000), "s", published, True)
    check_slot(slot(confirmed=0x2000), "s", published, True)


def test_a_slot_that_cannot_decode_after_the_checkpoint_is_lost() -> None:
    assert "restart_lsn=NULL: the server invalidated it" in lost(
        check_slot, slot(restart_lsn=0), "s", AT, True)
    assert "restart_lsn 0/5800 is past our checkpoint 0/5000" in lost(
        check_slot, slot(restart_lsn=0x5800), "s", AT, True)
    with pytest.raises(SourceConfigurationError, match="nothing was read from it yet"):
        check_slot(slot(wal_status="lost", restart_lsn=0), "s", Resume(), True)


@pytest.mark.parametrize("kind", [{"slot_type": "physical"}, {"plugin": "test_decoding"},
                                  {"database": "other"}])
def test_a_slot_of_another_kind_is_not_ours(kind: dict[str, str]) -> None:
    (name, value), = kind.items()
    message = lost(check_slot, slot(**kind), "s", AT, True, "shop")
    assert f"replication slot 's' has {name} {value!r}: it is not the logical pgoutput slot " \
           "of database 'shop' that our checkpoint 0/5000 on timeline 1 was read from" in message
    with pytest.raises(SourceConfigurationError, match="drop it, or set spec.source.slot"):
        check_slot(slot(**kind), "s", Resume(), True, "shop")


# -- identity -----------------------------------------------------------------------------


def identity(system_id: str, timeline: int) -> pb.ServerIdentity:
    return pb.ServerIdentity(flavor="postgresql", attributes={
        "system_identifier": system_id, "timeline": str(timeline), "database": "shop"})


def test_another_cluster_is_lost_whatever_its_lsns_say() -> None:
    old = identity("7100000000000000009", 1)
    found = different_cluster(old, server(1), "tailrace_orders", AT)
    assert found is not None
    assert found.reason == (
        f"the server changed (system_identifier 7100000000000000009 -> {SYSTEM}): this is a "
        "different cluster (timeline 1, WAL at 0/9000), not the one on timeline 1 we streamed "
        "from; our checkpoint 0/5000 on timeline 1 was read from slot 'tailrace_orders' of that "
        "cluster, and its LSNs do not exist here")
    nothing = different_cluster(old, server(1), "tailrace_orders", Resume())
    assert nothing is not None and "nothing was published yet" in nothing.reason
    assert different_cluster(identity(SYSTEM, 1), server(2), "s", AT) is None
    assert describe_change(identity(SYSTEM, 1), server(2)) == (
        f"promoted standby or restored backup (same cluster, another timeline): "
        f"system_identifier {SYSTEM}, timeline 1 -> 2")


# -- the re-read ----------------------------------------------------------------------------


def check(*expected: Expected, resume_lsn: int = 0x5000) -> HistoryCheck:
    return HistoryCheck(resume_lsn, list(expected))


def test_the_same_history_passes_and_later_transactions_flow() -> None:
    history = check(Expected(CHECKPOINT, "our checkpoint's transaction", True),
                    Expected(LATEST, "the latest transaction we published", True))
    history.on_commit(700, 0x4000, 0x4100, TS - 5)  # before the checkpoint: skipped anyway
    history.on_commit(740, 0x4F80, 0x5000, TS)
    assert history.pending
    history.on_commit(750, 0x5100, 0x5200, TS + 10)
    history.on_commit(760, 0x6F80, 0x7000, TS + 9_000)
    assert not history.pending
    history.on_commit(999, 0x6F80, 0x9000, TS + 10_000)  # nothing left to compare


def test_another_transaction_at_our_lsn_is_another_history() -> None:
    history = check(Expected(CHECKPOINT, "our checkpoint's transaction", True))
    message = lost(history.on_commit, 740, 0x4F80, 0x5000, TS + 1)  # same xid, other time
    assert ("this server's transaction ending at 0/5000 is xid 740 committed at "
            "2026-11-18T11:06:40.000001+00:00, its commit record from 0/4F80 to 0/5000, not "
            "our checkpoint's transaction (xid 740 committed at 2026-11-18T11:06:40.000000+00:00"
            ", ending at 0/5000 on timeline 1)") in message


def test_a_transaction_spanning_our_resume_position_is_another_history() -> None:
    message = lost(check().on_commit, 741, 0x4F80, 0x5010, TS)
    assert "spans our resume position 0/5000" in message


def test_a_transaction_spanning_the_end_of_ours_is_another_history() -> None:
    history = check(Expected(LATEST, "the latest transaction we published", False))
    assert "spans the end of the latest transaction we published" in lost(
        history.on_commit, 761, 0x6F80, 0x7010, TS)


def test_a_required_transaction_that_never_comes_is_lost() -> None:
    history = check(Expected(CHECKPOINT, "our checkpoint's transaction", True))
    assert ("our checkpoint's transaction (xid 740 committed at 2026-11-18T11:06:40.000000+00:00"
            ", ending at 0/5000 on timeline 1) was not sent again: the next transaction it sent "
            "is xid 900") in lost(history.on_commit, 900, 0x5000, 0x5100, TS)
    history = check(Expected(CHECKPOINT, "our checkpoint's transaction", True))
    history.on_wal_end(0x4FFF)
    assert "it has sent its WAL up to 0/5000 without it" in lost(history.on_wal_end, 0x5000)


def test_a_transaction_that_may_not_come_again_is_only_logged() -> None:
    history = check(Expected(CHECKPOINT, "our checkpoint's transaction", False))
    history.on_commit(900, 0x5000, 0x5100, TS)
    assert not history.pending


def test_what_the_re_read_must_show() -> None:
    def required(facts: ServerFacts | None, timeline: int = 1) -> list[tuple[int, bool]]:
        system = server(timeline)
        return [(e.mark.end_lsn, e.required) for e in expected_transactions(AT, facts, system)]

    assert required(ServerFacts(slot())) == [(0x5000, True), (0x7000, True)]
    # a slot confirmed at the checkpoint's end (before this version): it is not sent again
    assert required(ServerFacts(slot(confirmed=0x5000))) == [(0x5000, False), (0x7000, True)]
    # the check failed: the slot is taken to be confirmed as capture confirms it
    assert required(None) == [(0x5000, True), (0x7000, True)]
    # promoted at 0/6000: the latest published transaction was lost with the old primary
    promoted = ServerFacts(slot(), ((1, 0x6000),))
    assert required(promoted, 2) == [(0x5000, True)]
    assert required(None, 2) == [(0x5000, True)]
    assert expected_transactions(Resume(0x5000, 1, True), ServerFacts(slot()), server(1)) == []
