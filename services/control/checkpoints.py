"""Checkpoints: one per sink, moved only by compare-and-set, only forwards, and never past
what capture published.

A checkpoint tells capture how much source log it may release (a PostgreSQL slot is
confirmed up to the minimum checkpoint) and delivery where to resume on the bus. One
past the latest epoch that capture recorded names changes that were never published:
accepting it would let the source discard them. So a commit whose position or bus
offsets are beyond the source's latest epoch is refused (`FailedPrecondition`).
"""

from __future__ import annotations

import builtins
import time

import grpc

from tailrace.events import position_key
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.epochs import EpochStore
from tailrace_services.control.status import FailedPrecondition, InvalidArgument
from tailrace_services.control.storage import CasConflict, Storage


def checkpoint_key(source_id: str, sink_id: str) -> str:
    return f"{source_id}::sink::{sink_id}"


def detached_key(source_id: str, sink_id: str) -> str:
    return f"{source_id}::detached::{sink_id}"


def describe(cp: pb.Checkpoint | None) -> str:
    if cp is None:
        return "none"
    return f"tx {cp.position.tx_seq}.{cp.position.event_index} (version {cp.version})"


class CheckpointConflict(Exception):
    """A checkpoint is not at the version the caller read, or would move backwards."""

    def __init__(self, sink_id: str, current: pb.Checkpoint | None, reason: str) -> None:
        self.sink_id, self.current = sink_id, current
        super().__init__(reason)


class CheckpointStore:
    """The logic behind the Checkpoints service, usable without gRPC."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._epochs = EpochStore(storage)

    def get(self, source_id: str, sink_id: str) -> pb.Checkpoint | None:
        found = self._storage.kv_get(checkpoint_key(source_id, sink_id))
        if found is None:
            return None
        cp = pb.Checkpoint.FromString(found[0])
        cp.version = found[1]
        return cp

    def commit(self, cp: pb.Checkpoint, expected_version: int) -> tuple[bool, pb.Checkpoint | None]:
        """Store `cp` if the stored version is `expected_version` and it does not go backwards."""
        try:
            (stored,) = self.commit_many([(cp, expected_version)])
        except CheckpointConflict as e:
            return False, e.current
        return True, stored

    def commit_many(self, items: list[tuple[pb.Checkpoint, int]],
                    guard: tuple[str, bytes, int] | None = None) -> list[pb.Checkpoint]:
        """Advance several checkpoints in one multi-key compare-and-set: all or none.

        Raises `CheckpointConflict` naming the first checkpoint that is not at the expected
        version or that would move backwards. `guard` (key, value, expected version) is
        rewritten in the same compare-and-set; if it moved, `CasConflict` for its key is
        raised and nothing is stored (the delivery owner record fences zombies this way).
        """
        now = int(time.time() * 1000)
        writes, stored = [], []
        for cp, _ in items:
            self._refuse_unpublished(cp)
        for cp, expected in items:
            current = self.get(cp.source_id, cp.sink_id)
            if current is not None and current.version == expected and (
                    position_key(cp.position) < position_key(current.position)):
                raise CheckpointConflict(
                    cp.sink_id, current,
                    f"checkpoint of sink {cp.sink_id} would move backwards from "
                    f"{describe(current)} to tx {cp.position.tx_seq}.{cp.position.event_index}")
            new = _stamped(cp, now)
            writes.append((checkpoint_key(cp.source_id, cp.sink_id), new.SerializeToString(),
                           expected))
            stored.append(new)
        try:
            versions = self._storage.kv_cas(writes + ([guard] if guard else []))
        except CasConflict as e:
            if guard is not None and e.key == guard[0]:
                raise
            source_id, _, sink_id = e.key.partition("::sink::")
            current = self.get(source_id, sink_id)
            raise CheckpointConflict(
                sink_id, current,
                f"checkpoint of sink {sink_id} is at version {e.actual}, not {e.expected} as "
                "read: another delivery process moved it") from None
        for cp, version in zip(stored, versions[:len(stored)], strict=True):
            cp.version = version
        return stored

    def _refuse_unpublished(self, cp: pb.Checkpoint) -> None:
        if position_key(cp.position) == (0, 0) and not any(cp.bus_offsets.values()):
            return  # the origin: names nothing (delivery may commit it before any epoch)
        latest = self._epochs.latest(cp.source_id)
        where = f"tx {cp.position.tx_seq}.{cp.position.event_index}"
        if latest is None:
            raise FailedPrecondition(
                f"checkpoint of sink {cp.sink_id} at {where}: source {cp.source_id} has "
                "recorded no epoch yet, so nothing it names was published; checkpoints follow "
                "the epochs capture records")
        if cp.bus_generation > latest.bus_generation:
            raise FailedPrecondition(
                f"checkpoint of sink {cp.sink_id} at {where} is of bus generation "
                f"{cp.bus_generation}, past the latest epoch's ({latest.bus_generation}) of "
                f"source {cp.source_id}: it names a bus that was never published")
        # offsets of an older generation name a bus that is gone: only the position counts
        same_bus = cp.bus_generation == latest.bus_generation
        beyond = [f"partition {p} offset {o} > {latest.end_offsets.get(p, 0)}"
                  for p, o in sorted(cp.bus_offsets.items())
                  if same_bus and o > latest.end_offsets.get(p, 0)]
        highest = self._epochs.highest(cp.source_id) or latest.position
        if position_key(cp.position) > position_key(highest) or beyond:
            raise FailedPrecondition(
                f"checkpoint of sink {cp.sink_id} at {where}"
                f"{' (' + ', '.join(beyond) + ')' if beyond else ''} is beyond the latest epoch "
                f"of source {cp.source_id} (epoch {latest.epoch_id} at tx "
                f"{latest.position.tx_seq}.{latest.position.event_index}): it names changes "
                "that were never published, and accepting it would let the source discard them")

    def overwrite(self, cp: pb.Checkpoint, expected_version: int) -> pb.Checkpoint:
        """Set a checkpoint backwards (admin rewind/reset); still compare-and-set on the version."""
        new = _stamped(cp, int(time.time() * 1000))
        try:
            (new.version,) = self._storage.kv_cas(
                [(checkpoint_key(cp.source_id, cp.sink_id), new.SerializeToString(),
                  expected_version)])
        except CasConflict as e:
            raise CheckpointConflict(cp.sink_id, self.get(cp.source_id, cp.sink_id),
                                     f"checkpoint of sink {cp.sink_id} moved while rewinding "
                                     f"(version {e.actual}); try again") from None
        return new

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

    def minimum(self, source_id: str, sink_ids: builtins.list[str]  # `list` is a method here
                ) -> pb.Checkpoint | None:
        """The least advanced of the given sinks that are not detached; None if any has no
        checkpoint yet."""
        cps = [self.get(source_id, s) for s in sink_ids if self.detached(source_id, s) is None]
        found = [cp for cp in cps if cp is not None]
        if not cps or len(found) < len(cps):
            return None
        return min(found, key=lambda cp: position_key(cp.position))


    def detached(self, source_id: str, sink_id: str) -> pb.SinkDetached | None:
        """Why the sink no longer holds the source's log back (retention.py), if it does not."""
        found = self._storage.kv_get(detached_key(source_id, sink_id))
        return pb.SinkDetached.FromString(found[0]) if found and found[0] else None

    def detach(self, record: pb.SinkDetached) -> None:
        self._storage.kv_put(detached_key(record.source_id, record.sink_id),
                             record.SerializeToString())

    def attach(self, source_id: str, sink_id: str) -> None:
        self._storage.kv_put(detached_key(source_id, sink_id), b"")  # empty: attached


def _stamped(cp: pb.Checkpoint, now_ms: int) -> pb.Checkpoint:
    new = pb.Checkpoint()
    new.CopyFrom(cp)
    new.updated_unix_ms = now_ms
    new.version = 0
    return new


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
            raise InvalidArgument("checkpoint.source_id and checkpoint.sink_id are required")
        committed, current = self._store.commit(cp, request.expected_version)
        return pb.CommitCheckpointResponse(committed=committed, current=current)

    def List(self, request: pb.ListCheckpointsRequest, context: grpc.ServicerContext
             ) -> pb.ListCheckpointsResponse:
        return pb.ListCheckpointsResponse(checkpoints=self._store.list(request.source_id))

    def Minimum(self, request: pb.MinimumCheckpointRequest, context: grpc.ServicerContext
                ) -> pb.MinimumCheckpointResponse:
        cp = self._store.minimum(request.source_id, list(request.sink_ids))
        return pb.MinimumCheckpointResponse(found=cp is not None, checkpoint=cp)
