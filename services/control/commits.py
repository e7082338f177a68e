"""Commit policy (DESIGN guarantee 4): a batch's outcome advances the sinks that acknowledged,
together, and only when the policy holds.

1. Check the policy: `required` — every required sink acknowledged; `all` — every sink;
   `quorum: N` — at least N sinks acknowledged.
2. Not satisfied: nothing advances; the answer says which sinks were missing.
3. Satisfied: the checkpoints of the acknowledged sinks advance in ONE multi-key
   compare-and-set on the versions the caller read; a sink that failed keeps its
   checkpoint and catches up by replay later; a detached sink (retention.py) stays where
   it was detached, acknowledged or not.
4. A compare-and-set conflict (or a checkpoint that would move backwards) is answered
   with `conflict`: another delivery process owns the pipeline.
5. A report from a delivery generation that is no longer the pipeline's owner (see
   owners.py) is answered with `fenced`, and the owner check is part of the same
   compare-and-set as step 3, so a claim racing the commit fences it too.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from prometheus_client import Counter

from tailrace.logs import get_logger, redact
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.checkpoints import CheckpointConflict, CheckpointStore
from tailrace_services.control.owners import DeliveryOwners, describe, owner_key
from tailrace_services.control.status import InvalidArgument, require
from tailrace_services.control.storage import CasConflict

log = get_logger(__name__)

BATCHES = Counter("tailrace_control_batches", "Batch outcomes reported by delivery",
                  ["pipeline", "outcome"])


def evaluate(policy: pb.CommitPolicy, sinks: Sequence[pb.SinkOutcome]) -> tuple[bool, str]:
    """(satisfied, reason when not)."""
    failed = [s.sink_id for s in sinks if not s.acknowledged]
    if policy.kind == pb.POLICY_QUORUM:
        if policy.quorum < 1 or policy.quorum > len(sinks):
            raise InvalidArgument(
                f"commit policy quorum {policy.quorum} can never be met by {len(sinks)} sink(s); "
                f"set commit_policy.quorum between 1 and {len(sinks)}")
        acked = len(sinks) - len(failed)
        if acked >= policy.quorum:
            return True, ""
        return False, (f"quorum {policy.quorum} not met: {acked} of {len(sinks)} sinks "
                       f"acknowledged (failed: {', '.join(failed)})")
    if policy.kind == pb.POLICY_ALL:
        return (not failed, "" if not failed else
                f"policy all: sink(s) {', '.join(failed)} did not acknowledge")
    missing = [s.sink_id for s in sinks if s.required and not s.acknowledged]
    return (not missing, "" if not missing else
            f"policy required: required sink(s) {', '.join(missing)} did not acknowledge")


class CommitService:
    def __init__(self, checkpoints: CheckpointStore, owners: DeliveryOwners) -> None:
        self._checkpoints = checkpoints
        self._owners = owners

    def claim(self, request: pb.ClaimDeliveryRequest) -> pb.ClaimDeliveryResponse:
        require(request, "pipeline", "instance")
        owner, previous = self._owners.claim(request.pipeline, request.instance)
        if previous.generation:
            log.warning("delivery instance took over the pipeline; the previous one is fenced",
                        pipeline=request.pipeline, owner=describe(owner),
                        fenced=describe(previous))
        else:
            log.info("delivery instance claimed the pipeline", pipeline=request.pipeline,
                     owner=describe(owner))
        return pb.ClaimDeliveryResponse(owner=owner, previous=previous)

    def _fenced(self, request: pb.ReportBatchRequest) -> pb.ReportBatchResponse:
        owner, _ = self._owners.get(request.pipeline)
        BATCHES.labels(request.pipeline, "fenced").inc()
        reason = (f"delivery generation {request.generation} of pipeline {request.pipeline} "
                  f"is fenced: {describe(owner)} owns it now")
        log.warning("batch report from a fenced delivery instance refused",
                    pipeline=request.pipeline, batch=request.batch_id, reason=reason)
        return pb.ReportBatchResponse(satisfied=True, committed=False, fenced=True,
                                      owner=owner, reason=reason)

    def report(self, request: pb.ReportBatchRequest) -> pb.ReportBatchResponse:
        require(request, "pipeline", "source_id")
        if not request.sinks:
            raise InvalidArgument("ReportBatchRequest: sinks is empty; report every sink of the "
                                  "pipeline, acknowledged or not")
        ids = [s.sink_id for s in request.sinks]
        if "" in ids or len(set(ids)) != len(ids):
            raise InvalidArgument(f"ReportBatchRequest: sink ids must be set and unique; got {ids}")
        pipeline = request.pipeline
        guard = None
        if request.generation:
            owner, version = self._owners.get(pipeline)
            if owner.generation != request.generation:
                return self._fenced(request)
            guard = (owner_key(pipeline), owner.SerializeToString(), version)
        satisfied, reason = evaluate(request.policy, request.sinks)
        if not satisfied:
            BATCHES.labels(pipeline, "unsatisfied").inc()
            log.warning("commit policy not satisfied; no checkpoint advances", pipeline=pipeline,
                        batch=request.batch_id, reason=reason,
                        errors={s.sink_id: redact(s.error) for s in request.sinks if s.error})
            return pb.ReportBatchResponse(satisfied=False, committed=False, reason=reason)
        items = [(self._checkpoint_of(request, s), s.expected_version)
                 for s in request.sinks if s.acknowledged and  # a detached sink stays put
                 self._checkpoints.detached(request.source_id, s.sink_id) is None]
        if not items:
            BATCHES.labels(pipeline, "empty").inc()
            return pb.ReportBatchResponse(satisfied=True, committed=False,
                                          reason="no sink acknowledged; nothing to advance")
        try:
            stored = self._checkpoints.commit_many(items, guard)
        except CasConflict:  # the owner record moved: claimed since we checked
            return self._fenced(request)
        except CheckpointConflict as e:
            BATCHES.labels(pipeline, "conflict").inc()
            log.error("checkpoint conflict: another delivery process owns the pipeline?",
                      pipeline=pipeline, sink=e.sink_id, reason=str(e))
            return pb.ReportBatchResponse(
                satisfied=True, committed=False, conflict=True, reason=str(e),
                checkpoints=[e.current] if e.current is not None else [])
        BATCHES.labels(pipeline, "committed").inc()
        lagging = [s.sink_id for s in request.sinks if not s.acknowledged]
        if lagging:
            log.info("optional sinks left behind; they catch up by replay", pipeline=pipeline,
                     sinks=lagging)
        return pb.ReportBatchResponse(
            satisfied=True, committed=True, checkpoints=stored,
            reason=f"sink(s) {', '.join(lagging)} keep their checkpoint" if lagging else "")

    @staticmethod
    def _checkpoint_of(request: pb.ReportBatchRequest, outcome: pb.SinkOutcome) -> pb.Checkpoint:
        cp = pb.Checkpoint()
        cp.CopyFrom(outcome.checkpoint)
        for field, value in (("pipeline", request.pipeline), ("source_id", request.source_id),
                             ("sink_id", outcome.sink_id)):
            given = getattr(cp, field)
            if given and given != value:
                raise InvalidArgument(f"sink {outcome.sink_id}: checkpoint.{field} is {given!r} "
                                      f"but the report is for {value!r}; leave it empty")
            setattr(cp, field, value)
        return cp


class CommitsServicer(rpc.CommitsServicer):
    def __init__(self, service: CommitService) -> None:
        self._service = service

    def ReportBatch(self, request: pb.ReportBatchRequest, context: grpc.ServicerContext
                    ) -> pb.ReportBatchResponse:
        return self._service.report(request)

    def ClaimDelivery(self, request: pb.ClaimDeliveryRequest, context: grpc.ServicerContext
                      ) -> pb.ClaimDeliveryResponse:
        return self._service.claim(request)
