"""A whole source transaction, held until its commit; spills to a file past a bound.

Capture services publish only complete transactions, so a 1 GB transaction
must not need 1 GB of RAM: past `max_in_memory` events the rest goes to an
anonymous temp file as length-prefixed protobufs and is read back in order.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterator
from typing import IO

from tailrace.proto.event_pb2 import ChangeEvent

_LEN = struct.Struct("<I")


class TransactionBuffer:
    def __init__(self, max_in_memory: int = 10_000, spill_dir: str | None = None) -> None:
        self._max = max_in_memory
        self._spill_dir = spill_dir
        self._memory: list[ChangeEvent] = []
        self._file: IO[bytes] | None = None
        self._spilled = 0
        self.spilled_bytes = 0

    def __len__(self) -> int:
        return len(self._memory) + self._spilled

    def append(self, event: ChangeEvent) -> None:
        if len(self._memory) < self._max and self._file is None:
            self._memory.append(event)
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="tailrace-tx-", dir=self._spill_dir)  # noqa: SIM115
        data = event.SerializeToString()
        self._file.write(_LEN.pack(len(data)))
        self._file.write(data)
        self._spilled += 1
        self.spilled_bytes += len(data) + _LEN.size

    def __iter__(self) -> Iterator[ChangeEvent]:
        """Events in the order appended: memory first, then the spill file."""
        yield from self._memory
        if self._file is None:
            return
        self._file.flush()
        self._file.seek(0)
        read = self._file.read
        for _ in range(self._spilled):
            (size,) = _LEN.unpack(read(_LEN.size))
            yield ChangeEvent.FromString(read(size))

    def clear(self) -> None:
        self._memory = []
        if self._file is not None:
            self._file.close()
            self._file = None
        self._spilled = 0
        self.spilled_bytes = 0
