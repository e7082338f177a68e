"""The one resume rule: the checkpoint, or further when the bus provably has more."""

from __future__ import annotations

from typing import Any

import pytest

from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import MysqlPosition, Position, PostgresPosition
from tailrace_services.capture import resume as resume_module
from tailrace_services.capture.resume import ResumePoint, ResumeRule
from tests.fix_capture import unit_pipeline


def mysql(tx_seq: int, gtid: str = "0-1-1") -> Position:
    return Position(tx_seq=tx_seq, mysql=MysqlPosition(gtid=gtid, gtid_set=gtid))


class FakeControl:
    def __init__(self, checkpoint: Position | None, epoch: Position | None) -> None:
        self.checkpoint = pb.Checkpoint(position=checkpoint) if checkpoint else None
        self.epoch = pb.Epoch(epoch_id=1, position=epoch) if epoch else None

    def minimum_checkpoint(self, source_id: str, sink_ids: list[str]) -> pb.Checkpoint | None:
        assert (source_id, sink_ids) == ("pg1", ["r1"])
        return self.checkpoint

    def latest_epoch(self, source_id: str) -> pb.Epoch | None:
        return self.epoch


@pytest.fixture
def tail(monkeypatch: pytest.MonkeyPatch) -> list[Position | None]:
    """What `published_tail` answers (and a record of the calls)."""
    answers: list[Position | None] = []
    monkeypatch.setattr(resume_module, "published_tail",
                        lambda *a, **k: answers.pop(0) if answers else None)
    return answers


def rule(control: Any, skip_published: bool) -> ResumeRule:
    return ResumeRule(unit_pipeline(), control, skip_published=skip_published)


def test_start_is_the_furthest_of_checkpoint_and_bus_tail(tail: list[Position | None]) -> None:
    r = rule(FakeControl(mysql(5), mysql(7)), skip_published=True)
    tail.append(mysql(9))
    point = r.read()
    assert point.checkpoint is not None and point.checkpoint.position.tx_seq == 5
    assert point.start is not None and point.start.tx_seq == 9
    tail.append(mysql(3))  # a bus behind the checkpoint (a rewound sink is ahead): checkpoint
    assert r.read().start == mysql(5)


def test_what_this_process_published_spares_the_bus_read_until_forgotten(
        tail: list[Position | None]) -> None:
    r = rule(FakeControl(mysql(5), None), skip_published=True)
    r.published_up_to(mysql(12))
    tail.append(mysql(8))
    assert r.read().start == mysql(12) and tail == [mysql(8)]  # the bus was not asked
    r.forget()
    assert r.read().start == mysql(8)


def test_a_refused_published_position_leaves_the_checkpoint(tail: list[Position | None]) -> None:
    r = rule(FakeControl(mysql(5), None), skip_published=True)
    tail.append(mysql(9))
    assert r.read(accept=lambda p: False).start == mysql(5)


def test_a_source_that_does_not_skip_starts_at_the_checkpoint(
        tail: list[Position | None]) -> None:
    pg = Position(tx_seq=(1 << 48) | 0x5000, postgres=PostgresPosition(commit_lsn=0x5000))
    epoch = Position(tx_seq=(1 << 48) | 0x9000, postgres=PostgresPosition(commit_lsn=0x9000))
    r = rule(FakeControl(pg, epoch), skip_published=False)
    r.published_up_to(epoch)
    tail.append(epoch)
    point = r.read()
    assert point.start == pg and point.published is None and tail == [epoch]
    assert point.latest_epoch is not None and point.latest_epoch.position == epoch


def test_positions_that_name_nothing_are_no_start() -> None:
    origin = pb.Checkpoint(position=Position())  # tx 0, no native position
    assert ResumePoint(origin, None, None).start is None
    assert ResumePoint(None, None, None).start is None
