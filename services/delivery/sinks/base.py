"""The sink contract: write a batch in order and acknowledge, or raise a Tailrace error.

A sink's whole job:
- `open()`: connect and check the destination (create the stream, the table, ...);
- `write(events, commit)`: deliver `events` in the given order and return only once
  the destination acknowledged them. `commit` says which checkpoint the batch ends
  at; a sink that can store it atomically with the data (Kafka transaction, Redis
  MULTI/EXEC, PostgreSQL transaction) does so, which makes it exactly-once
  (`exactly_once.ExactlyOnceSink`);
- `stored_position()`: for such sinks, the checkpoint kept beside the data, read
  back at start so a crash between the sink's commit and the control-service
  checkpoint cannot duplicate. It is named by the control checkpoint's rewind
  generation (`BatchCommit.rewind`, `_common.checkpoint_name`): after an operator's
  rewind or reset the sink starts a new one, so it receives again what it had.
A sink never commits control-service checkpoints; the runtime does, after it returned.

Errors: one vocabulary, `tailrace.errors`. A sink turns its client's exceptions into
`RetryableError` (back off and retry), `NonRetryableError` (this batch cannot go until
someone fixes the cause: auth, a missing privilege; `PerEventError` when only some
events cannot), `FatalError` (stop the pipeline: a fenced producer) or `ConfigError`
(the spec asks for something the client refuses: stop the pipeline, exit 2), with a
message naming the sink and the fix. Each sink keeps its client's table in one
function (`classify_kafka`, ...) that answers with the class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from tailrace.errors import (
    ConfigError,
    FatalError,
    NonRetryableError,
    RetryableError,
    TailraceError,
)
from tailrace.proto.event_pb2 import ChangeEvent, Position

# The four classes a sink's error is one of, the most severe first.
CLASSES: tuple[type[TailraceError], ...] = (ConfigError, FatalError, NonRetryableError,
                                            RetryableError)

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
    # The control checkpoint's rewind generation: a sink that stores its checkpoint beside
    # the data keeps one per generation, so a rewound sink does not skip what it had.
    rewind: int = 0
    # Where such a sink's stored checkpoint is at least: what it acknowledged storing
    # (the control checkpoint's `sink_stored`, then each batch of the slice it wrote).
    # Found behind, the sink lost acknowledged writes (`exactly_once.SinkLostWrites`).
    floor: Position | None = None
    # The events written with it ascend by position, each position once: set by the
    # fan-out for what `fanout._pending` kept of a batch (and what it writes again without
    # dead letters). An exactly-once sink then finds those past its stored checkpoint by
    # bisection (`_common.fresh_indexes`); without it, by reading every event's position.
    ascending: bool = False


class PerEventError(NonRetryableError):
    """Some events of the batch can never be written (too large, cannot be serialized or
    routed); `failures` holds `(index in the batch, reason)`. Nothing of the batch was
    committed by an exactly-once sink; the runtime may dead-letter those events and write
    the rest again."""

    def __init__(self, message: str, failures: list[tuple[int, str]]) -> None:
        super().__init__(message)
        self.failures = failures


def error_class(error: BaseException) -> type[TailraceError]:
    """Which of the four classes `error` is: a Tailrace error its own; OS-level connection
    trouble retryable; anything else (a bug, an unexpected client error) non-retryable."""
    for cls in CLASSES:
        if isinstance(error, cls):
            return cls
    if isinstance(error, ConnectionError | TimeoutError):
        return RetryableError
    return NonRetryableError


def class_name(cls: type[TailraceError]) -> str:
    """How outcomes, logs and health name a class: retryable, non_retryable, fatal, config."""
    return {RetryableError: "retryable", NonRetryableError: "non_retryable",
            FatalError: "fatal", ConfigError: "config"}[cls]


class Sink(ABC):
    id: str
    required: bool
    retry: RetryPolicy = RetryPolicy()
    _opened: bool = False  # set by delivery's fan-out once `open` ran in this worker

    def open(self) -> None:  # noqa: B027 - optional set-up
        """Connect and check the destination (once per worker, before the first write)."""

    @abstractmethod
    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        """Deliver `events` in the given order; return only once the destination acknowledged."""

    def per_event_failures(self, events: Sequence[ChangeEvent]) -> list[tuple[int, str]]:
        """What `write` would refuse of `events` one by one (`PerEventError.failures`),
        without writing: the checks that can be made again and give the same answer. Used
        after a crash, for the events the sink holds past the control service's checkpoint
        (their dead letters may have been lost with the task, `fanout`)."""
        return []

    def stored_position(self, partition: int = 0, rewind: int = 0) -> Position | None:
        """The checkpoint stored with the data for rewind generation `rewind`, for
        exactly-once sinks; None otherwise."""
        return None

    def start_partition(self, partition: int, kept: bool) -> None:  # noqa: B027 - optional
        """Before a batch of bus partition `partition` in this Python worker. `kept`: this
        worker delivered the partition's last batch in this query, and nothing came in
        between (`handoff.BatchHandoff.continues`); else another worker or attempt may have
        written it since, and what this sink kept of it (the Kafka sink's transactional
        producer) goes. The connections stay."""

    def close(self) -> None:  # noqa: B027 - optional
        pass
