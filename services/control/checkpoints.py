"""Checkpoints: one per sink, moved only by compare-and-set and only forwards."""

from __future__ import annotations

import time

import grpc

from tailrace.events import position_key
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.storage import CasConflict, Storage


def checkpoint_key(source_id: str, sink_id: str) -> str:
    return f"{source_id}::sink::{sink_id}"


class CheckpointStore:
    """The logic behind the Checkpoints service, usable without gRPC."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def get(self, source_id: str, sink_id: str) -> pb.Checkpoint | None:
        found = self._storage.kv_get(checkpoint_key(source_id, sink_id))
        if found is None:
            return None
        cp = pb.Checkpoint.FromString(found[0])
        cp.version = found[1]
        return cp

    def commit(self, cp: pb.Checkpoint, expected_version: int) -> tuple[bool, pb.Checkpoint | None]:
        """Store `cp` if the stored version is `expected_version` and it does not go backwards."""
        current = self.get(cp.source_id, cp.sink_id)
        if current is not None and position_key(cp.position) < position_key(current.position):
            return False, current
        stored = pb.Checkpoint()
        stored.CopyFrom(cp)
        stored.updated_unix_ms = int(time.time() * 1000)
        stored.version = 0
        try:
            (version,) = self._storage.kv_cas(
                [(checkpoint_key(cp.source_id, cp.sink_id), stored.SerializeToString(),
                  expected_version)])
        except CasConflict:
            return False, self.get(cp.source_id, cp.sink_id)
        stored.version = version
        return True, stored

    def list(self, source_id: str) -> list[pb.Checkpoint]:
        prefix = f"{source_id}::sink::" if source_id else ""
        out = []
        for key, value, version in self._storage.kv_scan(prefix):
            if "::sink::" not in key:
                continue
            cp = pb.Checkpoint.FromString(value)
            cp.version = version
            out.append(cp)
        return out

    def minimum(self, source_id: str, sink_ids: list[str]) -> pb.Checkpoint | None:
        """The least advanced of the given sinks; None if any has no checkpoint yet."""
        cps = [self.get(source_id, s) for s in sink_ids]
        if not cps or any(cp is None for cp in cps):
            return None
        return min(cps, key=lambda cp: position_key(cp.position))  # type: ignore[arg-type,return-value]


class CheckpointsServicer(rpc.CheckpointsServicer):
    def __init__(self, store: CheckpointStore) -> None:
        self._store = store

    def Get(self, request: pb.CheckpointRef, context: grpc.ServicerContext
            ) -> pb.GetCheckpointResponse:
        cp = self._store.get(request.source_id, request.sink_id)
        return pb.GetCheckpointResponse(found=cp is not None, checkpoint=cp)

    def Commit(self, request: pb.CommitCheckpointRequest, context: grpc.ServicerContext
               ) -> pb.CommitCheckpointResponse:
        cp = request.checkpoint
        if not cp.source_id or not cp.sink_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "checkpoint.source_id and checkpoint.sink_id are required")
        committed, current = self._store.commit(cp, request.expected_version)
        return pb.CommitCheckpointResponse(committed=committed, current=current)

    def List(self, request: pb.ListCheckpointsRequest, context: grpc.ServicerContext
             ) -> pb.ListCheckpointsResponse:
        return pb.ListCheckpointsResponse(checkpoints=self._store.list(request.source_id))

    def Minimum(self, request: pb.MinimumCheckpointRequest, context: grpc.ServicerContext
                ) -> pb.MinimumCheckpointResponse:
        cp = self._store.minimum(request.source_id, list(request.sink_ids))
        return pb.MinimumCheckpointResponse(found=cp is not None, checkpoint=cp)
