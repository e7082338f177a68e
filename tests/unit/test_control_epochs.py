"""The epoch history: delivery's planner asks for the epochs past the one it planned last at
every micro-batch, so the answer must not cost a read of the whole history."""

from __future__ import annotations

import pytest

from tailrace.proto import control_pb2 as pb
from tailrace_services.control.epochs import EpochStore
from tailrace_services.control.storage import MemoryStorage, Storage, open_storage


class CountingStorage(MemoryStorage):
    def __init__(self) -> None:
        super().__init__()
        self.rows_read = 0

    def log_read(self, name: str, after: int = 0, limit: int = 1000) -> list[tuple[int, bytes]]:
        rows = super().log_read(name, after, limit)
        self.rows_read += len(rows)
        return rows


def record(store: EpochStore, ids: list[int]) -> None:
    for n, epoch_id in enumerate(ids):
        epoch = pb.Epoch(source_id="s", epoch_id=epoch_id)
        epoch.position.tx_seq = epoch_id * 10
        epoch.end_offsets[0] = n + 1
        store.record(epoch)


# epoch ids grow but skip (a capture that emitted an epoch and died before recording it)
IDS = [1, 2, 3, 5, 8, 9, 10, 14, 15, 16, 17, 30, 31, 40]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_range_is_the_epochs_past_the_one_asked_for(backend: str, tmp_path) -> None:
    storage: Storage = MemoryStorage() if backend == "memory" else \
        open_storage(f"sqlite:///{tmp_path / 'state.db'}")
    store = EpochStore(storage)
    record(store, IDS)
    for after in range(0, 42):
        for limit in (1, 3, 1000):
            expected = [i for i in IDS if i > after][:limit]
            assert [e.epoch_id for e in store.range("s", after, 0, limit)] == expected, \
                (after, limit)
    assert [e.epoch_id for e in store.range("s", 4, 15, 1000)] == [5, 8, 9, 10, 14, 15]
    assert store.range("other", 0, 0, 1000) == []
    storage.close()


def test_the_few_epochs_past_a_recent_one_are_found_without_reading_the_history() -> None:
    storage = CountingStorage()
    store = EpochStore(storage)
    record(store, list(range(1, 5001)))
    storage.rows_read = 0
    assert [e.epoch_id for e in store.range("s", 4990, 0, 1000)] == list(range(4991, 5001))
    assert storage.rows_read < 50, "a bisection of one-entry reads, then the 10 asked for"
