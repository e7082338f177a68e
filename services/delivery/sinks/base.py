"""The sink contract: write a batch in order and acknowledge, or raise a classified error.

A sink's whole job:
- `open()`: connect and check the destination (create the stream, the table, ...);
- `write(events, commit)`: deliver `events` in the given order and return only once
  the destination acknowledged them. `commit` says which checkpoint the batch ends
  at; a sink that can store it atomically with the data (Kafka transaction, Redis
  MULTI/EXEC, PostgreSQL transaction) does so, which makes it exactly-once;
- `stored_position()`: for such sinks, the checkpoint kept beside the data, read
  back at start so a crash between the sink's commit and the control-service
  checkpoint cannot duplicate;
- `classify(error)`: retryable / non-retryable / fatal.
A sink never commits control-service checkpoints; the runtime does, after it returned.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from tailrace.errors import FatalError, NonRetryableError, RetryableError
from tailrace.proto.event_pb2 import ChangeEvent, Position


class ErrorClass(enum.Enum):
    RETRYABLE = "retryable"
    NON_RETRYABLE = "non_retryable"
    FATAL = "fatal"


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: base, cap and number of attempts."""

    base_s: float = 0.05
    max_s: float = 5.0
    attempts: int = 3


@dataclass(frozen=True)
class BatchCommit:
    """Where the batch ends: what an exactly-once sink stores with the data."""

    pipeline: str
    source_id: str
    sink_id: str
    position: Position
    bus_offsets: dict[int, int] = field(default_factory=dict)
    # The bus partition the slice came from. With `bus.partitions` > 1 every partition is
    # written on its own, so exactly-once sinks keep one checkpoint (and Kafka one
    # transactional.id) per partition; non-sharded pipelines always use 0.
    partition: int = 0


class PerEventError(NonRetryableError):
    """Some events of the batch can never be written (too large, cannot be serialized or
    routed); `failures` holds `(index in the batch, reason)`. Nothing of the batch was
    committed by an exactly-once sink; the runtime may dead-letter those events and write
    the rest again."""

    def __init__(self, message: str, failures: list[tuple[int, str]]) -> None:
        super().__init__(message)
        self.failures = failures


def classify_default(error: BaseException) -> ErrorClass:
    """Tailrace errors by their class; OS-level connection trouble is retryable; else not."""
    if isinstance(error, FatalError):
        return ErrorClass.FATAL
    if isinstance(error, NonRetryableError):
        return ErrorClass.NON_RETRYABLE
    if isinstance(error, RetryableError | ConnectionError | TimeoutError):
        return ErrorClass.RETRYABLE
    return ErrorClass.NON_RETRYABLE


class Sink(ABC):
    id: str
    required: bool
    retry: RetryPolicy = RetryPolicy()

    def open(self) -> None:  # noqa: B027 - optional set-up
        """Connect and check the destination (once per worker, before the first write)."""

    @abstractmethod
    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        """Deliver `events` in the given order; return only once the destination acknowledged."""

    def stored_position(self, partition: int = 0) -> Position | None:
        """The checkpoint stored with the data, for exactly-once sinks; None otherwise."""
        return None

    def classify(self, error: BaseException) -> ErrorClass:
        """Default mapping from the error hierarchy; sinks refine it for their client's errors."""
        return classify_default(error)

    def close(self) -> None:  # noqa: B027 - optional
        pass
