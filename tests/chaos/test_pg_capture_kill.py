"""kill -9 of the capture process five times during a stream: nothing is missing downstream.

A fake delivery commits the sink checkpoint to the epoch it saw a second earlier, so at
every kill the bus holds transactions past the checkpoint. The restarted capture resumes
from the checkpoint (the slot confirmed only up to it) and publishes those again: the
bus then holds every change, copies of re-published transactions are identical (same
event ids), and after delivery-style dedup by position each key's changes are there
once, in order.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from tailrace.events import Op
from tailrace_services.capture_postgres.position import confirm_point, lsn_of
from tests.fix_capture import (
    assert_transactions_whole,
    column,
    deduplicated,
    slot_row,
)

pytestmark = pytest.mark.chaos

KILLS = 5
TRANSACTIONS = 400


@pytest.mark.matrix(
    scenario="PostgreSQL capture killed -9 five times by progress while a writer inserts and updates",
    guarantee="no loss: capture resumes from the sinks' checkpoint; re-published transactions are whole "
              "copies with the same ids; the slot never passes the checkpoint")
def test_kill_9_five_times_loses_nothing(counted: Any, pg_db: str, capture_rig: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL)")
    rig = capture_rig(pg_db, "[public.items]", epoch_ms=100)
    capture = rig.start()
    capture.wait_streaming()

    rng = random.Random(9)
    expected: dict[int, list[tuple[str, int]]] = defaultdict(list)
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with psycopg.connect(pg_db, autocommit=True) as conn:
                next_id, values = 1, {}
                for tx in range(TRANSACTIONS):
                    rows = 2000 if tx % 80 == 40 else rng.randint(1, 60)
                    with conn.transaction():
                        conn.execute("INSERT INTO items SELECT g, 0 FROM generate_series("
                                     "%s::bigint, %s::bigint) g", (next_id, next_id + rows - 1))
                        for i in range(next_id, next_id + rows):
                            values[i] = 0
                            expected[i].append(("insert", 0))
                        next_id += rows
                        for i in sorted(rng.sample(range(1, next_id), min(10, next_id - 1))):
                            conn.execute("UPDATE items SET v = v + 1 WHERE id = %s", (i,))
                            values[i] += 1
                            expected[i].append(("update", values[i]))
                    time.sleep(0.04)
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    def deliver() -> None:
        """Checkpoint, one second late, the epoch the capture recorded."""
        seen = None
        while not done.is_set() or seen is not None:
            latest = rig.control.client.latest_epoch(rig.source_id)
            if seen is not None:
                rig.checkpoint(seen)
            seen = latest if not done.is_set() else None
            time.sleep(1.0)

    writer = threading.Thread(target=write)
    delivery = threading.Thread(target=deliver)
    writer.start()
    delivery.start()
    resumed_from: list[int] = []
    for _ in range(KILLS):
        time.sleep(rng.uniform(1.5, 3.0))
        capture.kill()
        slot = slot_row(pg_db, rig.slot)
        checkpoint = rig.sink_checkpoint()
        assert slot is not None
        at = lsn_of(checkpoint.position.tx_seq) if checkpoint is not None else 0
        assert not at or slot[1] <= at, (
            f"the slot confirmed {slot[1]:X} past the sinks' checkpoint {at:X}")
        capture = rig.start()
        capture.wait_streaming()
        resumed = re.findall(r'"resume_after": "([0-9A-F]+)/([0-9A-F]+)"', capture.log())[-1]
        resumed_from.append((int(resumed[0], 16) << 32) | int(resumed[1], 16))
        assert resumed_from[-1] >= at  # resumed from the checkpoint read at (re)start
    writer.join(120)
    delivery.join(30)
    assert not errors, errors

    total = sum(len(v) for v in expected.values())

    def complete(view: Any) -> bool:
        return len(deduplicated(view)) >= total

    view = rig.read(complete, timeout=180)
    kept = deduplicated(view)
    got: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for event in kept:
        op = "insert" if event.op == Op.OP_INSERT else "update"
        got[int(column(event.after, "id"))].append((op, int(column(event.after, "v"))))
    missing = [k for k in expected if got[k] != expected[k]]
    counted(changes_in=total, changes_out=len(kept), order_violations=len(missing),
            outcome=f"{len(view.events) - len(kept)} re-published copies on the bus (same ids)")
    assert not missing, f"{len(missing)} keys differ, e.g. {missing[0]}: {got[missing[0]]} != " \
                        f"{expected[missing[0]]}"
    assert len(kept) == total

    # copies of re-published transactions are whole (or cut short by a kill) and identical
    assert_transactions_whole(view, 1, copies=True, cut_short=KILLS)
    duplicates = len(view.events) - len(kept)
    assert duplicates > 0, "no transaction was published twice: the kills hit nothing in flight"
    assert sum(1 for r in resumed_from if r > 0) >= KILLS - 1, resumed_from

    # the slot confirms exactly up to the last change of the sinks' checkpoint transaction
    # (so that a reconnect re-reads and verifies that transaction), never past it
    checkpoint = rig.sink_checkpoint()
    assert checkpoint is not None
    at = confirm_point(checkpoint.position)
    assert 0 < at < lsn_of(checkpoint.position.tx_seq)
    deadline = time.monotonic() + 10
    while (slot := slot_row(pg_db, rig.slot)) and slot[1] != at:
        assert slot[1] < at
        assert time.monotonic() < deadline, f"slot at {slot[1]:X}, checkpoint {at:X}"
        time.sleep(0.2)
    print(f"{total} changes, {duplicates} re-published copies, resumed from "
          + ", ".join(f"{r:X}" for r in resumed_from))
