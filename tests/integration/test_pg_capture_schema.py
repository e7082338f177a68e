"""Schema changes mid-stream: versions on events, drift records, `halt`, new tables."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tailrace.events import ChangeEvent, Op
from tailrace.proto import control_pb2 as pb
from tests.fix_capture import assert_transactions_whole, column

pytestmark = pytest.mark.integration

# (DDL run before the insert, columns of the events after it, type of column c)
STEPS: list[tuple[str, list[str]]] = [
    ("", ["id", "a", "b"]),
    ("ALTER TABLE t ADD COLUMN c numeric(10,2)", ["id", "a", "b", "c"]),
    ("ALTER TABLE t DROP COLUMN b", ["id", "a", "c"]),
    ("ALTER TABLE t RENAME COLUMN a TO a2", ["id", "a2", "c"]),
    ("ALTER TABLE t ALTER COLUMN c TYPE bigint USING c::bigint", ["id", "a2", "c"]),
]


def names(event: ChangeEvent) -> list[str]:
    return [c.name for c in (event.after if event.after.columns else event.before).columns]


def test_add_drop_rename_and_type_change_carry_their_schema_versions(
        pg_db: str, capture_rig: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int, b text)")
    rig = capture_rig(pg_db, "[public.t, public.t_%]")
    capture = rig.start()
    capture.wait_streaming()

    with psycopg.connect(pg_db, autocommit=True) as conn:
        for step, (ddl, _) in enumerate(STEPS, start=1):
            if ddl:
                conn.execute(ddl)
            conn.execute("INSERT INTO t (id) VALUES (%s)", (step,))
        with conn.transaction():  # a DDL and a change in one transaction
            conn.execute("ALTER TABLE t ADD COLUMN d jsonb")
            conn.execute("""INSERT INTO t (id, d) VALUES (6, '{"k": 1}')""")
        conn.execute("UPDATE t SET a2 = 7 WHERE id = 1")

    view = rig.read(lambda v: len(v.events) >= 7, timeout=60)
    events = [e for _, _, e in view.events]
    expected = [cols for _, cols in STEPS] + [["id", "a2", "c", "d"]] * 2
    assert [names(e) for e in events] == expected
    assert [int(column(e.after, "id")) for e in events] == [1, 2, 3, 4, 5, 6, 1]
    assert json.loads(column(events[5].after, "d")) == {"k": 1}
    assert events[6].op == Op.OP_UPDATE and column(events[6].after, "a2") == 7

    types = [next(c.type for c in e.after.columns if c.name == "c") for e in events[1:]]
    assert types == ["numeric(10,2)"] * 3 + ["bigint"] * 3

    versions = rig.control.client.list_schemas("acme", table="public.t")
    assert [v.version for v in versions] == [1, 2, 3, 4, 5, 6]
    by_fingerprint = {v.fingerprint: v for v in versions}
    carried = [by_fingerprint[e.schema_version] for e in events]
    assert [v.version for v in carried] == [1, 2, 3, 4, 5, 6, 6]
    assert all(e.schema_sequence == by_fingerprint[e.schema_version].sequence for e in events)
    assert [e.schema_sequence for e in events] == sorted(e.schema_sequence for e in events)
    assert [c["name"] for c in json.loads(versions[3].schema_json)["columns"]] == \
        ["id", "a2", "c"]
    drift = rig.control.client.list_reconcile_records(rig.source_id)
    assert [r.decision for r in drift] == ["adapt"] * 5
    assert "public.t: structure changed after schema version 1" in drift[0].drift[0]

    # a restart that re-reads the old changes meets old, registered structures: no new
    # drift, the same versions and ids as before
    capture.stop()
    first = rig.control.client.epoch_range(rig.source_id, limit=1)[0]
    rig.checkpoint(first)
    capture = rig.start()
    capture.wait_streaming()
    view = rig.read(lambda v: len(v.events) >= 7 + 6, timeout=60)
    assert_transactions_whole(view, 1, copies=True)
    assert len(rig.control.client.list_reconcile_records(rig.source_id)) == 5
    assert len(rig.control.client.list_schemas("acme", table="public.t")) == 6

    # a new table that matches the patterns is picked up while streaming
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t_new (k text PRIMARY KEY)")
    capture.wait_log("tables added to the publication", timeout=30)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO t_new VALUES ('hello')")
    view = rig.read(lambda v: any(e.table == "t_new" for _, _, e in v.events), timeout=30)
    (new,) = [e for _, _, e in view.events if e.table == "t_new"]
    assert column(new.after, "k") == "hello" and new.schema_sequence > events[-1].schema_sequence


def test_halt_on_drift_stops_with_the_drift_recorded_and_health_failed(
        pg_db: str, capture_rig: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, a int)")
    rig = capture_rig(pg_db, "[public.t]", on_schema_drift="halt")
    capture = rig.start()
    capture.wait_streaming()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (1, 1)")
        rig.read(lambda v: len(v.events) == 1, timeout=30)
        conn.execute("ALTER TABLE t ADD COLUMN b text")
        conn.execute("INSERT INTO t VALUES (2, 2, 'two')")

    assert capture.wait_exit(60) == 1
    assert "spec.source.on_schema_drift is halt" in capture.log()
    (record,) = rig.control.client.list_reconcile_records(rig.source_id)
    assert record.decision == "halt"
    assert "public.t: structure changed after schema version 1; columns now id integer, " \
           "a integer, b text" in record.drift[0]
    health = rig.control.client.get_health(rig.source_id)
    assert health is not None and health.state == pb.HEALTH_FAILED
    assert "schema drift on" in health.reason
    assert len(rig.control.client.list_schemas("acme", table="public.t")) == 1
    view = rig.read(lambda v: True, timeout=10)
    assert [int(column(e.after, "id")) for _, _, e in view.events] == [1]

    # it halts again after a restart, until the operator decides
    capture = rig.start()
    assert capture.wait_exit(60) == 1
    assert len(rig.control.client.list_reconcile_records(rig.source_id)) == 2
