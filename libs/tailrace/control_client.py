"""The gRPC client capture and delivery use to reach the control service."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from tailrace.errors import RetryableError
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc

T = TypeVar("T")
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class ControlClient:
    """Thin, typed wrapper; transient failures are retried for up to `retry_for` seconds."""

    def __init__(self, address: str, timeout: float = 10.0, retry_for: float = 30.0) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(address)
        self._checkpoints = rpc.CheckpointsStub(self._channel)
        self._epochs = rpc.EpochsStub(self._channel)
        self._timeout = timeout
        self._retry_for = retry_for

    def close(self) -> None:
        self._channel.close()

    def _call(self, what: str, fn: Callable[..., T], request: object) -> T:
        deadline = time.monotonic() + self._retry_for
        delay = 0.1
        while True:
            try:
                return fn(request, timeout=self._timeout)
            except grpc.RpcError as e:
                code = e.code()  # type: ignore[attr-defined]
                if code not in _RETRYABLE or time.monotonic() > deadline:
                    raise RetryableError(
                        f"control service at {self.address}: {what} failed: {code.name}: "
                        f"{e.details()}") from None  # type: ignore[attr-defined]
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # checkpoints
    def get_checkpoint(self, source_id: str, sink_id: str) -> pb.Checkpoint | None:
        r = self._call("get checkpoint", self._checkpoints.Get,
                       pb.CheckpointRef(source_id=source_id, sink_id=sink_id))
        return r.checkpoint if r.found else None

    def commit_checkpoint(self, cp: pb.Checkpoint, expected_version: int
                          ) -> tuple[bool, pb.Checkpoint]:
        r = self._call("commit checkpoint", self._checkpoints.Commit,
                       pb.CommitCheckpointRequest(checkpoint=cp,
                                                  expected_version=expected_version))
        return r.committed, r.current

    def list_checkpoints(self, source_id: str = "") -> list[pb.Checkpoint]:
        r = self._call("list checkpoints", self._checkpoints.List,
                       pb.ListCheckpointsRequest(source_id=source_id))
        return list(r.checkpoints)

    def minimum_checkpoint(self, source_id: str, sink_ids: list[str]) -> pb.Checkpoint | None:
        r = self._call("minimum checkpoint", self._checkpoints.Minimum,
                       pb.MinimumCheckpointRequest(source_id=source_id, sink_ids=sink_ids))
        return r.checkpoint if r.found else None

    # epochs
    def record_epoch(self, epoch: pb.Epoch) -> None:
        self._call("record epoch", self._epochs.Record, epoch)

    def latest_epoch(self, source_id: str) -> pb.Epoch | None:
        r = self._call("latest epoch", self._epochs.Latest,
                       pb.LatestEpochRequest(source_id=source_id))
        return r.epoch if r.found else None
