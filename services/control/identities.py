"""Server identities (DESIGN guarantee 9): FirstSeen / Same / Changed, reconcile records, health.

`Compare` stores an identity only the first time (compare-and-set on "absent", so two
capture processes cannot both see FirstSeen); on Changed the capture service reconciles
and then calls `Store`. Reconcile records go to an append-only log.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from tailrace.logs import get_logger, redact
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.health import HealthStore
from tailrace_services.control.status import InvalidArgument, require
from tailrace_services.control.storage import CasConflict, Storage

log = get_logger(__name__)

_RECONCILE_LOG = "reconcile"


def _key(source_id: str) -> str:
    return f"identity::{source_id}"


def same_server(a: pb.ServerIdentity, b: pb.ServerIdentity) -> bool:
    """The fingerprints decide when both have one; otherwise flavor and attributes."""
    if a.fingerprint and b.fingerprint:
        return a.fingerprint == b.fingerprint
    return a.flavor == b.flavor and dict(a.attributes) == dict(b.attributes)


class IdentityStore:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def get(self, source_id: str) -> tuple[pb.ServerIdentity, int] | None:
        found = self._storage.kv_get(_key(source_id))
        return (pb.ServerIdentity.FromString(found[0]), found[1]) if found else None

    def compare(self, source_id: str, identity: pb.ServerIdentity
                ) -> tuple[pb.IdentityVerdict, pb.ServerIdentity | None]:
        """(verdict, stored identity); stores `identity` when nothing was stored."""
        while True:
            found = self.get(source_id)
            if found is not None:
                verdict = pb.IDENTITY_SAME if same_server(found[0], identity) else pb.IDENTITY_CHANGED
                return verdict, found[0]
            stored = _stamped(identity)
            try:
                self._storage.kv_cas([(_key(source_id), stored.SerializeToString(), 0)])
            except CasConflict:
                continue
            log.info("server identity first seen", source=source_id, flavor=identity.flavor)
            return pb.IDENTITY_FIRST_SEEN, None

    def store(self, source_id: str, identity: pb.ServerIdentity) -> pb.ServerIdentity | None:
        found = self.get(source_id)
        self._storage.kv_put(_key(source_id), _stamped(identity).SerializeToString())
        if found is not None and not same_server(found[0], identity):
            log.warning("server identity replaced", source=source_id)
        return found[0] if found else None

    def add_reconcile(self, record: pb.ReconcileRecord) -> int:
        stored = pb.ReconcileRecord()
        stored.CopyFrom(record)
        stored.ts_unix_ms = stored.ts_unix_ms or int(time.time() * 1000)
        del stored.drift[:]
        stored.drift.extend(redact(d) for d in record.drift)
        seq = self._storage.log_append(_RECONCILE_LOG, stored.SerializeToString())
        log.warning("reconcile recorded", source=record.source_id, decision=record.decision,
                    drift=list(stored.drift), sequence=seq)
        return seq

    def list_reconcile(self, source_id: str = "", limit: int = 100) -> list[pb.ReconcileRecord]:
        """The newest `limit` records (of one source, or all), oldest first."""
        out: list[pb.ReconcileRecord] = []
        after = 0
        while True:
            page = self._storage.log_read(_RECONCILE_LOG, after=after, limit=1000)
            for seq, value in page:
                record = pb.ReconcileRecord.FromString(value)
                if not source_id or record.source_id == source_id:
                    record.sequence = seq
                    out.append(record)
            if len(page) < 1000:
                return out[-limit:] if limit else out
            after = page[-1][0]


def _stamped(identity: pb.ServerIdentity) -> pb.ServerIdentity:
    stored = pb.ServerIdentity()
    stored.CopyFrom(identity)
    stored.seen_unix_ms = int(time.time() * 1000)
    return stored


class IdentitiesServicer(rpc.IdentitiesServicer):
    """`retention`: judges a source's retained-log report against its limit (retention.py)
    and answers what it did."""

    def __init__(self, identities: IdentityStore, health: HealthStore,
                 retention: Callable[[pb.HealthReport], pb.ReportHealthResponse] | None = None
                 ) -> None:
        self._identities = identities
        self._health = health
        self._retention = retention

    def Compare(self, request: pb.CompareIdentityRequest, context: grpc.ServicerContext
                ) -> pb.CompareIdentityResponse:
        require(request, "source_id")
        _check_identity(request)
        verdict, previous = self._identities.compare(request.source_id, request.identity)
        return pb.CompareIdentityResponse(verdict=verdict, previous=previous)

    def Store(self, request: pb.StoreIdentityRequest, context: grpc.ServicerContext
              ) -> pb.StoreIdentityResponse:
        require(request, "source_id")
        _check_identity(request)
        previous = self._identities.store(request.source_id, request.identity)
        return pb.StoreIdentityResponse(replaced=previous is not None, previous=previous)

    def AddReconcile(self, request: pb.ReconcileRecord, context: grpc.ServicerContext
                     ) -> pb.AddReconcileResponse:
        require(request, "source_id", "decision")
        return pb.AddReconcileResponse(sequence=self._identities.add_reconcile(request))

    def ListReconcile(self, request: pb.ListReconcileRequest, context: grpc.ServicerContext
                      ) -> pb.ListReconcileResponse:
        return pb.ListReconcileResponse(records=self._identities.list_reconcile(
            request.source_id, request.limit or 100))

    def ReportHealth(self, request: pb.HealthReport, context: grpc.ServicerContext
                     ) -> pb.ReportHealthResponse:
        require(request, "subject_id")
        if request.state == pb.HEALTH_UNSPECIFIED and not request.HasField("retained_bytes"):
            raise InvalidArgument("HealthReport.state is required: running, position_lost, "
                                  "failed, paused or degraded (or retained_bytes alone)")
        self._health.report(request)
        return self._retention(request) if self._retention else pb.ReportHealthResponse()

    def GetHealth(self, request: pb.GetHealthRequest, context: grpc.ServicerContext
                  ) -> pb.GetHealthResponse:
        report = self._health.get(request.subject_id)
        return pb.GetHealthResponse(found=report is not None, report=report)

    def ListHealth(self, request: pb.ListHealthRequest, context: grpc.ServicerContext
                   ) -> pb.ListHealthResponse:
        return pb.ListHealthResponse(reports=self._health.list())


def _check_identity(request: pb.CompareIdentityRequest | pb.StoreIdentityRequest) -> None:
    identity = request.identity
    if not identity.fingerprint and not identity.attributes:
        raise InvalidArgument(f"identity of source {request.source_id} has neither a "
                              "fingerprint nor attributes; send at least one")
