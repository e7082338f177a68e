"""Where a sink with no checkpoint yet starts (services/control/sink_start.py): its first
checkpoint just past the latest epoch (`now`), with a snapshot of every selected table
queued (`snapshot`); a sink with a checkpoint never moved. The real control service's
admin API, over gRPC, in tests/integration/test_managed_sink_start.py."""

from __future__ import annotations

import pytest

from tailrace.proto import control_pb2 as pb
from tailrace_services.control.admin import AdminServicer
from tailrace_services.control.checkpoints import CheckpointStore
from tailrace_services.control.epochs import EpochStore
from tailrace_services.control.health import HealthStore
from tailrace_services.control.pipelines import PipelineRegistry
from tailrace_services.control.sink_start import SinkStarts
from tailrace_services.control.snapshots import SnapshotService, SnapshotStore
from tailrace_services.control.status import InvalidArgument
from tailrace_services.control.storage import MemoryStorage, SqliteStorage


class Control:
    def __init__(self, storage) -> None:
        self.storage = storage
        self.checkpoints = CheckpointStore(storage)
        self.epochs = EpochStore(storage)
        self.pipelines = PipelineRegistry(storage, HealthStore(storage))
        self.snapshots = SnapshotService(SnapshotStore(storage), self.pipelines)
        self.admin = AdminServicer(self.pipelines, self.checkpoints, self.epochs,
                                   SinkStarts(storage, self.checkpoints, self.epochs,
                                              self.snapshots))

    def record(self, epoch_id: int, tx_seq: int, offsets: dict[int, int],
               generation: int = 0) -> pb.Epoch:
        epoch = pb.Epoch(source_id="src", epoch_id=epoch_id, bus_generation=generation)
        epoch.position.tx_seq = tx_seq
        for p, o in offsets.items():
            epoch.end_offsets[p] = o
        self.epochs.record(epoch)
        return epoch

    def register(self, **starts: str) -> pb.RegisterPipelineResponse:
        info = pb.PipelineInfo(name="orders", source_id="src", source_type="postgres")
        for sink, start in starts.items():
            info.sinks.append(pb.SinkInfo(id=sink, type="redis", required=True, start=start))
        return self.admin.RegisterPipeline(info, None)

    def selected(self, **tables: list[str]) -> None:
        """What capture reports, once registered: the tables it streams and their keys."""
        self.register(old="earliest")
        state = self.snapshots.get("orders")
        del state.selected[:]
        for table, keys in tables.items():
            state.selected.add(table=table, key_columns=keys)
        assert self.snapshots.update(pb.UpdateSnapshotRequest(
            state=state, expected_version=state.version)).updated


@pytest.fixture(params=["memory", "sqlite"])
def control(request, tmp_path):
    storage = MemoryStorage() if request.param == "memory" else SqliteStorage(
        str(tmp_path / "c.db"))
    yield Control(storage)
    storage.close()


def test_now_starts_just_past_the_latest_epoch_and_earliest_gets_no_checkpoint(control) -> None:
    control.register(old="earliest")
    control.record(1, 10, {0: 40, 1: 7})
    latest = control.record(2, 25, {0: 90, 1: 12})
    response = control.register(old="earliest", fresh="now", blank="")
    (started,) = response.started
    assert (started.sink_id, started.start, started.epoch_id) == ("fresh", "now", 2)
    cp = control.checkpoints.get("src", "fresh")
    assert cp is not None and cp.position == latest.position
    assert dict(cp.bus_offsets) == {0: 90, 1: 12} and cp.bus_generation == 0
    assert started.checkpoint == cp
    assert control.checkpoints.get("src", "old") is None, "earliest: from the oldest bus position"
    assert control.checkpoints.get("src", "blank") is None, "unset: earliest"
    assert [s.start for s in response.pipeline.sinks] == ["earliest", "now", ""]


def test_a_sink_with_a_checkpoint_is_never_moved_nor_snapshotted_again(control) -> None:
    control.record(1, 10, {0: 40})
    control.selected(**{"public.orders": ["id"]})
    control.register(fresh="snapshot")
    first = control.checkpoints.get("src", "fresh")
    queued = control.snapshots.get("orders").next_request_id
    control.record(2, 30, {0: 99})
    for start in ("snapshot", "now", "earliest"):
        assert not control.register(fresh=start).started
    assert control.checkpoints.get("src", "fresh") == first
    assert control.snapshots.get("orders").next_request_id == queued, "no second snapshot"
    # one committed by delivery is not moved either
    moved = pb.Checkpoint(source_id="src", sink_id="fresh", bus_offsets={0: 60})
    moved.position.tx_seq = 20
    assert control.checkpoints.commit(moved, first.version)[0]
    assert not control.register(fresh="now").started
    assert control.checkpoints.get("src", "fresh").position.tx_seq == 20


def test_no_epoch_yet_leaves_the_sink_at_the_beginning_for_good(control) -> None:
    (started,) = control.register(fresh="now").started
    assert started.epoch_id == 0 and "recorded no epoch yet" in started.note
    assert not started.HasField("checkpoint")
    assert control.checkpoints.get("src", "fresh") is None, "planned from the bus's start"
    control.record(1, 10, {0: 40})  # capture published meanwhile; delivery registers again
    assert not control.register(fresh="now").started, "what came since is the sink's too"
    assert control.checkpoints.get("src", "fresh") is None


def test_snapshot_queues_every_keyed_table_and_supersedes_a_read_under_way(control) -> None:
    control.record(1, 10, {0: 40})
    control.selected(**{"public.orders": ["id"], "public.items": ["id"], "public.log": []})
    control.snapshots.request(pb.SnapshotRequest(pipeline="orders", tables=["public.items"],
                                                 where="id > 5"))
    (started,) = control.register(fresh="snapshot").started
    assert list(started.snapshot_tables) == ["public.items", "public.orders"]
    assert "public.log" in started.note and "no primary key" in started.note
    assert "superseded" in started.note and "public.items" in started.note
    tables = {t.table: t for t in control.snapshots.get("orders").tables}
    assert set(tables) == {"public.items", "public.orders"}
    for table in tables.values():
        assert table.state == pb.SNAPSHOT_PENDING and not table.where, "whole reads"
        assert table.reason == "sink fresh starts with a snapshot"
    assert tables["public.items"].request_id == 2, "a new request: capture drops the old read"
    assert control.checkpoints.get("src", "fresh").position.tx_seq == 10


def test_snapshot_before_capture_reported_its_tables_says_so(control) -> None:
    control.record(1, 10, {0: 40})
    (started,) = control.register(fresh="snapshot").started
    assert not started.snapshot_tables and "has not reported its tables yet" in started.note


def test_a_start_the_service_does_not_know_is_refused() -> None:
    control = Control(MemoryStorage())
    with pytest.raises(InvalidArgument, match=r"sink fresh start 'latest' is not one of "
                                              r"earliest, now, snapshot"):
        control.register(fresh="latest")
