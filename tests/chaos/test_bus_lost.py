"""The bus loses what capture published (the broker restarts empty) mid-workload: capture
notices at its next session that the latest epoch's marker is gone, and publishes again,
from the sinks' checkpoint, onto a new bus generation; delivery notices the new
generation and reads it from its start. Counted: every change in Redis once, per key in
source order.

Before, the control service ignored an epoch whose offsets were behind the latest one:
once the new offsets passed the old ones, delivery took up from there and the sinks'
checkpoints moved past the changes lost with the bus, silently. Then it refused it and
capture stopped for good; now the pipeline heals itself.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tailrace.bus import BusReader
from tailrace.config import load_pipeline
from tailrace.devservers import KafkaBroker
from tests.fix_matrix import count_values
from tests.fix_pipeline import values_per_key, write_account_tx

pytestmark = pytest.mark.chaos

KEYS = 20
TRANSACTIONS = 60  # t = 0 inserts every key, each later one updates them all to v = t
DELIVERED, ON_BUS = 20, 40  # delivered before the loss; on the bus only, lost with it


def on_bus(brokers: str, topic: str) -> int:
    """The highest v the bus holds for every key."""
    seen: dict[int, int] = {}
    with BusReader(brokers, topic, committed_only=False) as reader:
        for message in reader.read_to_end(0, 0, 30):
            record = message.record()
            if record.WhichOneof("record") == "event":
                row = {c.name: c.value.int_value for c in record.event.after.columns}
                seen[row["id"]] = max(seen.get(row["id"], -1), row["v"])
    return min(seen.values()) if len(seen) == KEYS else -1


@pytest.mark.matrix(
    scenario="the bus broker restarted empty with changes on it not yet delivered",
    guarantee="a lost bus loses nothing: capture republishes from the sinks' minimum checkpoint, delivery "
              "goes on from positions")
def test_a_bus_restarted_empty_loses_nothing_and_duplicates_nothing(
        counted: Any, pg_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    with KafkaBroker() as broker, psycopg.connect(pg_db, autocommit=True) as conn:
        pipeline = pg_redis_pipeline(tables="[public.acct]", stream="lost.{table}",
                                     brokers=broker.bootstrap)
        spec = load_pipeline(pipeline.spec_path)
        admin = pipeline.control_client()
        pipeline.start_all()
        url, stream = pipeline.redis_url, "lost.acct"

        def delivered_up_to() -> int:
            return min((max(v) for v in values_per_key(url, stream).values()), default=-1)

        for t in range(DELIVERED):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: delivered_up_to() == DELIVERED - 1, 180,
                          "the first transactions in Redis")
        admin.pause(spec.name, reason="the next transactions stay on the bus")
        pipeline.wait_for(lambda: pipeline.log_count("delivery", "pipeline paused") > 0, 60,
                          "delivery to pause")
        for t in range(DELIVERED, ON_BUS):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: on_bus(broker.bootstrap, spec.bus_topic) == ON_BUS - 1, 60,
                          "the paused transactions on the bus")

        broker.restart()  # in memory: every topic and record is gone
        for t in range(ON_BUS, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
        admin.resume(spec.name)
        pipeline.wait_for(lambda: delivered_up_to() == TRANSACTIONS - 1, 300,
                          "every transaction in Redis after the bus was lost")

        values = values_per_key(url, stream)
        counted(**count_values(values, {k: list(range(TRANSACTIONS)) for k in range(KEYS)}))
        assert values == {k: list(range(TRANSACTIONS)) for k in range(KEYS)}, \
            "each key's values once each, in source order"
        assert pipeline.log_count("capture", "republishing from the sinks' checkpoint") >= 1
        reconcile = admin.list_reconcile_records()
        assert [r.decision for r in reconcile] == ["republish"]
        print(f"\nbus restarted empty holding transactions {DELIVERED}..{ON_BUS - 1} not yet "
              f"delivered: {KEYS * TRANSACTIONS} changes in Redis once each, in order; "
              f"{pipeline.log_count('delivery', 'was replaced')} delivery restart(s) for the "
              "new bus generation")


@pytest.mark.matrix(
    scenario="the bus restarted empty holding snapshot chunks not yet delivered",
    guarantee="the rows of a chunk are not in the source's log: the lost chunks are read "
              "again, the delivered ones not")
def test_snapshot_chunks_lost_with_the_bus_are_read_again(
        counted: Any, pg_db: str, pg_redis_pipeline: Any) -> None:
    """A chunk's rows are not in the source's log, only its watermarks are: chunks on the
    lost bus that the sink had not received are read again, those it had are not. Table a
    is snapshotted and delivered; with delivery paused, table b appears and is
    snapshotted onto the bus; the bus loses it. Each row of both in Redis once."""
    rows, chunk = 1000, 100
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v int NOT NULL)")
        conn.execute(f"INSERT INTO a SELECT g, 0 FROM generate_series(0, {rows - 1}) g")
    with KafkaBroker() as broker, psycopg.connect(pg_db, autocommit=True) as conn:
        pipeline = pg_redis_pipeline(tables="[public.*]", stream="snap.{table}",
                                     brokers=broker.bootstrap,
                                     source=f"snapshot: {{mode: initial, chunk_size: {chunk}}}")
        spec = load_pipeline(pipeline.spec_path)
        admin = pipeline.control_client()
        pipeline.start_all()

        def rows_in(table: str) -> dict[int, list[int]]:
            return values_per_key(pipeline.redis_url, f"snap.{table}")

        pipeline.wait_for(lambda: len(rows_in("a")) == rows, 180, "table a in Redis")
        admin.pause(spec.name, reason="table b's chunks stay on the bus")
        pipeline.wait_for(lambda: pipeline.log_count("delivery", "pipeline paused") > 0, 60,
                          "delivery to pause")
        conn.execute("CREATE TABLE b (id int PRIMARY KEY, v int NOT NULL)")
        conn.execute(f"INSERT INTO b SELECT g, 1 FROM generate_series(0, {rows - 1}) g")
        pipeline.wait_for(lambda: pipeline.log_count("capture", '"done": true') == 2, 120,
                          "table b's snapshot on the bus")

        broker.restart()  # in memory: every topic and record is gone
        admin.resume(spec.name)
        pipeline.wait_for(lambda: len(rows_in("b")) == rows, 300,
                          "table b in Redis after the bus was lost")
        counted(**count_values({**rows_in("a"), **{rows + k: v for k, v in rows_in("b").items()}},
                               {k: [0] for k in range(2 * rows)}))
        assert rows_in("a") == {k: [0] for k in range(rows)}, "a's rows once: not read again"
        assert rows_in("b") == {k: [1] for k in range(rows)}, "b's rows once"
        assert pipeline.log_count("capture", "snapshot chunks lost with the bus") == 1
        print(f"\nbus restarted empty holding table b's snapshot ({rows // chunk} chunks) "
              "not yet delivered: its chunks read again, a's not; each row in Redis once")
