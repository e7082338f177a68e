"""Checkpoint compare-and-set on both storage backends."""

from __future__ import annotations

import pytest

from tailrace.proto import control_pb2 as pb
from tailrace_services.control.checkpoints import CheckpointStore
from tailrace_services.control.storage import MemoryStorage, SqliteStorage


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    storage = MemoryStorage() if request.param == "memory" else SqliteStorage(
        str(tmp_path / "c.db"))
    yield CheckpointStore(storage)
    storage.close()


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
