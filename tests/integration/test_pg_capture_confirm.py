"""Defence in depth (issue 12.3): capture confirms its slot only up to what it published.

Control refuses a checkpoint past the latest epoch; this test writes one behind control's
back (straight into its storage, as a bug or a tampered database could) and checks that
capture neither confirms the slot past what it published nor past the server's WAL.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tailrace.proto import control_pb2 as pb
from tailrace_services.capture_postgres.connection import str_to_lsn
from tailrace_services.capture_postgres.position import tx_seq_of
from tailrace_services.control.checkpoints import CheckpointStore
from tests.fix_capture import SINK, slot_row

pytestmark = pytest.mark.integration


def test_a_forged_checkpoint_never_moves_the_slot_past_the_wal(pg_db: str,
                                                                capture_rig: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY)")
    rig = capture_rig(pg_db, "[public.items]")
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT generate_series(1, 10)")
        epoch = rig.wait_epoch(lambda e: e.position.tx_seq > 0)
        rig.checkpoint(epoch)
        (wal,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    # a checkpoint 1e9 bytes past the WAL, written where control keeps checkpoints
    forged = pb.Checkpoint(pipeline=rig.name, source_id=rig.source_id, sink_id=SINK)
    forged.position.tx_seq = tx_seq_of(1, str_to_lsn(wal) + 10**9)
    store = CheckpointStore(rig.control.server.storage)
    store.overwrite(forged, store.get(rig.source_id, SINK).version)

    capture.wait_log("position lost: the sinks' checkpoint", timeout=60)
    _, confirmed = slot_row(pg_db, rig.slot) or ("", 0)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        (now,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    print(f"\nforged checkpoint {forged.position.tx_seq:#x}: slot confirmed at {confirmed:#x}, "
          f"WAL at {now}")
    assert confirmed <= str_to_lsn(now), "the slot never passes the server's WAL"
    assert confirmed <= str_to_lsn(wal), "nor what capture published"
    health = rig.control.client.get_health(rig.source_id)
    assert health is not None and health.state == pb.HEALTH_POSITION_LOST
    assert "past the server's WAL end" in health.reason
