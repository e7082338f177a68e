"""Checkpoint compare-and-set on both storage backends."""

from __future__ import annotations

import pytest

from tailrace.proto import control_pb2 as pb
from tailrace_services.control.checkpoints import CheckpointStore
from tailrace_services.control.epochs import EpochStore
from tailrace_services.control.status import FailedPrecondition
from tailrace_services.control.storage import MemoryStorage, SqliteStorage


def published(storage, tx_seq: int, offset: int = 1000) -> None:
    """Capture recorded an epoch at `tx_seq` (checkpoints may not pass it)."""
    epoch = pb.Epoch(source_id="src", epoch_id=tx_seq)
    epoch.position.tx_seq = tx_seq
    epoch.end_offsets[0] = offset
    EpochStore(storage).record(epoch)


@pytest.fixture(params=["memory", "sqlite"])
def storage(request, tmp_path):
    storage = MemoryStorage() if request.param == "memory" else SqliteStorage(
        str(tmp_path / "c.db"))
    published(storage, 100)
    yield storage
    storage.close()


@pytest.fixture
def store(storage):
    return CheckpointStore(storage)


def cp(seq: int, sink: str = "s1") -> pb.Checkpoint:
    c = pb.Checkpoint(source_id="src", sink_id=sink)
    c.position.tx_seq = seq
    return c


def test_cas_moves_forward_only_from_the_seen_version(store):
    ok, cur = store.commit(cp(5), 0)
    assert ok and cur.version == 1
    assert store.commit(cp(6), 0) == (False, store.get("src", "s1"))  # stale version
    ok, cur = store.commit(cp(7), 1)
    assert ok and cur.version == 2
    ok, cur = store.commit(cp(3), 2)  # backwards
    assert not ok and cur.position.tx_seq == 7


def test_minimum_needs_every_sink(store):
    store.commit(cp(9, "a"), 0)
    assert store.minimum("src", ["a", "b"]) is None
    store.commit(cp(4, "b"), 0)
    assert store.minimum("src", ["a", "b"]).sink_id == "b"
    assert [c.sink_id for c in store.list("src")] == ["a", "b"]


def test_a_checkpoint_past_the_latest_epoch_is_refused(storage, store):
    """A forged `tx_seq + 1e9` would let capture release source log never published."""
    far = cp(100 + 10**9)
    with pytest.raises(FailedPrecondition, match=r"beyond the latest epoch of source src "
                                                 r"\(epoch 100 at tx 100\.0\)"):
        store.commit(far, 0)
    offsets = cp(50)
    offsets.bus_offsets[0] = 1001
    with pytest.raises(FailedPrecondition, match="partition 0 offset 1001 > 1000"):
        store.commit(offsets, 0)
    assert store.get("src", "s1") is None
    assert store.commit(cp(100), 0)[0], "at the epoch is fine"
    published(storage, 200)
    assert store.commit(cp(150), 1)[0]


def test_no_epoch_no_checkpoint_but_the_origin(tmp_path):
    store = CheckpointStore(MemoryStorage())
    with pytest.raises(FailedPrecondition, match="has recorded no epoch yet"):
        store.commit(cp(1), 0)
    assert store.commit(cp(0), 0)[0], "the origin names nothing"


def test_bus_generations(storage, store):
    """A capture that found the bus emptied opens the next generation: its epoch may end
    before the latest one's offsets; an older generation's epoch and a checkpoint of a
    generation never published are refused, and offsets of an older one are not checked."""
    epochs = EpochStore(storage)
    behind = pb.Epoch(source_id="src", epoch_id=101, end_offsets={0: 10})
    behind.position.tx_seq = 101
    with pytest.raises(FailedPrecondition, match="ends before the latest recorded one"):
        epochs.record(behind)
    behind.bus_generation = 1
    behind.generation_start[0] = 3
    epochs.record(behind)
    assert epochs.latest("src").bus_generation == 1
    stale = pb.Epoch(source_id="src", epoch_id=102, end_offsets={0: 2000})
    stale.position.tx_seq = 102
    with pytest.raises(FailedPrecondition, match="older copy still running"):
        epochs.record(stale)

    old = cp(90)
    old.bus_offsets[0] = 900  # generation 0's offsets: past generation 1's end, no matter
    assert store.commit(old, 0)[0]
    assert epochs.highest("src").tx_seq == 101


def test_a_checkpoint_below_the_highest_epoch_is_accepted_on_a_new_generation(storage, store):
    """Capture republishes from the sinks' minimum checkpoint: the new generation's latest
    epoch is below what a faster sink already holds, which stays acceptable."""
    republished = pb.Epoch(source_id="src", epoch_id=101, end_offsets={0: 10},
                           bus_generation=1, generation_start={0: 1})
    republished.position.tx_seq = 60
    EpochStore(storage).record(republished)
    assert store.commit(cp(100), 0)[0], "at the highest position ever published"
    with pytest.raises(FailedPrecondition, match="beyond the latest epoch"):
        store.commit(cp(101, "s2"), 0)
    future = cp(95)
    future.bus_generation = 2
    with pytest.raises(FailedPrecondition, match="bus generation 2"):
        store.commit(future, 1)


def test_offsets_done_follow_the_latest_generation():
    from tailrace.bus_generation import offsets_done

    latest = pb.Epoch(bus_generation=1, generation_start={0: 3, 1: 7}, end_offsets={0: 9})
    same = pb.Checkpoint(bus_generation=1, bus_offsets={0: 5, 1: 7})
    older = pb.Checkpoint(bus_generation=0, bus_offsets={0: 900, 1: 800})
    assert offsets_done(same, latest) == {0: 5, 1: 7}
    assert offsets_done(older, latest) == {0: 3, 1: 7}
    assert offsets_done(None, latest) == {0: 3, 1: 7}
    assert offsets_done(older, None) == {0: 900, 1: 800}  # no epoch: generation 0
    assert offsets_done(None, None) == {}
