"""Delivery ownership: one delivery instance per pipeline, the newest claim wins.

Every delivery instance claims its pipeline at start and gets a generation (1, 2, ...).
A batch report carries that generation; the checkpoints move only in the same
compare-and-set that checks the owner record is still the one the report was checked
against. So once a second instance has claimed, the first can no longer commit
anything: it is fenced, as a Kafka producer is by a newer one with its transactional.id.
A newest-wins claim (rather than a lease the newcomer waits for) lets a restarted
instance take over at once from one that hangs or is cut off.
"""

from __future__ import annotations

import time

from tailrace.proto import control_pb2 as pb
from tailrace_services.control.storage import CasConflict, Storage


def owner_key(pipeline: str) -> str:
    return f"owner::{pipeline}"


def describe(owner: pb.DeliveryOwner) -> str:
    return f"{owner.instance or 'unknown instance'} (generation {owner.generation})"


class DeliveryOwners:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def claim(self, pipeline: str, instance: str) -> tuple[pb.DeliveryOwner, pb.DeliveryOwner]:
        """Make `instance` the owner; returns (the new owner, the one it fenced or empty)."""
        while True:
            previous, version = self.get(pipeline)
            owner = pb.DeliveryOwner(pipeline=pipeline, generation=previous.generation + 1,
                                     instance=instance, since_unix_ms=int(time.time() * 1000))
            try:
                self._storage.kv_cas([(owner_key(pipeline), owner.SerializeToString(), version)])
            except CasConflict:
                continue  # two claims raced; claim again on top of the winner
            return owner, previous

    def get(self, pipeline: str) -> tuple[pb.DeliveryOwner, int]:
        """(owner, storage version); generation 0 and version 0 when nobody claimed yet."""
        found = self._storage.kv_get(owner_key(pipeline))
        if found is None:
            return pb.DeliveryOwner(pipeline=pipeline), 0
        return pb.DeliveryOwner.FromString(found[0]), found[1]
