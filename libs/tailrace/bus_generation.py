"""Bus generations: what offsets mean after the bus lost its records.

Offsets on the bus are only meaningful on the topic they were read from. When a broker
restarts empty or the topic is deleted and made again, capture notices at its next start
(the latest epoch's marker is gone) and publishes again, from the sinks' checkpoints,
onto a new *generation* of the bus: each epoch carries its generation and where that
generation's records begin on each partition (`Epoch.bus_generation`,
`Epoch.generation_start`); each sink checkpoint carries the generation of its offsets.
"""

from __future__ import annotations

from tailrace.proto.control_pb2 import Checkpoint, Epoch

__all__ = ["offsets_done"]


def offsets_done(cp: Checkpoint | None, latest: Epoch | None) -> dict[int, int]:
    """Where a checkpoint's reading of the bus stands, per partition, on the generation of
    `latest` (the latest epoch): its own offsets when they are of that generation, else
    the generation's start (what came before it on the new topic is not ours to read:
    records of the session that was publishing when the bus lost its data)."""
    generation = latest.bus_generation if latest is not None else 0
    if cp is not None and cp.bus_generation == generation:
        return dict(cp.bus_offsets)
    return dict(latest.generation_start) if latest is not None else {}
