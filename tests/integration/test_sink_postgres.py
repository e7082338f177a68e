"""PostgreSQL sink against a real server: replica content, replay, DDL, outage, auth."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from tailrace.config import PostgresSinkSpec
from tailrace.errors import NonRetryableError, RetryableError
from tailrace.events import (
    UNCHANGED_TOAST,
    ChangeEvent,
    Column,
    Op,
    event_to_json_dict,
    value_of,
)
from tailrace_services.delivery.sinks.base import BatchCommit, PerEventError
from tailrace_services.delivery.sinks.postgres import PostgresSink
from tests.fix_sinks import PG_PASSWORD, batches_of, final_state, sink_spec, source_events

pytestmark = pytest.mark.integration


class FollowDdlSpec(PostgresSinkSpec):
    """The spec with the field this sink reads when it exists (see the issue's report)."""

    follow_ddl: bool = False


def make_sink(dsn: str, follow_ddl: bool | None = None, **spec: Any) -> PostgresSink:
    fields = {"id": "pg1", "type": "postgres", "dsn": dsn, **spec}
    parsed = FollowDdlSpec(**fields, follow_ddl=follow_ddl) if follow_ddl is not None \
        else sink_spec(**fields)
    return PostgresSink(parsed, timeout_s=3)


def commit(batch: list[ChangeEvent], pipeline: str = "p") -> BatchCommit:
    return BatchCommit(pipeline=pipeline, source_id="src1", sink_id="pg1",
                       position=batch[-1].position)


def replica(dsn: str) -> dict[tuple[str, int], dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT 'orders', id, amount::text, note, version FROM orders UNION ALL "
            "SELECT 'items', id, amount::text, note, version FROM items").fetchall()
    return {(r[0], r[1]): {"amount": r[2], "note": r[3], "version": r[4]} for r in rows}


def expected(events: list[ChangeEvent]) -> dict[tuple[str, int], dict[str, Any]]:
    return {k: {"amount": v["amount"], "note": v["note"], "version": v["version"]}
            for k, v in final_state(events).items()}


def add_audit(dsn: str) -> None:
    """Count every row the sink applies: a replay that is not skipped shows up here."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE audit (n bigserial, tbl text, op text)")
        conn.execute("CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                     "INSERT INTO audit (tbl, op) VALUES (TG_TABLE_NAME, TG_OP); RETURN NULL; "
                     "END $$")
        for table in ("orders", "items"):
            conn.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, amount numeric(12,2), "
                         "note text, changed_at timestamptz, version bigint)")
            conn.execute(f"CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON {table} "
                         "FOR EACH ROW EXECUTE FUNCTION audit()")


def audited(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM audit").fetchone()[0]  # type: ignore[index]


def test_replica_equals_source_and_checkpoint_commits_with_it(pg_db: str) -> None:
    sink = make_sink(pg_db)
    events = source_events(1500)
    batches = batches_of(events, 300)
    for batch in batches:
        sink.write(batch, commit(batch))
    assert replica(pg_db) == expected(events)
    assert sink.stored_position() == batches[-1][-1].position
    with psycopg.connect(pg_db) as conn:
        row = conn.execute("SELECT position, tx_seq FROM tailrace_checkpoints WHERE pipeline = 'p'"
                           " AND sink_id = 'pg1' AND partition = 0").fetchone()
        types = dict(conn.execute("SELECT column_name, data_type FROM information_schema.columns"
                                  " WHERE table_name = 'orders'").fetchall())
    assert row == (batches[-1][-1].position.SerializeToString(), batches[-1][-1].position.tx_seq)
    assert types["amount"] == "numeric" and types["changed_at"] == "timestamp with time zone"
    sink.close()


def test_a_rewound_sink_applies_again_what_it_had(pg_db: str) -> None:
    """A new rewind generation (an operator's rewind or reset) has its own checkpoint row, so
    the replay is applied again (the audit trigger counts every row written)."""
    add_audit(pg_db)
    sink = make_sink(pg_db)
    batches = batches_of(source_events(200), 100)
    for batch in batches * 2:  # the replay within generation 0 is skipped
        sink.write(batch, commit(batch))
    once = audited(pg_db)
    for batch in batches:
        sink.write(batch, replace(commit(batch), rewind=1))
    assert audited(pg_db) == 2 * once
    assert sink.stored_position(0, rewind=1) == batches[-1][-1].position
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT sink_id FROM tailrace_checkpoints WHERE pipeline = 'p' "
                            "ORDER BY sink_id").fetchall()
    assert rows == [("pg1",), ("pg1#rewind1",)]
    sink.close()


def test_a_replayed_batch_is_not_applied_twice(pg_db: str) -> None:
    add_audit(pg_db)
    events = source_events(600)
    batches = batches_of(events, 100)
    sink = make_sink(pg_db)
    for batch in batches[:3]:
        sink.write(batch, commit(batch))
    sink.close()
    restarted = make_sink(pg_db)  # its control checkpoint is behind: it re-sends everything
    for batch in batches:
        restarted.write(batch, commit(batch))
    assert audited(pg_db) == len(events)  # every row change applied exactly once
    assert replica(pg_db) == expected(events)
    restarted.write(batches[0])  # without a BatchCommit nothing is skipped
    assert audited(pg_db) == len(events) + len(batches[0])


def test_truncate_and_added_columns(pg_db: str) -> None:
    events = source_events(50)
    sink = make_sink(pg_db)
    sink.write(events, commit(events))
    new = source_events(52)[50:]
    for e in new:  # the source table gained a column
        e.after.columns.append(Column(name="colour", type="text", value=value_of("red")))
    if new[0].op == Op.OP_DELETE:
        new = new[1:]
    with pytest.raises(NonRetryableError, match="no column.*colour.*follow_ddl: true"):
        sink.write(new, commit(new))
    following = make_sink(pg_db, follow_ddl=True)
    following.write(new, commit(new))
    with psycopg.connect(pg_db) as conn:
        colours = conn.execute(f"SELECT colour FROM {new[0].table} WHERE colour IS NOT NULL"
                               ).fetchall()
        assert colours
    truncate = source_events(53)[52]
    truncate.op = Op.OP_TRUNCATE
    truncate.table = "orders"
    following.write([truncate], commit([truncate]))
    with psycopg.connect(pg_db) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM items").fetchone() != (0,)


def key_values(event: ChangeEvent) -> tuple[str, int]:
    doc = event_to_json_dict(event)
    return event.table, (doc["before"] if event.op == Op.OP_DELETE else doc["after"])["id"]


def test_rows_the_target_refuses_fail_alone_and_the_rest_is_written(pg_db: str) -> None:
    """A row that breaks a constraint of the target (here a CHECK) fails alone, named with
    the constraint: nothing of the batch is committed by that write, and the rest of it is
    written again without it (what delivery does with the journal on, `fanout._write`)."""
    add_audit(pg_db)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders ADD CONSTRAINT no_poison CHECK (note <> 'poison')")
    events = source_events(300, tables=("orders",))
    last: dict[tuple[str, int], int] = {}
    for i, e in enumerate(events):
        last[key_values(e)] = i
    poison = next(i for i, e in enumerate(events) if e.op == Op.OP_INSERT
                  and last[key_values(e)] == i)
    note = next(c for c in events[poison].after.columns if c.name == "note")
    note.value.CopyFrom(value_of("poison"))
    sink = make_sink(pg_db)
    with pytest.raises(PerEventError) as refused:
        sink.write(events, commit(events))
    assert [i for i, _ in refused.value.failures] == [poison]
    reason = refused.value.failures[0][1]
    assert "no_poison" in reason and "23514" in reason and "public.orders" in reason, reason
    assert audited(pg_db) == 0 and sink.stored_position() is None, "nothing committed"
    rest = events[:poison] + events[poison + 1:]
    sink.write(rest, commit(events))
    assert replica(pg_db) == expected(rest)
    assert audited(pg_db) == len(rest)
    assert sink.stored_position() == events[-1].position
    sink.close()


def test_a_changed_key_keeps_the_values_the_source_did_not_send(pg_db: str) -> None:
    """PostgreSQL sends a key change as the old key and the new row, with unchanged TOAST
    values left out: they must come along from the old row, not turn NULL."""
    events = source_events(2, tables=("orders",), keys=1_000_000)
    first, second = (e for e in events if e.op == Op.OP_INSERT)
    big = "x" * 10_000
    for event in (first, second):
        event.after.columns[2].value.CopyFrom(value_of(big))

    def moved(event: ChangeEvent, new_id: int, note: Any) -> ChangeEvent:
        out = ChangeEvent()
        out.CopyFrom(event)
        out.op = Op.OP_UPDATE
        out.before.columns.add().CopyFrom(event.after.columns[0])  # the old key only
        out.after.columns[0].value.CopyFrom(value_of(new_id))
        out.after.columns[1].value.CopyFrom(value_of(Decimal("9.99")))
        out.after.columns[2].value.CopyFrom(value_of(note))
        out.position.tx_seq += 0x10000
        out.position.postgres.commit_lsn += 0x10000
        return out

    toast = moved(first, 1_000_001, UNCHANGED_TOAST)  # note unchanged: not sent
    whole = moved(second, 1_000_002, "sent")  # every value sent
    sink = make_sink(pg_db)
    sink.write([first, second], commit([first, second]))
    sink.write([toast, whole], commit([toast, whole]))
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT id, amount::text, note FROM orders ORDER BY id").fetchall()
    assert rows == [(1_000_001, "9.99", big), (1_000_002, "9.99", "sent")]
    sink.close()


def test_outage_is_retryable_and_recovers_exactly_once(pg_server: Any, pg_db: str,
                                                       tcp_proxy: Any) -> None:
    add_audit(pg_db)
    proxy = tcp_proxy(pg_server.port)
    dsn = pg_db.replace(f":{pg_server.port}/", f":{proxy.port}/")
    sink = make_sink(dsn)
    events = source_events(400)
    batches = batches_of(events, 100)
    sink.write(batches[0], commit(batches[0]))
    proxy.cut()
    for _ in range(2):  # the write that loses its connection, then a retry that cannot connect
        started = time.monotonic()
        with pytest.raises(Exception) as caught:
            sink.write(batches[1], commit(batches[1]))
        assert isinstance(caught.value, RetryableError), caught.value
        assert time.monotonic() - started < 5
    proxy.restore()
    for batch in batches[1:]:
        sink.write(batch, commit(batch))
    assert audited(pg_db) == len(events)
    assert replica(pg_db) == expected(events)


def test_wrong_password_fails_fast_and_says_what_to_fix(password_pg: Any) -> None:
    wrong = f"x{uuid.uuid4().hex[:6]}"
    sink = make_sink(password_pg.password_dsn(wrong))
    started = time.monotonic()
    with pytest.raises(NonRetryableError) as caught:
        sink.write(source_events(3), None)
    assert time.monotonic() - started < 2
    message = str(caught.value)
    assert "authentication failed" in message and "spec.sinks[].dsn" in message
    assert wrong not in message
    assert isinstance(caught.value, NonRetryableError)
    good = make_sink(password_pg.password_dsn(PG_PASSWORD))
    batch = source_events(3)
    good.write(batch, commit(batch))
    assert good.stored_position() == batch[-1].position
