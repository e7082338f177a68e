"""Snapshot work and progress per pipeline (docs/snapshots.md): queued by operators, done
by capture, shown by `tailrace snapshot status`.

One record per pipeline (`snapshot::<pipeline>`), moved by compare-and-set on its
version. Capture reports the tables it selected and their keys, which is what an
operator's request is checked against: an unknown table, a table without a key or a
`where` that does not parse is refused before anything starts. Capture merges its
progress into the stored record (`Update` with the version it read), so a request or a
cancel that lands meanwhile is never overwritten.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import sqlglot
from sqlglot.errors import ParseError

from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.pipelines import PipelineRegistry
from tailrace_services.control.status import FailedPrecondition, InvalidArgument, NotFound, require
from tailrace_services.control.storage import CasConflict, Storage

log = get_logger(__name__)

ACTIVE = (pb.SNAPSHOT_PENDING, pb.SNAPSHOT_RUNNING)
_DIALECTS = {"postgres": "postgres", "mysql": "mysql"}
_ATTEMPTS = 20


def _key(pipeline: str) -> str:
    return f"snapshot::{pipeline}"


def check_where(where: str, source_type: str) -> None:
    """A filter is one boolean expression in the source's SQL, nothing more."""
    if not where:
        return
    try:
        parsed = sqlglot.parse(f"SELECT 1 WHERE {where}", read=_DIALECTS.get(source_type))
    except ParseError as e:
        raise InvalidArgument(f"--where {where!r} does not parse as a {source_type} "
                              f"condition: {str(e).splitlines()[0]}") from None
    if len(parsed) != 1 or parsed[0] is None or ";" in where:
        raise InvalidArgument(f"--where {where!r} must be one condition, not several "
                              "statements")


class SnapshotStore:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def get(self, pipeline: str) -> pb.SnapshotState | None:
        found = self._storage.kv_get(_key(pipeline))
        if found is None:
            return None
        state = pb.SnapshotState.FromString(found[0])
        state.version = found[1]
        return state

    def put(self, state: pb.SnapshotState, expected_version: int) -> pb.SnapshotState | None:
        """Store `state` if the stored version is `expected_version`; None when it moved."""
        stored = pb.SnapshotState()
        stored.CopyFrom(state)
        stored.version = 0
        try:
            (version,) = self._storage.kv_cas(
                [(_key(state.pipeline), stored.SerializeToString(), expected_version)])
        except CasConflict:
            return None
        stored.version = version
        return stored

    def change(self, pipeline: str, initial: Callable[[], pb.SnapshotState],
               edit: Callable[[pb.SnapshotState], None]) -> pb.SnapshotState:
        """Read, `edit`, compare-and-set; again when someone else moved it meanwhile."""
        for _ in range(_ATTEMPTS):
            current = self.get(pipeline) or initial()
            version = current.version
            edit(current)
            stored = self.put(current, version)
            if stored is not None:
                return stored
        raise FailedPrecondition(f"the snapshot record of pipeline {pipeline} kept changing; "
                                 "try again")


class SnapshotService:
    def __init__(self, store: SnapshotStore, pipelines: PipelineRegistry) -> None:
        self._store = store
        self._pipelines = pipelines

    def get(self, pipeline: str) -> pb.SnapshotState:
        info = self._pipelines.must_get(pipeline)
        return self._store.get(pipeline) or self._initial(info)()

    @staticmethod
    def _initial(info: pb.PipelineInfo) -> Callable[[], pb.SnapshotState]:
        return lambda: pb.SnapshotState(pipeline=info.name, source_id=info.source_id,
                                        source_type=info.source_type, next_request_id=1)

    def update(self, request: pb.UpdateSnapshotRequest) -> pb.UpdateSnapshotResponse:
        require(request.state, "pipeline")
        self._pipelines.must_get(request.state.pipeline)
        stored = self._store.put(request.state, request.expected_version)
        if stored is None:
            current = self._store.get(request.state.pipeline)
            return pb.UpdateSnapshotResponse(updated=False, state=current)
        return pb.UpdateSnapshotResponse(updated=True, state=stored)

    def request(self, request: pb.SnapshotRequest) -> pb.SnapshotState:
        require(request, "pipeline")
        info = self._pipelines.must_get(request.pipeline)
        current = self._store.get(info.name)
        selected = {t.table: t for t in (current.selected if current else [])}
        if not selected:
            raise FailedPrecondition(
                f"capture of pipeline {info.name} has not reported its tables yet; start "
                "tailrace-capture for it, then ask again")
        check_where(request.where, info.source_type)
        tables = list(request.tables) or sorted(selected)
        unknown = [t for t in tables if t not in selected]
        if unknown:
            raise NotFound(f"pipeline {info.name} does not capture {', '.join(unknown)}; it "
                           f"captures: {', '.join(sorted(selected))}")
        keyless = [t for t in tables if not selected[t].key_columns]
        if keyless:
            raise FailedPrecondition(
                f"{', '.join(keyless)} has no primary key to read it in chunks by: add one, or "
                "name its key in spec.source.snapshot.key_columns")
        now = int(time.time() * 1000)

        def edit(state: pb.SnapshotState) -> None:
            busy = [t.table for t in state.tables if t.table in tables and t.state in ACTIVE]
            if busy:
                raise FailedPrecondition(f"{', '.join(busy)} is being snapshotted already; "
                                         f"tailrace snapshot cancel {info.name} first")
            # a table a resnapshot queued whose TRUNCATE is not on the bus yet (failed or
            # cancelled before its first chunk) keeps it: its sinks must still be cleared
            reset = {t.table for t in state.tables if t.table in tables and t.reset
                     and not t.chunks_done}
            if reset and request.where:
                raise FailedPrecondition(
                    f"{', '.join(sorted(reset))} must first be read whole after the resnapshot "
                    "(its sinks are cleared first); request it without --where")
            kept = [t for t in state.tables if t.table not in tables]
            del state.tables[:]
            state.tables.extend(kept)
            for table in tables:
                state.tables.append(pb.SnapshotTable(
                    table=table, where=request.where, state=pb.SNAPSHOT_PENDING,
                    requested_unix_ms=now, updated_unix_ms=now, reason="requested by an operator",
                    request_id=state.next_request_id, reset=table in reset))
                state.next_request_id += 1

        stored = self._store.change(info.name, self._initial(info), edit)
        log.info("snapshot requested", pipeline=info.name, tables=tables,
                 where=request.where or None)
        return stored

    def request_for_sink(self, info: pb.PipelineInfo, sink_id: str) -> tuple[list[str], str]:
        """Every table capture selected, queued for a whole read for a sink that starts with
        `start: snapshot` (sink_start.py): (the tables queued, a note on what was not). A
        read already pending or running is superseded by one from the table's start (a new
        request id: capture drops the older read), as its chunks read before the sink's
        start are not the sink's; so is an operator's filtered (`--where`) read."""
        current = self._store.get(info.name)
        selected = {t.table: t for t in (current.selected if current else [])}
        if not selected:
            return [], (f"capture of pipeline {info.name} has not reported its tables yet, so "
                        "no snapshot was queued; once it has, queue one with tailrace "
                        f"snapshot {info.name}")
        tables = sorted(t for t, s in selected.items() if s.key_columns)
        keyless = sorted(t for t, s in selected.items() if not s.key_columns)
        note = (f"not read ({', '.join(keyless)}): no primary key to read it in chunks by; "
                "name one in spec.source.snapshot.key_columns") if keyless else ""
        if not tables:
            return [], note
        now = int(time.time() * 1000)
        superseded: list[str] = []

        def edit(state: pb.SnapshotState) -> None:
            reset = {t.table for t in state.tables if t.table in tables and t.reset
                     and not t.chunks_done}
            superseded[:] = [t.table for t in state.tables
                             if t.table in tables and t.state in ACTIVE]
            kept = [t for t in state.tables if t.table not in tables]
            del state.tables[:]
            state.tables.extend(kept)
            for table in tables:
                state.tables.append(pb.SnapshotTable(
                    table=table, state=pb.SNAPSHOT_PENDING, requested_unix_ms=now,
                    updated_unix_ms=now, reason=f"sink {sink_id} starts with a snapshot",
                    request_id=state.next_request_id, reset=table in reset))
                state.next_request_id += 1

        self._store.change(info.name, self._initial(info), edit)
        log.warning("snapshot requested for a sink that starts with one; its read events "
                    "reach every sink of the pipeline", pipeline=info.name, sink=sink_id,
                    tables=tables, superseded=superseded or None)
        if superseded:
            note = "; ".join(filter(None, [note, "a read pending or running was superseded "
                                           f"(started again whole): {', '.join(superseded)}"]))
        return tables, note

    def cancel(self, request: pb.CancelSnapshotRequest) -> pb.SnapshotState:
        require(request, "pipeline")
        info = self._pipelines.must_get(request.pipeline)
        wanted = set(request.tables)
        now = int(time.time() * 1000)

        def edit(state: pb.SnapshotState) -> None:
            active = [t for t in state.tables if t.state in ACTIVE
                      and (not wanted or t.table in wanted)]
            if not active:
                raise FailedPrecondition(f"pipeline {info.name} has no snapshot "
                                         f"{'of ' + ', '.join(sorted(wanted)) + ' ' if wanted else ''}"
                                         "pending or running")
            for t in active:
                t.state, t.reason, t.updated_unix_ms = (pb.SNAPSHOT_CANCELLED,
                                                        "cancelled by an operator", now)

        return self._store.change(info.name, self._initial(info), edit)

    def resnapshot(self, request: pb.ResnapshotRequest) -> pb.SnapshotState:
        require(request, "pipeline")
        info = self._pipelines.must_get(request.pipeline)
        if request.confirm != info.source_id:
            raise FailedPrecondition(
                f"resnapshot accepts the server of source {info.source_id} as it is now and "
                "reads every table again; confirm by repeating the source id (--confirm "
                f"{info.source_id})")
        if not self._pipelines.is_paused(info.name):
            raise FailedPrecondition(f"pipeline {info.name} is running; pause it first "
                                     f"(tailrace pause {info.name}), resnapshot, then resume")

        def edit(state: pb.SnapshotState) -> None:
            state.resnapshot_requested = True
            state.resnapshot_reason = "accepted by an operator (tailrace resnapshot)"

        stored = self._store.change(info.name, self._initial(info), edit)
        log.warning("resnapshot requested: capture will accept the server as it is now",
                    pipeline=info.name, source=info.source_id)
        return stored


class SnapshotsServicer(rpc.SnapshotsServicer):
    def __init__(self, service: SnapshotService) -> None:
        self._service = service

    def Get(self, request: pb.SnapshotRef, context: grpc.ServicerContext) -> pb.SnapshotState:
        require(request, "pipeline")
        return self._service.get(request.pipeline)

    def Update(self, request: pb.UpdateSnapshotRequest, context: grpc.ServicerContext
               ) -> pb.UpdateSnapshotResponse:
        return self._service.update(request)

    def Request(self, request: pb.SnapshotRequest, context: grpc.ServicerContext
                ) -> pb.SnapshotState:
        return self._service.request(request)

    def Cancel(self, request: pb.CancelSnapshotRequest, context: grpc.ServicerContext
               ) -> pb.SnapshotState:
        return self._service.cancel(request)

    def Resnapshot(self, request: pb.ResnapshotRequest, context: grpc.ServicerContext
                   ) -> pb.SnapshotState:
        return self._service.resnapshot(request)
