"""The position rules of capture-postgres, without servers: what is lost, what is reachable,
and timeline-qualified positions that stay ordered across a failover."""

from __future__ import annotations

import pytest

from tailrace.errors import PositionLostError, SourceConfigurationError
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import Position, PostgresPosition
from tailrace_services.capture_postgres.connection import SlotState, SystemIdentity
from tailrace_services.capture_postgres.position import (
    Resume,
    Timelines,
    check_slot,
    check_timeline,
    lsn_of,
    tx_seq_of,
)

SWITCH = 0x3000_0A0  # where timeline 1 ended on the promoted server


def server(timeline: int) -> SystemIdentity:
    return SystemIdentity("7300000000000000001", timeline, 0x9000_0000, "shop")


def lost(fn: object, *args: object) -> str:
    with pytest.raises(PositionLostError) as e:
        fn(*args)  # type: ignore[operator]
    message = str(e.value)
    assert message.startswith("position lost: ") and message.endswith(". Re-snapshot required.")
    return message


def test_positions_stay_ordered_across_a_failover_and_replays_keep_their_number() -> None:
    promoted = Timelines(2, ((1, SWITCH),))
    old_past_switch = tx_seq_of(1, SWITCH + 0x500)  # published by the old primary, lost
    new_tx = tx_seq_of(promoted.of(SWITCH + 0x100), SWITCH + 0x180)  # same LSNs, new primary
    assert new_tx > old_past_switch, "downstream dedup by position would drop the new one"
    shared = SWITCH - 0x200  # re-read from the shared history: the old number again
    assert tx_seq_of(promoted.of(shared), shared + 0x30) == tx_seq_of(1, shared + 0x30)
    assert lsn_of(new_tx) == SWITCH + 0x180
    assert Timelines(1).of(SWITCH * 100) == 1
    assert Timelines(3, ((1, 0x100), (2, 0x200))).of(0x150) == 2


def test_resume_comes_from_the_minimum_checkpoint() -> None:
    position = Position(tx_seq=tx_seq_of(2, 0x4000), postgres=PostgresPosition(timeline=2))
    assert Resume.of(pb.Checkpoint(position=position), None) == Resume(
        0x4000, 2, True, confirm_lsn=0x4000)
    assert Resume.of(None, pb.Epoch(epoch_id=3)) == Resume(0, 0, True)
    assert Resume.of(None, None) == Resume()


def test_slot_checks() -> None:
    at = Resume(0x5000, 1, True)
    healthy = SlotState(True, "reserved", 0x4000, 0x9000, restart_lsn=0x3000)
    check_slot(healthy, "s", at, True)
    check_slot(SlotState(False, current_wal_lsn=0x9000), "s", Resume(), True)  # first start
    assert "does not exist, but our checkpoint 0/5000 on timeline 1 was read from it" in lost(
        check_slot, SlotState(False, current_wal_lsn=0x9000), "s", at, True)
    assert "does not exist, but the latest transaction we published, ending at 0/4800" in lost(
        check_slot, SlotState(False, current_wal_lsn=0x9000), "s",
        Resume(published=True, published_lsn=0x4800, published_timeline=1), True)
    with pytest.raises(SourceConfigurationError, match="create_slot is false"):
        check_slot(SlotState(False, current_wal_lsn=0x9000), "s", Resume(), False)
    assert "wal_status=lost" in lost(check_slot, SlotState(True, "lost", 0x4000, 0x9000), "s",
                                     at, True)
    assert "confirmed_flush_lsn 0/6000 is past our checkpoint 0/5000" in lost(
        check_slot, SlotState(True, "reserved", 0x6000, 0x9000, restart_lsn=0x3000), "s", at,
        True)


def test_timeline_checks() -> None:
    history = [(1, SWITCH)]
    check_timeline(history, server(2), Resume(SWITCH - 0x10, 1, True))  # before the switch
    check_timeline(history, server(2), Resume(SWITCH, 1, True))
    check_timeline([], server(1), Resume(0x10, 1, True))
    assert "left timeline 1 at 0/30000A0, before our checkpoint 0/30000A1" in lost(
        check_timeline, history, server(2), Resume(SWITCH + 1, 1, True))
    assert "which is not in the history of" in lost(
        check_timeline, [(2, SWITCH)], server(3), Resume(0x10, 1, True))
