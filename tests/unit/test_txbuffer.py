import random
from typing import Any

import pytest

from tailrace.events import ChangeEvent
from tailrace_services.capture.changes import Change
from tailrace_services.capture.txbuffer import (
    SPILL_BLOCK,
    SPILL_BLOCK_BYTES,
    MemoryBudget,
    TransactionBuffer,
)


def test_spills_past_the_bound_and_keeps_order():
    buf = TransactionBuffer(max_in_memory=10)
    for i in range(1000):
        buf.append(ChangeEvent(table=f"t{i}"))
    assert len(buf) == 1000 and buf.spilled_bytes > 0
    assert [e.table for e in buf] == [f"t{i}" for i in range(1000)]
    buf.clear()
    assert len(buf) == 0 and list(buf) == []


@pytest.mark.parametrize("seed", [1, 2])
def test_spilled_changes_and_events_of_any_size_come_back_as_they_went_in(seed: int) -> None:
    rng = random.Random(seed)
    items: list[Change | ChangeEvent] = []
    for i in range(300):
        if rng.random() < 0.2:
            items.append(ChangeEvent(table=f"t{i}", ddl="x" * rng.randint(0, 300)))
        else:
            items.append(Change(*(rng.randbytes(rng.randint(0, 90)) for _ in range(2)),
                                rng.randint(0, 9), *(rng.randbytes(rng.randint(0, 200))
                                                     for _ in range(3))))
    buf = TransactionBuffer(max_in_memory=5)
    for item in items:
        buf.append(item)
    assert list(buf) == items
    assert list(buf) == items  # and again


def test_items_appended_after_a_read_follow_the_others() -> None:
    """Read back (whole or in part: a commit that failed midway), then appended to: the
    file's blocks stay in order, none overwritten."""
    buf = TransactionBuffer(max_in_memory=3)
    first = 3 + 2 * SPILL_BLOCK + 5  # three blocks in the file once read
    for i in range(first):
        buf.append(ChangeEvent(table=f"t{i}"))
    assert [e.table for e in buf][-1] == f"t{first - 1}"
    reading = iter(buf)  # stopped inside the first block: the file read up to the second
    assert [next(reading).table for _ in range(5)] == [f"t{i}" for i in range(5)]
    for i in range(first, first + SPILL_BLOCK + 2):
        buf.append(ChangeEvent(table=f"t{i}"))
    assert [e.table for e in buf] == [f"t{i}" for i in range(first + SPILL_BLOCK + 2)]
    assert len(buf) == first + SPILL_BLOCK + 2


def test_a_block_of_large_rows_is_written_before_it_holds_many() -> None:
    """The block waiting to be written is bounded by its rows' bytes, not only by count:
    a transaction of large rows holds a few of them in memory, not SPILL_BLOCK."""
    buf = TransactionBuffer(max_in_memory=0)
    big = Change(b"t", b"i|", 0, b"", b"r" * (1024 * 1024), b"k")
    for _ in range(10):
        buf.append(big)
        assert len(buf._block) * len(big.rows) <= SPILL_BLOCK_BYTES
    assert list(buf) == [big] * 10


def test_a_read_paused_while_blocks_are_written_goes_on_where_it_was() -> None:
    buf = TransactionBuffer(max_in_memory=0)
    for i in range(2 * SPILL_BLOCK):
        buf.append(ChangeEvent(table=f"t{i}"))
    first = iter(buf)
    assert next(first).table == "t0"
    assert [e.table for e in buf][-1] == f"t{2 * SPILL_BLOCK - 1}"  # a whole read between
    for i in range(2 * SPILL_BLOCK, 3 * SPILL_BLOCK):  # and a block written
        buf.append(ChangeEvent(table=f"t{i}"))
    assert [e.table for e in first] == [f"t{i}" for i in range(1, 2 * SPILL_BLOCK)]


class _FailingFile:
    """A spill file whose next write stops halfway, as a full disk would."""

    def __init__(self, file: Any) -> None:
        self.file, self.fail = file, True

    def write(self, data: bytes) -> int:
        if self.fail:
            self.fail = False
            self.file.write(data[:len(data) // 2])
            raise OSError(28, "No space left on device")
        return int(self.file.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


def test_a_block_that_failed_to_be_written_leaves_nothing_of_it_behind() -> None:
    buf = TransactionBuffer(max_in_memory=0)
    for i in range(SPILL_BLOCK):  # one block written
        buf.append(ChangeEvent(table=f"t{i}"))
    buf._file = _FailingFile(buf._file)  # type: ignore[assignment]
    with pytest.raises(OSError, match="No space"):
        for i in range(SPILL_BLOCK, 2 * SPILL_BLOCK):
            buf.append(ChangeEvent(table=f"t{i}"))
    buf.append(ChangeEvent(table="last"))  # the block is still held: written with it
    tables = [e.table for e in buf]
    assert tables == [f"t{i}" for i in range(2 * SPILL_BLOCK)] + ["last"]


def _events(first: int, count: int) -> list[ChangeEvent]:
    return [ChangeEvent(table=f"t{i}") for i in range(first, first + count)]


@pytest.mark.parametrize("keep", [0, 3, 7, 8, 9, SPILL_BLOCK + 2, SPILL_BLOCK + 8, 2 * SPILL_BLOCK + 12])
def test_truncate_keeps_the_first_items_wherever_they_are(keep: int) -> None:
    """In memory, in the file, in the block not written yet; what follows appends after."""
    buf = TransactionBuffer(max_in_memory=8)
    buf.append(_events(0, 1)[0])
    for event in _events(1, 2 * SPILL_BLOCK + 19):
        buf.append(event)
    buf.truncate(keep)
    assert len(buf) == keep
    for event in _events(100_000, 10):
        buf.append(event)
    expected = [f"t{i}" for i in range(keep)] + [f"t{i}" for i in range(100_000, 100_010)]
    assert [e.table for e in buf] == expected
    assert len(buf) == keep + 10
    assert (buf.spilled_bytes > 0) == (keep + 10 > 8)


def test_truncate_past_the_end_changes_nothing() -> None:
    buf = TransactionBuffer(max_in_memory=2)
    for event in _events(0, 5):
        buf.append(event)
    buf.truncate(5)
    buf.truncate(9)
    assert [e.table for e in buf] == [f"t{i}" for i in range(5)]


@pytest.mark.parametrize("keep", [9, SPILL_BLOCK + 2, SPILL_BLOCK + 8, 2 * SPILL_BLOCK + 12])
def test_truncate_after_a_read_cuts_the_file_at_its_block(keep: int) -> None:
    """A read writes the pending block; the cut then falls in the file, whose block it
    falls in is read back as the pending one: later appends and reads keep the order."""
    buf = TransactionBuffer(max_in_memory=8)
    for event in _events(0, 2 * SPILL_BLOCK + 19):
        buf.append(event)
    assert len(list(buf)) == 2 * SPILL_BLOCK + 19
    written = buf.spilled_bytes
    buf.truncate(keep)
    assert buf.spilled_bytes < written
    for event in _events(100_000, SPILL_BLOCK + 3):
        buf.append(event)
    buf.truncate(keep + 5)  # again, past a block written since
    expected = [f"t{i}" for i in range(keep)] + [f"t{i}" for i in range(100_000, 100_005)]
    assert [e.table for e in buf] == expected
    assert [e.table for e in buf] == expected  # (twice: each read has its own place)


def test_buffers_sharing_a_budget_hold_at_most_it_in_memory_together() -> None:
    budget = MemoryBudget(10)
    first, second = TransactionBuffer(budget=budget), TransactionBuffer(budget=budget)
    for event in _events(0, 6):
        first.append(event)
    for event in _events(6, 6):
        second.append(event)
    assert budget.left == 0
    assert first.spilled_bytes == 0 and second.spilled_bytes > 0  # its last two
    second.truncate(1)  # frees the memory of its cut items
    assert budget.left == 3
    first.clear()
    assert budget.left == 9
    for event in _events(20, 3):
        first.append(event)
    assert first.spilled_bytes == 0 and budget.left == 6
    assert [e.table for e in second] == ["t6"]
