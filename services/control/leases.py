"""Leases: one active capture per source and one active delivery per pipeline (issue 17
items 3, 4), on the storage's Slot primitive.

An instance holds `capture::<source_id>` (`delivery::<pipeline>`) for a TTL and renews it;
another instance waits (standby) and takes it once it expires. Each new holder gets the
next generation; capture stamps it on every epoch it records and `EpochStore.record`
refuses an epoch of an older generation, so a former holder that lost its lease (paused,
cut off) cannot publish another epoch however long it takes to notice. (Delivery is fenced
by its owner generation: `owners.py`.)

`take_over_from`: a standby on the same host as the holder, that finds the holder's
process gone (kill -9), takes the lease at once instead of waiting for the TTL.
"""

from __future__ import annotations

import re

import grpc

from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.status import InvalidArgument, require
from tailrace_services.control.storage import SlotLease, Storage

log = get_logger(__name__)

_NAME = re.compile(r"^(capture|delivery)::[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_TTL_MS = 600_000


def capture_lease(source_id: str) -> str:
    return f"capture::{source_id}"


def _answer(name: str, lease: SlotLease | None, owner: str) -> pb.Lease:
    if lease is None:
        return pb.Lease(name=name)
    return pb.Lease(name=name, owner=lease.owner, generation=lease.generation,
                    expires_unix_ms=lease.expires_ms, held=lease.owner == owner)


class LeaseStore:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def current(self, name: str) -> SlotLease | None:
        """The lease while someone holds it (None once expired or released)."""
        return self._storage.slot_get(name)

    def acquire(self, request: pb.LeaseRequest) -> pb.Lease:
        require(request, "name", "owner", "ttl_ms")
        if not _NAME.match(request.name):
            raise InvalidArgument(f"lease name {request.name!r}: use capture::<source_id> or "
                                  "delivery::<pipeline>")
        if request.ttl_ms > MAX_TTL_MS:
            raise InvalidArgument(f"lease ttl_ms {request.ttl_ms} is above {MAX_TTL_MS}")
        held = self._storage.slot_get(request.name)
        if request.take_over_from and held is not None and held.owner == request.take_over_from:
            self._storage.slot_release(request.name, request.take_over_from)
            log.warning("lease taken over from a holder whose host says it is gone",
                        lease=request.name, holder=request.take_over_from, by=request.owner)
        lease = self._storage.slot_acquire(request.name, request.owner, request.ttl_ms / 1000)
        if lease.acquired and (held is None or held.owner != request.owner):
            log.info("lease acquired", lease=request.name, owner=request.owner,
                     generation=lease.generation)
        return _answer(request.name, lease, request.owner)

    def release(self, request: pb.ReleaseLeaseRequest) -> bool:
        require(request, "name", "owner")
        released = self._storage.slot_release(request.name, request.owner)
        if released:
            log.info("lease released", lease=request.name, owner=request.owner)
        return released


class LeasesServicer(rpc.LeasesServicer):
    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    def Acquire(self, request: pb.LeaseRequest, context: grpc.ServicerContext) -> pb.Lease:
        return self._store.acquire(request)

    def Release(self, request: pb.ReleaseLeaseRequest, context: grpc.ServicerContext
                ) -> pb.ReleaseLeaseResponse:
        return pb.ReleaseLeaseResponse(released=self._store.release(request))
