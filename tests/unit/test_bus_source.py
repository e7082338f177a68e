"""The delivery source's planning across bus generations (a fake control service)."""

from __future__ import annotations

import pytest

from tailrace.proto import control_pb2 as pb
from tailrace_services.delivery.source import BusDataSource, BusReplaced, BusStreamReader
from tests.fix_capture import unit_pipeline


class FakeControl:
    def __init__(self, epochs: list[pb.Epoch], checkpoint: pb.Checkpoint | None) -> None:
        self.epochs, self.checkpoint = epochs, checkpoint

    def minimum_checkpoint(self, source_id: str, sink_ids: list[str]) -> pb.Checkpoint | None:
        return self.checkpoint

    def latest_epoch(self, source_id: str) -> pb.Epoch | None:
        return self.epochs[-1] if self.epochs else None

    def epoch_range(self, source_id: str, after: int, up_to: int, limit: int
                    ) -> list[pb.Epoch]:
        return [e for e in self.epochs if e.epoch_id > after][:limit]


def epoch(epoch_id: int, end: int, generation: int = 0, start: int = 0) -> pb.Epoch:
    e = pb.Epoch(source_id="s", epoch_id=epoch_id, end_offsets={0: end},
                 bus_generation=generation)
    if generation:
        e.generation_start[0] = start
    return e


def reader(control: FakeControl, max_events: int = 0) -> BusStreamReader:
    r = BusStreamReader({"brokers": "127.0.0.1:1", "topic": "t", "partitions": "1",
                         "control": "127.0.0.1:2", "source_id": "s", "sink_ids": "a",
                         "max_events": str(max_events)}, unit_pipeline())
    r._control = control
    return r


@pytest.mark.parametrize("max_events", [0, 10])
def test_a_new_generation_starts_from_its_start_and_replaces_a_running_query(
        max_events: int) -> None:
    old = pb.Checkpoint(bus_offsets={0: 500})  # generation 0, on the bus that was lost
    control = FakeControl([epoch(1, 300), epoch(2, 600)], old)
    source = reader(control, max_events)
    running = source.latestOffset(source.initialOffset())
    assert running == {"0": 600, "generation": 0, "epoch": 2}

    control.epochs += [epoch(3, 40, generation=1, start=12)]  # capture republished
    with pytest.raises(BusReplaced, match="bus generation 1"):
        source.latestOffset(running)
    restarted = reader(control, max_events)  # the job starts a new query
    begin = restarted.initialOffset()
    assert begin == {"0": 12, "generation": 1}  # not the old checkpoint's 500
    end = restarted.latestOffset(begin)
    assert end == {"0": 40, "generation": 1, "epoch": 3}
    (part,) = restarted.partitions(begin, end)
    assert (part.start, part.end, part.generation, part.epoch_id) == (  # type: ignore[attr-defined]
        12, 40, 1, 3)


def test_a_query_behind_by_more_than_a_batch_sees_the_new_generation() -> None:
    """With a backlog past `max_events` the plan stops before the newer generation's epochs:
    the latest epoch is looked at first."""
    epochs = [epoch(n, 100 * n) for n in range(1, 10)] + [epoch(10, 5, generation=1, start=1)]
    source = reader(FakeControl(epochs, pb.Checkpoint(bus_offsets={0: 100})), max_events=150)
    with pytest.raises(BusReplaced):
        source.latestOffset({"0": 100, "generation": 0})


def test_the_source_of_a_pipeline_carries_its_spec_and_the_bare_one_refuses_to_read() -> None:
    pipeline = unit_pipeline()
    source = BusDataSource.for_pipeline(pipeline)
    assert source.pipeline is pipeline and BusDataSource.pipeline is None
    with pytest.raises(TypeError, match="register BusDataSource.for_pipeline"):
        BusDataSource({}).streamReader(BusDataSource({}).schema())
