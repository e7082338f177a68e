"""The sink contract: write a batch in order and return, or raise a classified error.

A sink never commits checkpoints; the runtime does, after the sink returned.
Errors are `tailrace.errors.RetryableError` (back off, try again),
`NonRetryableError` (fail now) or `FatalError` (stop the pipeline).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from tailrace.proto.event_pb2 import ChangeEvent


class Sink(ABC):
    id: str
    required: bool

    def open(self) -> None:  # noqa: B027 - optional set-up
        """Connect and check the destination (called once per worker before the first write)."""

    @abstractmethod
    def write(self, events: Sequence[ChangeEvent]) -> None:
        """Deliver `events` in the given order; return only once the destination acknowledged."""

    def close(self) -> None:  # noqa: B027 - optional
        pass
