"""How far a sink is behind its source: the admin's lag fields and the lag metrics.

Everything is measured against the latest epoch, the newest cut of the bus that capture
published and recorded (so a capture that stopped reading shows no lag here; its own
metrics say how far it is behind the server):

- `offsets`: bus records between the checkpoint and the latest epoch, over all partitions;
- `seconds`: the source commit time of the latest epoch's last transaction minus that of
  the last epoch the checkpoint reached (the capture time of the epochs when the source
  did not say);
- `bytes` (PostgreSQL): WAL bytes between the checkpoint's commit LSN and the latest
  epoch's;
- `transactions` (MySQL/MariaDB): source transactions between them (`tx_seq` counts up by
  one per transaction there). Binlog bytes are not derivable across binlog files without
  the server's file sizes, so MySQL lag is counted in transactions.

A sink without a checkpoint (or reset to the earliest position) is measured from the
oldest retained epoch in seconds and bytes — at least that much — and from the first
transaction in transactions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tailrace.bus_generation import offsets_done
from tailrace.events import position_key
from tailrace.proto import control_pb2 as pb

__all__ = ["SinkLag", "sink_lag"]


@dataclass(frozen=True)
class SinkLag:
    offsets: int = 0
    seconds: float = 0.0
    bytes: int | None = None         # PostgreSQL sources
    transactions: int | None = None  # MySQL/MariaDB sources


def sink_lag(cp: pb.Checkpoint | None, latest: pb.Epoch | None, history: Sequence[pb.Epoch],
             source_type: str) -> SinkLag:
    """The lag of one sink whose checkpoint is `cp` (None: never committed); `history`:
    the retained epochs, oldest first."""
    if latest is None:
        return SinkLag()
    read = offsets_done(cp, latest)
    offsets = sum(max(0, end - read.get(p, 0)) for p, end in latest.end_offsets.items())
    started = cp is not None and (cp.position.tx_seq or cp.position.HasField("postgres")
                                  or cp.position.HasField("mysql"))
    if offsets == 0 and cp is not None:
        return SinkLag(bytes=0 if source_type == "postgres" else None,
                       transactions=0 if source_type == "mysql" else None)
    reached = None
    if started:
        assert cp is not None
        reached = next((e for e in reversed(history)
                        if position_key(e.position) <= position_key(cp.position)), None)
    if reached is None and history:  # before the oldest retained epoch: at least this much
        reached = history[0]
    seconds = 0.0 if reached is None else _seconds_between(reached, latest)
    lag_bytes = lag_tx = None
    if source_type == "postgres" and latest.position.HasField("postgres"):
        ref = cp.position if started and cp is not None and cp.position.HasField("postgres") \
            else (reached.position if reached is not None else None)
        if ref is not None and ref.HasField("postgres"):
            lag_bytes = max(0, latest.position.postgres.commit_lsn - ref.postgres.commit_lsn)
    elif source_type == "mysql":
        done = cp.position.tx_seq if started and cp is not None else 0
        lag_tx = max(0, latest.position.tx_seq - done)
    return SinkLag(offsets=offsets, seconds=seconds, bytes=lag_bytes, transactions=lag_tx)


def _seconds_between(older: pb.Epoch, newer: pb.Epoch) -> float:
    """Source commit times when both epochs carry one, else their capture times."""
    if older.source_ts_unix_ms and newer.source_ts_unix_ms:
        return max(0, newer.source_ts_unix_ms - older.source_ts_unix_ms) / 1000
    return max(0, newer.ts_unix_ms - older.ts_unix_ms) / 1000
