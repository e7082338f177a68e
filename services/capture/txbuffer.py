"""A whole source transaction, held until its commit; spills to a file past a bound.

Capture services publish only complete transactions, so a 1 GB transaction
must not need 1 GB of RAM: past `max_in_memory` items the rest goes to an
anonymous temp file and is read back in order. It is written a block at a time
(SPILL_BLOCK items, or about SPILL_BLOCK_BYTES), each block one marshalled list behind
its length: a `Change` as the tuple of its fields, an event as its serialized bytes.
(Field by field, a read or write each, it had been a third of capture's CPU in a bulk.)

Buffers may share a `MemoryBudget`: PostgreSQL streams several open transactions at once
(`capture_postgres/events.py`), and together they hold at most the budget in memory.
"""

from __future__ import annotations

import marshal
import os
import struct
import tempfile
from collections.abc import Iterator
from typing import IO

from tailrace.proto.event_pb2 import ChangeEvent
from tailrace_services.capture.changes import Change

SPILL_BLOCK = 4096  # items a block of the spill file holds, at most
# ...and the bytes of their rows, keys and positions (an event: its serialized size); a
# block may pass it by one item
SPILL_BLOCK_BYTES = 4 * 1024 * 1024

_Spilled = tuple[bytes, bytes, int, bytes, bytes, bytes] | bytes  # a change's fields, an event
_BLOCK_LEN = struct.Struct("<Q")  # a block's marshalled size, before it


class MemoryBudget:
    """Items the buffers that share it hold in memory, together: at most `items`."""

    def __init__(self, items: int) -> None:
        self.left = items


class TransactionBuffer:
    """The items of one transaction, in order. Read it (`iter`) at the commit; appending
    after a read, or reading again, keeps the order (each read has its own place in the
    file). In memory until its budget (its own `max_in_memory`, or a shared one) is spent,
    then in the file from there on."""

    def __init__(self, max_in_memory: int = 10_000, spill_dir: str | None = None, *,
                 budget: MemoryBudget | None = None) -> None:
        self._budget = budget if budget is not None else MemoryBudget(max_in_memory)
        self._spill_dir = spill_dir
        self._memory: list[Change | ChangeEvent] = []
        self._file: IO[bytes] | None = None
        self._blocks: list[tuple[int, int]] = []  # each written block: its offset, its items
        self._block: list[_Spilled] = []  # past the bound, not written yet
        self._block_bytes = 0  # its size, as SPILL_BLOCK_BYTES counts it
        self._spilled = 0  # items past the bound, written or not
        self._written = 0  # bytes of the spill file

    def __len__(self) -> int:
        return len(self._memory) + self._spilled

    @property
    def spilled_bytes(self) -> int:
        """Bytes spilled: the file's, and about those of the block not written yet."""
        return self._written + self._block_bytes

    def append(self, item: Change | ChangeEvent) -> None:
        budget = self._budget
        if budget.left > 0 and not self._spilled:
            budget.left -= 1
            self._memory.append(item)
            return
        spilled: _Spilled = tuple(item) if isinstance(item, Change) \
            else item.SerializeToString()  # type: ignore[assignment]
        self._block.append(spilled)
        self._block_bytes += _spilled_size(spilled)
        self._spilled += 1
        if len(self._block) >= SPILL_BLOCK or self._block_bytes >= SPILL_BLOCK_BYTES:
            self._write_block()

    def _write_block(self) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="tailrace-tx-", dir=self._spill_dir)  # noqa: SIM115
        data = marshal.dumps(self._block)
        end = self._file.seek(0, os.SEEK_END)  # (a read may have left it elsewhere)
        try:
            self._file.write(_BLOCK_LEN.pack(len(data)))
            self._file.write(data)
            self._file.flush()  # a full disk fails here, not in a later read
        except BaseException:
            self._file.truncate(end)  # no part of a block left for a read to stop on
            raise
        self._blocks.append((end, len(self._block)))
        self._written += _BLOCK_LEN.size + len(data)
        self._block, self._block_bytes = [], 0

    def __iter__(self) -> Iterator[Change | ChangeEvent]:
        """The items in the order appended: memory first, then the spill file."""
        yield from self._memory
        if not self._spilled:
            return
        if self._block:
            self._write_block()  # read back with the rest: the order stays the file's
        assert self._file is not None
        file, offset, left = self._file, 0, self._spilled
        while left > 0:
            file.seek(offset)  # this read's place (another may have moved the file's)
            (size,) = _BLOCK_LEN.unpack(file.read(_BLOCK_LEN.size))
            block: list[_Spilled] = marshal.loads(file.read(size))
            offset += _BLOCK_LEN.size + size
            left -= len(block)
            for item in block:
                yield Change._make(item) if isinstance(item, tuple) \
                    else ChangeEvent.FromString(item)
        if left:
            raise RuntimeError(f"the spill file held {-left} item(s) more than were spilled")

    def truncate(self, size: int) -> None:
        """Keep the first `size` items (a streamed transaction's rolled-back savepoint): the
        file is cut at the block the cut falls in, whose kept items are pending again."""
        if size >= len(self):
            return
        if size <= len(self._memory):
            self._budget.left += len(self._memory) - size
            del self._memory[size:]
            self._drop_spill()
            return
        keep = size - len(self._memory)  # of the spilled items
        in_file = self._spilled - len(self._block)
        if keep >= in_file:  # the cut is in the block not written yet
            del self._block[keep - in_file:]
        else:
            assert self._file is not None
            index = seen = 0  # the block the cut falls in, the items before it
            while seen + self._blocks[index][1] <= keep:
                seen += self._blocks[index][1]
                index += 1
            offset = self._blocks[index][0]
            self._file.seek(offset)
            (length,) = _BLOCK_LEN.unpack(self._file.read(_BLOCK_LEN.size))
            block: list[_Spilled] = marshal.loads(self._file.read(length))
            self._file.truncate(offset)
            del self._blocks[index:]
            self._written = offset
            self._block = block[:keep - seen]
        self._block_bytes = sum(map(_spilled_size, self._block))
        self._spilled = keep

    def _drop_spill(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._blocks = []
        self._block, self._block_bytes = [], 0
        self._spilled = 0
        self._written = 0

    def clear(self) -> None:
        self._budget.left += len(self._memory)
        self._memory = []
        self._drop_spill()


def _spilled_size(item: _Spilled) -> int:
    """What SPILL_BLOCK_BYTES counts of an item: a change's rows, key and position, an
    event's serialized bytes."""
    if isinstance(item, bytes):
        return len(item)
    return len(item[4]) + len(item[5]) + len(item[3])
