"""Epochs: cuts of the bus that never split a transaction, recorded by capture, read by delivery.

The latest epoch per source is a KV entry; every recorded epoch is also appended to a
per-source log (the last `HISTORY` are kept) for `Range` and for the admin's lag in seconds.
"""

from __future__ import annotations

import grpc

from tailrace.events import position_key
from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace.proto.event_pb2 import Position
from tailrace_services.control.leases import capture_lease
from tailrace_services.control.status import FailedPrecondition, require
from tailrace_services.control.storage import Storage

log = get_logger(__name__)

HISTORY = 10_000


def _latest_key(source_id: str) -> str:
    return f"{source_id}::epoch::latest"


def _highest_key(source_id: str) -> str:
    return f"{source_id}::epoch::highest"


def _history(source_id: str) -> str:
    return f"epochs::{source_id}"


class EpochStore:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def record(self, epoch: pb.Epoch) -> None:
        """Keep the latest epoch. Within one bus generation the planned end of the bus never
        moves backwards: an epoch whose offsets are behind the stored one's is refused (a
        bus that lost what capture published, noticed mid-session, or an older copy of
        capture still running; ignoring it silently once let the sinks' checkpoints pass
        the changes lost with the bus). A capture that starts again and finds the latest
        epoch's marker gone from the bus opens the next generation, which is accepted;
        an epoch of an older generation than the stored one is refused."""
        latest = self.latest(epoch.source_id)
        self._refuse_fenced(epoch, latest)
        if latest is not None and epoch.bus_generation < latest.bus_generation:
            raise FailedPrecondition(
                f"epoch {epoch.epoch_id} of source {epoch.source_id} is of bus generation "
                f"{epoch.bus_generation}, but the source already publishes onto generation "
                f"{latest.bus_generation} (capture republished after the bus lost its "
                "records): this capture is an older copy still running; stop it")
        behind = sorted((p, o, epoch.end_offsets.get(p, 0)) for p, o in
                        (latest.end_offsets.items() if latest is not None else ())
                        if epoch.end_offsets.get(p, 0) < o)
        if latest is not None and behind and epoch.bus_generation == latest.bus_generation:
            where = ", ".join(f"partition {p} at offset {now:,} (epoch {latest.epoch_id} ended "
                              f"at {then:,})" for p, then, now in behind)
            raise FailedPrecondition(
                f"epoch {epoch.epoch_id} of source {epoch.source_id} ends before the latest "
                f"recorded one: {where}. The bus no longer holds what this source published "
                "(its topic was deleted or made again, or the broker lost its data), or this "
                "capture is an older copy still running. Changes not yet delivered are still "
                "in the source's log up to the sinks' checkpoints: a capture that starts "
                "again republishes them onto a new bus generation if the bus lost them")
        if latest is not None and epoch.bus_generation > latest.bus_generation:
            log.warning("bus generation started: capture republishes from the sinks' "
                        "checkpoint onto a bus that lost what it held", source=epoch.source_id,
                        generation=epoch.bus_generation, epoch=epoch.epoch_id,
                        start=dict(epoch.generation_start))
        highest = self.highest(epoch.source_id)
        if highest is None or position_key(epoch.position) > position_key(highest):
            self._storage.kv_put(_highest_key(epoch.source_id), epoch.position.SerializeToString())
        self._storage.kv_put(_latest_key(epoch.source_id), epoch.SerializeToString())
        seq = self._storage.log_append(_history(epoch.source_id), epoch.SerializeToString())
        if seq > HISTORY and seq % 1000 == 0:
            self._storage.log_truncate(_history(epoch.source_id), seq - HISTORY)

    def _refuse_fenced(self, epoch: pb.Epoch, latest: pb.Epoch | None) -> None:
        """An epoch of a capture that lost its lease (leases.py): another instance holds it
        now, or has recorded epochs since."""
        if not epoch.capture_generation:
            return  # not stamped: a capture without a lease (tests that record by hand)
        lease = self._storage.slot_get(capture_lease(epoch.source_id))
        newer = lease.generation if lease is not None and \
            lease.generation != epoch.capture_generation else 0
        if latest is not None and latest.capture_generation > epoch.capture_generation:
            newer = max(newer, latest.capture_generation)
        if newer:
            holder = f" ({lease.owner})" if lease is not None else ""
            raise FailedPrecondition(
                f"epoch {epoch.epoch_id} of source {epoch.source_id}: capture lease generation "
                f"{epoch.capture_generation} is fenced; generation {newer}{holder} captures "
                "this source now. This instance lost its lease (it was paused or cut off from "
                "the control service longer than its TTL): it stops, and may start again as "
                "a standby")

    def highest(self, source_id: str) -> Position | None:
        """The furthest position any recorded epoch reached: after the bus lost its records
        the latest epoch's is lower until capture republished past it, and a sink's
        checkpoint may be anywhere below it."""
        found = self._storage.kv_get(_highest_key(source_id))
        if found:
            return Position.FromString(found[0])
        latest = self.latest(source_id)
        return latest.position if latest is not None else None

    def latest(self, source_id: str) -> pb.Epoch | None:
        found = self._storage.kv_get(_latest_key(source_id))
        return pb.Epoch.FromString(found[0]) if found else None

    def history(self, source_id: str) -> list[pb.Epoch]:
        """Every retained epoch, oldest first."""
        out: list[pb.Epoch] = []
        after = 0
        while True:
            page = self._storage.log_read(_history(source_id), after=after, limit=1000)
            out.extend(pb.Epoch.FromString(v) for _, v in page)
            if len(page) < 1000:
                return out
            after = page[-1][0]

    def range(self, source_id: str, after_epoch_id: int, up_to_epoch_id: int, limit: int
              ) -> list[pb.Epoch]:
        """At most `limit` epochs past `after_epoch_id` (up to `up_to_epoch_id`, 0: no end),
        oldest first. Delivery asks at every micro-batch for the few epochs past the one it
        planned last: they are found by a binary search of the log (`_read_after`), not by
        reading all the history it keeps (which made each call slower as it grew)."""
        name = _history(source_id)
        page = self._storage.log_read(name, after=self._read_after(name, after_epoch_id),
                                      limit=limit)
        epochs = [pb.Epoch.FromString(v) for _, v in page]
        return [e for e in epochs if e.epoch_id > after_epoch_id
                and (up_to_epoch_id == 0 or e.epoch_id <= up_to_epoch_id)]

    def _read_after(self, name: str, epoch_id: int) -> int:
        """The log sequence to read after for the epochs past `epoch_id`: epoch ids grow
        with the log's sequence, so a few one-entry reads find it (an exponential probe,
        then a bisection)."""

        def entry(after: int) -> tuple[int, int] | None:
            """(sequence, epoch id) of the first entry past sequence `after`."""
            found = self._storage.log_read(name, after=after, limit=1)
            return (found[0][0], pb.Epoch.FromString(found[0][1]).epoch_id) if found else None

        first = entry(0)
        if first is None or first[1] > epoch_id:
            return 0
        lo, step = first[0], 1  # the entry at `lo` is at or before `epoch_id`
        while (probe := entry(lo + step - 1)) is not None and probe[1] <= epoch_id:
            lo, step = probe[0], step * 2
        hi = probe[0] if probe is not None else lo + step  # past it, or past the end
        while hi - lo > 1:
            mid = (lo + hi) // 2
            probe = entry(mid - 1)
            if probe is None or probe[0] >= hi or probe[1] > epoch_id:
                hi = mid
            else:
                lo = probe[0]
        return lo


class EpochsServicer(rpc.EpochsServicer):
    def __init__(self, store: EpochStore) -> None:
        self._store = store

    def Record(self, request: pb.Epoch, context: grpc.ServicerContext) -> pb.RecordEpochResponse:
        require(request, "source_id")
        self._store.record(request)
        return pb.RecordEpochResponse()

    def Latest(self, request: pb.LatestEpochRequest, context: grpc.ServicerContext
               ) -> pb.LatestEpochResponse:
        epoch = self._store.latest(request.source_id)
        return pb.LatestEpochResponse(found=epoch is not None, epoch=epoch)

    def Range(self, request: pb.EpochRangeRequest, context: grpc.ServicerContext
              ) -> pb.EpochRangeResponse:
        require(request, "source_id")
        return pb.EpochRangeResponse(epochs=self._store.range(
            request.source_id, request.after_epoch_id, request.up_to_epoch_id,
            request.limit or 1000))
