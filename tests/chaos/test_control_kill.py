"""kill -9 of a real `tailrace-control` (SQLite, WAL, synchronous=NORMAL) while commits are in
flight: every commit it acknowledged is there after the restart, batches stayed whole."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tailrace.control_client import SinkOutcome
from tailrace.errors import TailraceError
from tailrace.proto import control_pb2 as pb
from tests.fix_control import ControlProcess, published

pytestmark = pytest.mark.chaos

ACKNOWLEDGED = 1000


def checkpoint(source: str, sink: str, seq: int) -> pb.Checkpoint:
    cp = pb.Checkpoint(pipeline="orders", source_id=source, sink_id=sink)
    cp.position.tx_seq = seq
    cp.bus_offsets[0] = seq
    return cp


@pytest.mark.matrix(
    scenario="control service killed -9 after 1,000 acknowledged checkpoint commits (SQLite, "
             "synchronous=NORMAL)",
    guarantee="no loss of our own state: every acknowledged commit survives; a batch's checkpoints are "
              "stored whole or not at all")
def test_kill_9_after_1000_acknowledged_commits_loses_none(counted: Any, tmp_path):
    control = ControlProcess(tmp_path, f"sqlite:///{tmp_path / 'state.db'}").start()
    acked = {"batch": 0, "single": 0}
    attempted = {"batch": 0, "single": 0}
    enough = threading.Event()

    def commit_until_killed() -> None:
        with control.client("service", retry_for=0) as c:
            for source in ("batch", "single"):
                published(c, source)
            seq = 0
            try:
                while True:
                    seq += 1
                    # a two-sink batch through the commit policy (one multi-key write) ...
                    attempted["batch"] = seq
                    r = c.report_batch("orders", "batch", "all", [
                        SinkOutcome(s, True, True, checkpoint("batch", s, seq), seq - 1)
                        for s in ("kafka", "redis")])
                    assert r.committed, r.reason
                    acked["batch"] = seq
                    # ... and a single checkpoint through Checkpoints.Commit
                    attempted["single"] = seq
                    ok, current = c.commit_checkpoint(checkpoint("single", "nats", seq), seq - 1)
                    assert ok, current
                    acked["single"] = seq
                    if acked["batch"] + acked["single"] >= ACKNOWLEDGED:
                        enough.set()
            except TailraceError:
                return  # the service is gone

    writer = threading.Thread(target=commit_until_killed)
    writer.start()
    assert enough.wait(120), f"only {acked} commits acknowledged in 120 s"
    control.kill()  # mid-stream: the writer is still committing
    writer.join(30)
    assert not writer.is_alive()
    total = acked["batch"] + acked["single"]
    assert total >= ACKNOWLEDGED

    control.start()
    try:
        with control.client(retry_for=10) as c:
            kafka, redis = (c.get_checkpoint("batch", s) for s in ("kafka", "redis"))
            nats = c.get_checkpoint("single", "nats")
    finally:
        control.stop()
    assert kafka.position.tx_seq == redis.position.tx_seq, "a batch is stored whole or not at all"
    assert kafka.version == kafka.position.tx_seq
    assert acked["batch"] <= kafka.position.tx_seq <= attempted["batch"], \
        "every acknowledged batch survived kill -9"
    assert acked["single"] <= nats.position.tx_seq <= attempted["single"], \
        "every acknowledged commit survived kill -9"
    counted(outcome=f"{total:,} checkpoint commits acknowledged before the kill, every one "
                    "found after the restart")
    print(f"\nkill -9 after {total} acknowledged commits: batch at {kafka.position.tx_seq} "
          f"(acked {acked['batch']}), single at {nats.position.tx_seq} (acked {acked['single']})")
