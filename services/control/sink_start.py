"""Where a sink with no checkpoint yet starts (its spec's `start`), settled when the
pipeline is registered with it: by capture or delivery starting with the spec that names
the sink (a managed pipeline's new version, a spec file changed).

- `earliest` (the default): nothing is done; delivery plans a sink without a checkpoint
  from the oldest position the bus holds.
- `now`: the sink gets a first checkpoint just past the source's latest epoch (its
  position, bus generation and end offsets, as an admin rewind makes one), so delivery
  skips what came before. An epoch covers only transactions capture had read when it was
  recorded, and epochs only move forwards: every change committed after the registration
  lies past the epoch read here, so none is skipped (an epoch recorded meanwhile only
  means the sink gets a little more). With no epoch recorded yet nothing was published:
  the sink keeps no checkpoint and gets everything, as the others; a marker
  (`<source>::started::<sink>`) says it was placed, so a later registration, once epochs
  exist, does not place it past what was published meanwhile.
- `snapshot`: as `now`, and every table capture selected is queued for a whole read
  (snapshots.py) after the epoch was read and before the checkpoint is stored: its read
  events are published after that epoch, so the sink gets them all — and so do the
  pipeline's other sinks.

The checkpoint (or the marker) is stored by compare-and-set on "none yet": a sink that
has one is never moved, and of two registrations at once (capture and delivery reloading
a new version) one makes it. A crash between the snapshot request and the checkpoint leaves the sink
without one, so the next registration does both again.
"""

from __future__ import annotations

import threading

from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace_services.control.checkpoints import CheckpointStore
from tailrace_services.control.epochs import EpochStore
from tailrace_services.control.snapshots import SnapshotService
from tailrace_services.control.storage import CasConflict, Storage

log = get_logger(__name__)


def started_key(source_id: str, sink_id: str) -> str:
    """Set once a sink was placed at the pipeline's beginning (no epoch yet)."""
    return f"{source_id}::started::{sink_id}"


class SinkStarts:
    def __init__(self, storage: Storage, checkpoints: CheckpointStore, epochs: EpochStore,
                 snapshots: SnapshotService) -> None:
        self._storage = storage
        self._checkpoints = checkpoints
        self._epochs = epochs
        self._snapshots = snapshots
        self._lock = threading.Lock()  # one placement at a time in this process

    def place(self, info: pb.PipelineInfo) -> list[pb.SinkStarted]:
        """A first checkpoint for each sink of the registered `info` whose `start` is now or
        snapshot and that has none yet; what was done, one entry a sink."""
        started = []
        with self._lock:
            for sink in info.sinks:
                if sink.start in ("", "earliest"):
                    continue
                if self._checkpoints.get(info.source_id, sink.id) is not None or \
                        self._storage.kv_get(started_key(info.source_id, sink.id)):
                    continue  # it resumes from its own, whatever the spec says now
                done = self._place(info, sink)
                if done is not None:
                    started.append(done)
        return started

    def _place(self, info: pb.PipelineInfo, sink: pb.SinkInfo) -> pb.SinkStarted | None:
        latest = self._epochs.latest(info.source_id)
        cp = pb.Checkpoint(pipeline=info.name, source_id=info.source_id, sink_id=sink.id)
        if latest is not None:
            cp.position.CopyFrom(latest.position)
            cp.bus_generation = latest.bus_generation
            for partition, offset in latest.end_offsets.items():
                cp.bus_offsets[partition] = offset
        tables: list[str] = []
        note = "" if latest is not None else (
            f"source {info.source_id} has recorded no epoch yet: the sink starts at the "
            "pipeline's beginning, as the others (no checkpoint until its first batch)")
        if sink.start == "snapshot":
            tables, why = self._snapshots.request_for_sink(info, sink.id)
            note = "; ".join(filter(None, [note, why]))
        if latest is not None:
            committed, current = self._checkpoints.commit(cp, 0)
        else:  # no checkpoint: delivery plans it from the bus's start
            try:
                self._storage.kv_cas([(started_key(info.source_id, sink.id), b"origin", 0)])
                committed, current = True, None
            except CasConflict:
                committed = False
        if not committed:  # another registration placed it meanwhile
            log.info("sink placed by another registration", pipeline=info.name, sink=sink.id,
                     start=sink.start)
            return None
        log.warning("sink without a checkpoint placed where its spec's start says",
                    pipeline=info.name, sink=sink.id, start=sink.start,
                    after_epoch=latest.epoch_id if latest is not None else None,
                    tx=f"{cp.position.tx_seq}.{cp.position.event_index}",
                    bus_generation=cp.bus_generation, bus_offsets=dict(cp.bus_offsets) or None,
                    snapshot_tables=tables or None, note=note or None)
        return pb.SinkStarted(sink_id=sink.id, start=sink.start, checkpoint=current,
                              epoch_id=latest.epoch_id if latest is not None else 0,
                              snapshot_tables=tables, note=note)
