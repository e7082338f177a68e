"""The pipeline's snapshot record in the control service, and a table's rows/s."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tailrace.config import PipelineSpec
from tailrace.control_client import ControlClient
from tailrace.errors import RetryableError
from tailrace.proto import control_pb2 as pb

__all__ = ["ACTIVE", "Progress", "SnapshotProgress"]

PROGRESS_LOG_S = 5.0


class SnapshotProgress:
    """The pipeline's snapshot record in the control service, changed by compare-and-set."""

    def __init__(self, control: ControlClient, pipeline: PipelineSpec, source_type: str
                 ) -> None:
        self.control = control
        self.pipeline = pipeline
        self.source_type = source_type

    def read(self) -> pb.SnapshotState:
        return self.control.snapshot_state(self.pipeline.name)

    def change(self, edit: Callable[[pb.SnapshotState], None]) -> pb.SnapshotState:
        for _ in range(20):
            current = self.read()
            state = pb.SnapshotState()
            state.CopyFrom(current)
            state.pipeline = self.pipeline.name
            state.source_id = self.pipeline.spec.source.id
            state.source_type = self.source_type
            if not state.next_request_id:
                state.next_request_id = 1
            edit(state)
            answer = self.control.update_snapshot(state, current.version)
            if answer.updated:
                return answer.state
        raise RetryableError("the snapshot record kept changing while capture updated it")

    def table(self, state: pb.SnapshotState, name: str) -> pb.SnapshotTable | None:
        return next((t for t in state.tables if t.table == name), None)


ACTIVE = (pb.SNAPSHOT_PENDING, pb.SNAPSHOT_RUNNING)


@dataclass
class Progress:
    """Rows done and the rate over the last few seconds, for status, metrics and logs."""

    rows: int
    estimate: int
    rate: float = 0.0
    _since: float = field(default_factory=time.monotonic)
    _rows_since: int = 0

    _logged: float = field(default_factory=time.monotonic)

    def add(self, rows: int) -> None:
        self.rows += rows
        self._rows_since += rows
        now = time.monotonic()
        if now - self._since >= 1.0:
            self.rate = self._rows_since / (now - self._since)
            self._since, self._rows_since = now, 0

    def log_due(self) -> bool:
        """True every PROGRESS_LOG_S (a log line every few seconds)."""
        now = time.monotonic()
        if now - self._logged < PROGRESS_LOG_S:
            return False
        self._logged = now
        return True
