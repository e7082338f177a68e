"""Dead-letter queue (DESIGN guarantee 7): one bounded, expiring queue per pipeline.

Overflow is decided in the storage write: `drop_oldest` makes room and counts what it
dropped, `reject` refuses what does not fit and says how many, `block` stores what fits and
answers `blocked` so the caller waits and sends the rest again. Expired entries are removed
and counted. Replay hands entries out without removing them; the caller confirms with Ack
after re-delivering, so a replay that fails half-way loses nothing.
"""

from __future__ import annotations

import grpc
from prometheus_client import Counter

from tailrace.logs import get_logger, redact
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.status import InvalidArgument, require
from tailrace_services.control.storage import Storage

log = get_logger(__name__)

ENTRIES = Counter("tailrace_control_dead_letters", "Dead-letter queue entries by what happened",
                  ["pipeline", "outcome"])

DEFAULT_MAX_ENTRIES = 10_000
OVERFLOW_NAMES = {pb.OVERFLOW_DROP_OLDEST: "drop_oldest", pb.OVERFLOW_REJECT: "reject",
                  pb.OVERFLOW_BLOCK: "block"}


def _queue(pipeline: str) -> str:
    return f"dlq::{pipeline}"


class DeadLetterStore:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def append(self, request: pb.AppendDeadLettersRequest) -> pb.AppendDeadLettersResponse:
        require(request, "pipeline")
        if request.overflow not in OVERFLOW_NAMES:
            raise InvalidArgument(f"unknown overflow policy {request.overflow}; use "
                                  "drop_oldest, reject or block")
        values = [pb.DeadLetter(sink_id=e.sink_id, reason=redact(e.reason)[:2000],
                                event=e.event).SerializeToString() for e in request.entries]
        pushed = self._storage.queue_push(
            _queue(request.pipeline), values, request.max_entries or DEFAULT_MAX_ENTRIES,
            OVERFLOW_NAMES[request.overflow], ttl_s=request.ttl_s)
        p = request.pipeline
        for outcome, n in (("appended", pushed.appended), ("dropped", pushed.dropped),
                           ("rejected", pushed.rejected), ("expired", pushed.expired)):
            if n:
                ENTRIES.labels(p, outcome).inc(n)
        if pushed.dropped or pushed.rejected or pushed.blocked:
            log.warning("dead-letter queue full", pipeline=p,
                        overflow=OVERFLOW_NAMES[request.overflow], dropped=pushed.dropped,
                        rejected=pushed.rejected, blocked=pushed.blocked)
        return pb.AppendDeadLettersResponse(
            appended=pushed.appended, dropped=pushed.dropped, rejected=pushed.rejected,
            blocked=pushed.blocked, first_sequence=pushed.first_seq)

    def count(self, pipeline: str) -> pb.DeadLetterCount:
        stats = self._storage.queue_stats(_queue(pipeline))
        return pb.DeadLetterCount(count=stats.count, last_sequence=stats.last_seq,
                                  dropped_total=stats.dropped, expired_total=stats.expired,
                                  rejected_total=stats.rejected)

    def list(self, pipeline: str, limit: int = 100, after: int = 0) -> list[pb.DeadLetter]:
        out = []
        for entry in self._storage.queue_list(_queue(pipeline), after=after, limit=limit or 100):
            letter = pb.DeadLetter.FromString(entry.value)
            letter.sequence = entry.seq
            letter.created_unix_ms = entry.created_ms
            letter.expires_unix_ms = entry.expires_ms
            out.append(letter)
        return out

    def ack(self, pipeline: str, up_to: int) -> int:
        removed = self._storage.queue_ack(_queue(pipeline), up_to)
        log.info("dead letters acknowledged", pipeline=pipeline, up_to=up_to, removed=removed)
        return removed

    def purge(self, pipeline: str) -> int:
        removed = self._storage.queue_purge(_queue(pipeline))
        if removed:
            ENTRIES.labels(pipeline, "purged").inc(removed)
        log.warning("dead-letter queue purged", pipeline=pipeline, removed=removed)
        return removed


class DeadLettersServicer(rpc.DeadLettersServicer):
    def __init__(self, store: DeadLetterStore) -> None:
        self._store = store

    def Append(self, request: pb.AppendDeadLettersRequest, context: grpc.ServicerContext
               ) -> pb.AppendDeadLettersResponse:
        return self._store.append(request)

    def Count(self, request: pb.DeadLettersRequest, context: grpc.ServicerContext
              ) -> pb.DeadLetterCount:
        require(request, "pipeline")
        return self._store.count(request.pipeline)

    def List(self, request: pb.ListDeadLettersRequest, context: grpc.ServicerContext
             ) -> pb.ListDeadLettersResponse:
        require(request, "pipeline")
        return pb.ListDeadLettersResponse(entries=self._store.list(
            request.pipeline, request.limit, request.after))

    def Replay(self, request: pb.ListDeadLettersRequest, context: grpc.ServicerContext
               ) -> pb.ListDeadLettersResponse:
        require(request, "pipeline")
        entries = self._store.list(request.pipeline, request.limit, request.after)
        log.info("dead letters handed out for replay", pipeline=request.pipeline,
                 entries=len(entries))
        return pb.ListDeadLettersResponse(entries=entries)

    def Ack(self, request: pb.AckDeadLettersRequest, context: grpc.ServicerContext
            ) -> pb.RemovedDeadLetters:
        require(request, "pipeline", "up_to")
        return pb.RemovedDeadLetters(removed=self._store.ack(request.pipeline, request.up_to))

    def Purge(self, request: pb.DeadLettersRequest, context: grpc.ServicerContext
              ) -> pb.RemovedDeadLetters:
        require(request, "pipeline")
        return pb.RemovedDeadLetters(removed=self._store.purge(request.pipeline))
