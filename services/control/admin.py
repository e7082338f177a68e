"""The admin API: pipelines and their state, pause/resume, checkpoints per sink with lag and
last error, rewind/reset of a sink's checkpoint, a detached sink attached again (retention.py).
Mutations need the admin token (see auth.py).

Lag of a sink (lag.py): bus records, source seconds, and WAL bytes (PostgreSQL) or
transactions (MySQL/MariaDB) between its checkpoint and the latest epoch.

A rewind (or reset) bumps the checkpoint's rewind generation: exactly-once sinks name the
checkpoint they keep beside the data by it, so they do not skip what they already had and
the sink receives it again, as the confirmation says.
"""

from __future__ import annotations

import grpc

from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.checkpoints import CheckpointConflict, CheckpointStore, describe
from tailrace_services.control.epochs import EpochStore
from tailrace_services.control.lag import sink_lag
from tailrace_services.control.pipelines import PipelineRegistry
from tailrace_services.control.retention import holder
from tailrace_services.control.sink_start import SinkStarts
from tailrace_services.control.status import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    require,
)

log = get_logger(__name__)


def sink_checkpoints(pipelines: PipelineRegistry, checkpoints: CheckpointStore,
                     epochs: EpochStore, info: pb.PipelineInfo) -> pb.SinkCheckpointsResponse:
    """Every sink of `info` with its checkpoint, lag and last error (admin API, metrics)."""
    latest = epochs.latest(info.source_id)
    history = epochs.history(info.source_id) if latest is not None else []
    failing = pipelines.sink_health(info.name)
    out = pb.SinkCheckpointsResponse(pipeline=info.name, source_id=info.source_id,
                                     latest_epoch=latest)
    if info.HasField("retained_bytes"):
        out.retained_bytes = info.retained_bytes
        out.retained_what = info.retained_what
        out.retained_unix_ms = info.retained_unix_ms
    for sink in info.sinks:
        cp = checkpoints.get(info.source_id, sink.id)
        lag = sink_lag(cp, latest, history, info.source_type)
        health = failing.get(sink.id, pb.SinkHealth())
        out.sinks.append(pb.SinkCheckpoint(
            sink_id=sink.id, required=sink.required, found=cp is not None, checkpoint=cp,
            lag_offsets=lag.offsets, lag_seconds=lag.seconds, lag_bytes=lag.bytes,
            lag_transactions=lag.transactions, last_error=health.last_error,
            failing_since_unix_ms=health.failing_since_unix_ms,
            failed_batches=health.failed_batches, detached=sink.detached if
            sink.HasField("detached") else None))
    return out


class AdminServicer(rpc.AdminServicer):
    def __init__(self, pipelines: PipelineRegistry, checkpoints: CheckpointStore,
                 epochs: EpochStore, starts: SinkStarts) -> None:
        self._pipelines = pipelines
        self._checkpoints = checkpoints
        self._epochs = epochs
        self._starts = starts

    def RegisterPipeline(self, request: pb.PipelineInfo, context: grpc.ServicerContext
                         ) -> pb.RegisterPipelineResponse:
        """Register, then give a sink with `start: now` or `snapshot` and no checkpoint yet
        its first one (sink_start.py)."""
        info = self._pipelines.register(request)
        started = self._starts.place(info)
        return pb.RegisterPipelineResponse(pipeline=self._pipelines.get(info.name) or info,
                                           started=started)

    def ListPipelines(self, request: pb.ListPipelinesRequest, context: grpc.ServicerContext
                      ) -> pb.ListPipelinesResponse:
        return pb.ListPipelinesResponse(pipelines=self._pipelines.list())

    def GetPipeline(self, request: pb.PipelineRef, context: grpc.ServicerContext
                    ) -> pb.PipelineInfo:
        require(request, "name")
        info = self._pipelines.get(request.name)
        if info is None:  # services poll this before they register: not an error
            return pb.PipelineInfo(name=request.name, state=pb.PIPELINE_UNKNOWN,
                                   reason=f"pipeline {request.name} is not registered")
        return info

    def Pause(self, request: pb.PauseRequest, context: grpc.ServicerContext) -> pb.PipelineInfo:
        require(request, "name")
        return self._pipelines.pause(request.name, request.reason)

    def Resume(self, request: pb.PipelineRef, context: grpc.ServicerContext) -> pb.PipelineInfo:
        require(request, "name")
        return self._pipelines.resume(request.name)

    def Checkpoints(self, request: pb.PipelineRef, context: grpc.ServicerContext
                    ) -> pb.SinkCheckpointsResponse:
        require(request, "name")
        info = self._pipelines.must_get(request.name)
        return sink_checkpoints(self._pipelines, self._checkpoints, self._epochs, info)

    def Rewind(self, request: pb.RewindRequest, context: grpc.ServicerContext
               ) -> pb.RewindResponse:
        require(request, "pipeline", "sink_id")
        info = self._pipelines.must_get(request.pipeline)
        sink_ids = [s.id for s in info.sinks]
        if request.sink_id not in sink_ids:
            raise NotFound(f"pipeline {info.name} has no sink {request.sink_id!r}; its sinks: "
                           + ", ".join(sink_ids))
        target = request.WhichOneof("target")
        if target is None:
            raise InvalidArgument("say where to: to_sequence (--to-sequence N) or reset (--reset)")
        if request.confirm != request.sink_id:
            raise FailedPrecondition(
                f"rewinding sink {request.sink_id} re-delivers what it already has; confirm by "
                f"repeating the sink id (--confirm {request.sink_id})")
        if not self._pipelines.is_paused(info.name):
            raise FailedPrecondition(f"pipeline {info.name} is running; pause it first "
                                     f"(tailrace pause {info.name}), rewind, then resume")
        current = self._checkpoints.get(info.source_id, request.sink_id)
        if current is None:
            raise FailedPrecondition(f"sink {request.sink_id} has no checkpoint yet; it already "
                                     "starts from the earliest available position")
        new = pb.Checkpoint(pipeline=info.name, source_id=info.source_id, sink_id=request.sink_id,
                            rewind=current.rewind + 1)
        if target == "to_sequence":
            if request.to_sequence >= current.position.tx_seq:
                raise FailedPrecondition(
                    f"rewind moves backwards only: sink {request.sink_id} is at {describe(current)}"
                    f", asked for tx {request.to_sequence}")
            epoch = self._epoch_at(info.source_id, request.to_sequence)
            new.position.CopyFrom(epoch.position)
            new.bus_generation = epoch.bus_generation
            for p, o in epoch.end_offsets.items():
                new.bus_offsets[p] = o
        try:
            stored = self._checkpoints.overwrite(new, current.version)
        except CheckpointConflict as e:
            raise Aborted(str(e)) from None
        log.warning("sink checkpoint rewound", pipeline=info.name, sink=request.sink_id,
                    before=describe(current), after="earliest" if target == "reset" else
                    describe(stored), rewind=stored.rewind)
        return pb.RewindResponse(before=current, after=stored)

    def Attach(self, request: pb.AttachRequest, context: grpc.ServicerContext
               ) -> pb.AttachResponse:
        """A detached sink (retention.py) back, from where the least advanced attached sink
        is: it skips what it missed, which a snapshot then brings."""
        require(request, "pipeline", "sink_id")
        info = self._pipelines.must_get(request.pipeline)
        detached = self._checkpoints.detached(info.source_id, request.sink_id)
        if detached is None:
            raise FailedPrecondition(f"sink {request.sink_id} of pipeline {info.name} is not "
                                     "detached; `tailrace checkpoints` shows which are")
        if request.confirm != request.sink_id:
            raise FailedPrecondition(
                f"sink {request.sink_id} skips what it missed while detached and needs a "
                f"snapshot afterwards; confirm by repeating the sink id (--confirm "
                f"{request.sink_id})")
        if not self._pipelines.is_paused(info.name):
            raise FailedPrecondition(f"pipeline {info.name} is running; pause it first "
                                     f"(tailrace pause {info.name}), attach, then resume")
        held = holder(info, self._checkpoints)
        if held is None or held[1] is None:
            raise FailedPrecondition(f"pipeline {info.name}: no attached sink has a checkpoint "
                                     "yet to start it from; attach once they have")
        current = self._checkpoints.get(info.source_id, request.sink_id)
        new = pb.Checkpoint()
        new.CopyFrom(held[1])
        new.sink_id = request.sink_id
        new.ClearField("sink_stored")
        if current is not None:  # its own: what an exactly-once sink keeps beside its data
            new.rewind = current.rewind
            for p, pos in current.sink_stored.items():
                new.sink_stored[p].CopyFrom(pos)
        try:
            stored = self._checkpoints.overwrite(new, current.version if current else 0)
        except CheckpointConflict as e:
            raise Aborted(str(e)) from None
        self._checkpoints.attach(info.source_id, request.sink_id)
        log.warning("detached sink attached again; it needs a snapshot for what it missed",
                    pipeline=info.name, sink=request.sink_id, was=describe(current),
                    now=describe(stored))
        return pb.AttachResponse(was=detached, checkpoint=stored)

    def _epoch_at(self, source_id: str, tx_seq: int) -> pb.Epoch:
        history = self._epochs.history(source_id)
        found = [e for e in history if e.position.tx_seq <= tx_seq]
        if not found:
            oldest = (f"tx {history[0].position.tx_seq}" if history else "none")
            raise FailedPrecondition(
                f"no epoch at or before tx {tx_seq} is retained (oldest retained: {oldest}); "
                "use --reset to replay from the earliest available position")
        epoch, now = found[-1], history[-1].bus_generation
        if epoch.bus_generation < now:
            first = next(e for e in history if e.bus_generation == now)
            raise FailedPrecondition(
                f"tx {tx_seq} was published onto a bus that lost its records (bus generation "
                f"{epoch.bus_generation}; capture republished onto generation {now} from tx "
                f"{first.position.tx_seq}); rewind to a later tx, or use --reset to replay "
                "what the bus holds now")
        return epoch
