"""A whole source transaction, held until its commit; spills to a file past a bound.

Capture services publish only complete transactions, so a 1 GB transaction
must not need 1 GB of RAM: past `max_in_memory` changes the rest goes to an
anonymous temp file and is read back in order: an event as its length-prefixed
protobuf, a `Change` as its length-prefixed parts.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterator
from typing import IO

from tailrace.proto.event_pb2 import ChangeEvent
from tailrace_services.capture.changes import Change

_LEN = struct.Struct("<I")
_CHANGE_LENS = struct.Struct("<BIIIII")  # source_field, then the sizes of the bytes parts
_EVENT, _CHANGE = b"E", b"C"


class TransactionBuffer:
    def __init__(self, max_in_memory: int = 10_000, spill_dir: str | None = None) -> None:
        self._max = max_in_memory
        self._spill_dir = spill_dir
        self._memory: list[Change | ChangeEvent] = []
        self._file: IO[bytes] | None = None
        self._spilled = 0
        self.spilled_bytes = 0

    def __len__(self) -> int:
        return len(self._memory) + self._spilled

    def append(self, item: Change | ChangeEvent) -> None:
        if len(self._memory) < self._max and self._file is None:
            self._memory.append(item)
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="tailrace-tx-", dir=self._spill_dir)  # noqa: SIM115
        if isinstance(item, Change):
            parts = (item.template, item.ident, item.at, item.rows, item.key)
            data = b"".join((_CHANGE, _CHANGE_LENS.pack(item.source_field,
                                                        *(len(p) for p in parts)), *parts))
        else:
            event = item.SerializeToString()
            data = b"".join((_EVENT, _LEN.pack(len(event)), event))
        self._file.write(data)
        self._spilled += 1
        self.spilled_bytes += len(data)

    def __iter__(self) -> Iterator[Change | ChangeEvent]:
        """Events in the order appended: memory first, then the spill file."""
        yield from self._memory
        if self._file is None:
            return
        self._file.flush()
        self._file.seek(0)
        read = self._file.read
        for _ in range(self._spilled):
            if read(1) == _EVENT:
                (size,) = _LEN.unpack(read(_LEN.size))
                yield ChangeEvent.FromString(read(size))
                continue
            source_field, *sizes = _CHANGE_LENS.unpack(read(_CHANGE_LENS.size))
            template, ident, at, rows, key = (read(size) for size in sizes)
            yield Change(template, ident, source_field, at, rows, key)

    def clear(self) -> None:
        self._memory = []
        if self._file is not None:
            self._file.close()
            self._file = None
        self._spilled = 0
        self.spilled_bytes = 0
