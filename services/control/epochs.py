"""Epochs: cuts of the bus that never split a transaction, recorded by capture, read by delivery."""

from __future__ import annotations

import grpc

from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.storage import Storage


def _latest_key(source_id: str) -> str:
    return f"{source_id}::epoch::latest"


class EpochStore:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def record(self, epoch: pb.Epoch) -> None:
        """Keep the latest epoch; one whose offsets are behind the stored one is ignored, so the
        planned end of the bus never moves backwards."""
        latest = self.latest(epoch.source_id)
        if latest is not None and any(
                epoch.end_offsets.get(p, 0) < o for p, o in latest.end_offsets.items()):
            return
        self._storage.kv_put(_latest_key(epoch.source_id), epoch.SerializeToString())

    def latest(self, source_id: str) -> pb.Epoch | None:
        found = self._storage.kv_get(_latest_key(source_id))
        return pb.Epoch.FromString(found[0]) if found else None


class EpochsServicer(rpc.EpochsServicer):
    def __init__(self, store: EpochStore) -> None:
        self._store = store

    def Record(self, request: pb.Epoch, context: grpc.ServicerContext) -> pb.RecordEpochResponse:
        if not request.source_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "epoch.source_id is required")
        self._store.record(request)
        return pb.RecordEpochResponse()

    def Latest(self, request: pb.LatestEpochRequest, context: grpc.ServicerContext
               ) -> pb.LatestEpochResponse:
        epoch = self._store.latest(request.source_id)
        return pb.LatestEpochResponse(found=epoch is not None, epoch=epoch)
