"""Logical replication against a real throwaway PostgreSQL: stream, decode, confirm, keepalive."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tailrace.devservers import PostgresServer, free_port
from tailrace.errors import ConfigError, NonRetryableError, RetryableError
from tailrace.events import UNCHANGED_TOAST, Value, python_of
from tailrace.events._values import Json
from tailrace_services.capture_postgres.connection import ReplicationConnection, str_to_lsn
from tailrace_services.capture_postgres.errors import SlotMissingError
from tailrace_services.capture_postgres.reader import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    PgOutputDecoder,
    Relation,
    Truncate,
    TypeInfo,
    Update,
)

pytestmark = pytest.mark.integration

BIG = "".join(f"{i:05d}" for i in range(4000))  # 20 kB, stored out of line (TOAST)

SCHEMA = """
CREATE TYPE mood AS ENUM ('happy', 'sad');
CREATE TABLE items (
    id bigint PRIMARY KEY,
    amount numeric(12,2),
    at timestamptz,
    doc jsonb,
    blob bytea,
    uid uuid,
    nums int[],
    tags text[],
    big text,
    label varchar(20),
    feeling mood,
    day date
);
ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE PUBLICATION pub FOR TABLE items;
"""


@pytest.fixture
def sql(pg_db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        yield conn


def collect(
    repl: ReplicationConnection,
    decoder: PgOutputDecoder,
    commits: int,
    timeout: float = 30,
    on_data: Callable[[bytes], None] | None = None,
) -> list[Message]:
    """Read and decode until `commits` Commit messages arrived."""
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    seen = 0
    while seen < commits:
        assert time.monotonic() < deadline, f"only {seen} of {commits} commits: {messages[-5:]}"
        data = repl.read(1.0)
        if data is None:
            continue
        if on_data is not None:
            on_data(data.payload)
        msg = decoder.decode(data.payload)
        if msg is not None:
            messages.append(msg)
            seen += isinstance(msg, Commit)
    return messages


def py(values: list[bytes] | None) -> list[Any] | None:
    """A decoded tuple's serialized `Value`s as the Python values they stand for."""
    return None if values is None else [python_of(Value.FromString(v)) for v in values]


def confirmed_flush(sql: psycopg.Connection[Any], slot: str) -> int:
    row = sql.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    assert row is not None, f"slot {slot} is missing"
    return str_to_lsn(row[0])


def slot_released(sql: psycopg.Connection[Any], slot: str) -> bool:
    """The server ends a closed session's walsender a moment after the client leaves."""
    row = sql.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", [slot]).fetchone()
    return row is not None and not row[0]


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_stream_decodes_changes_and_confirms_flush(
    pg_db: str, sql: psycopg.Connection[Any]
) -> None:
    sql.execute(SCHEMA)
    with ReplicationConnection(pg_db) as repl:
        ident = repl.identify_system()
        assert ident.dbname == conninfo_to_dict(pg_db)["dbname"]
        assert ident.timeline == 1 and ident.system_id.isdigit() and ident.xlogpos > 0
        consistent = repl.create_slot("s1")
        assert isinstance(consistent, int) and consistent >= ident.xlogpos
        assert repl.create_slot("s1") is None  # already there

    with sql.transaction():
        sql.execute(
            "INSERT INTO items VALUES (1, 1234567890.12, '2024-03-01 10:00:00.123456+05:30',"
            ' \'{"b": [1, 2.50], "a": "x"}\', \'\\x00ff10\','
            " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{1,2},{3,NULL}}',"
            " ARRAY['a b', 'c\"d', NULL, 'NULL', 'back\\slash'], %s, 'short', 'happy', 'infinity')",
            [BIG],
        )
        sql.execute("INSERT INTO items (id) VALUES (2)")
    sql.execute("UPDATE items SET amount = amount + 0.01, label = NULL WHERE id = 1")
    sql.execute("DELETE FROM items WHERE id = 2")
    sql.execute("TRUNCATE items")

    decoder = PgOutputDecoder()
    with ReplicationConnection(pg_db) as repl:
        repl.start("s1", "pub")
        messages = collect(repl, decoder, commits=4)

    kinds = [type(m).__name__ for m in messages]
    changes = [m for m in messages if not isinstance(m, TypeInfo | Relation)]
    assert [type(m).__name__ for m in changes] == [
        "Begin", "Insert", "Insert", "Commit",
        "Begin", "Update", "Commit",
        "Begin", "Delete", "Commit",
        "Begin", "Truncate", "Commit",
    ], kinds  # fmt: skip
    assert kinds.index("TypeInfo") < kinds.index("Relation") < kinds.index("Insert")

    # Begin and Commit bracket each transaction and agree on its LSN.
    begins = [m for m in changes if isinstance(m, Begin)]
    commits = [m for m in changes if isinstance(m, Commit)]
    now_us = time.time_ns() // 1000
    for begin, commit in zip(begins, commits, strict=True):
        assert begin.final_lsn == commit.commit_lsn < commit.end_lsn
        assert begin.commit_ts_us == commit.commit_ts_us
        assert 0 <= now_us - commit.commit_ts_us < 300_000_000  # Unix micros, recent
    assert [c.end_lsn for c in commits] == sorted(c.end_lsn for c in commits)

    insert = changes[1]
    assert isinstance(insert, Insert)
    rel = insert.relation
    assert (rel.namespace, rel.name, rel.replica_identity) == ("public", "items", "d")
    assert [rel.type_name(i) for i in range(len(rel.columns))] == [
        "bigint", "numeric(12,2)", "timestamp with time zone", "jsonb", "bytea", "uuid",
        "integer[]", "text[]", "text", "character varying(20)", "mood", "date",
    ]  # fmt: skip
    assert [c.is_key for c in rel.columns] == [True] + [False] * 11
    row = dict(zip([c.name for c in rel.columns], py(insert.new), strict=True))
    assert row["id"] == 1
    assert isinstance(row["amount"], Decimal) and str(row["amount"]) == "1234567890.12"
    assert row["at"] == dt.datetime(2024, 3, 1, 4, 30, 0, 123456, tzinfo=dt.UTC)
    assert row["at"].utcoffset() == dt.timedelta(0)  # the session runs with TimeZone=UTC
    assert isinstance(row["doc"], Json) and row["doc"] == '{"a": "x", "b": [1, 2.50]}'
    assert row["blob"] == b"\x00\xff\x10"
    assert row["uid"] == uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    assert row["nums"] == [[1, 2], [3, None]]
    assert row["tags"] == ["a b", 'c"d', None, "NULL", "back\\slash"]
    assert row["big"] == BIG
    assert row["label"] == "short" and row["feeling"] == "happy" and row["day"] == "infinity"
    second = changes[2]
    assert isinstance(second, Insert)
    assert py(second.new) == [2] + [None] * 11

    update = changes[5]
    assert isinstance(update, Update)
    assert update.old is None and not update.old_is_key_only  # key unchanged
    new = dict(zip([c.name for c in rel.columns], py(update.new), strict=True))
    assert new["amount"] == Decimal("1234567890.13")
    assert new["big"] is UNCHANGED_TOAST  # not touched: the server did not send it
    assert new["label"] is None  # set to NULL: None, never the TOAST marker

    delete = changes[8]
    assert isinstance(delete, Delete)
    assert delete.old_is_key_only and py(delete.old) == [2] + [None] * 11

    truncate = changes[11]
    assert isinstance(truncate, Truncate)
    assert [r.name for r in truncate.relations] == ["items"]
    assert not truncate.cascade and not truncate.restart_identity

    # Confirm the first two transactions; a new session resumes after them.
    wait_for(lambda: slot_released(sql, "s1"), "the first session's walsender to end")
    with ReplicationConnection(pg_db) as repl:
        repl.start("s1", "pub")
        repl.send_status(commits[1].end_lsn, commits[1].end_lsn)
        wait_for(lambda: confirmed_flush(sql, "s1") == commits[1].end_lsn, "confirmed_flush_lsn")
        repl.send_status(commits[1].end_lsn, commits[1].end_lsn)  # a repeat is skipped, harmless
    decoder = PgOutputDecoder()
    wait_for(lambda: slot_released(sql, "s1"), "the second session's walsender to end")
    with ReplicationConnection(pg_db) as repl:
        repl.start("s1", "pub")
        resumed = [m for m in collect(repl, decoder, commits=2) if isinstance(m, Begin | Commit)]
    assert [m.commit_lsn for m in resumed if isinstance(m, Commit)] == [
        c.commit_lsn for c in commits[2:]
    ]


def test_keepalives_are_answered(
    pg_server: PostgresServer, pg_db: str, sql: psycopg.Connection[Any]
) -> None:
    """With wal_sender_timeout at 2 s, an idle stream survives only if keepalives get replies."""
    sql.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    pg_server.execute("ALTER SYSTEM SET wal_sender_timeout = '2s'")
    pg_server.execute("SELECT pg_reload_conf()")
    try:
        with ReplicationConnection(pg_db) as repl, ReplicationConnection(pg_db) as silent:
            repl.create_slot("alive")
            silent.create_slot("silent")
            repl.start("alive", "pub")
            silent.start("silent", "pub")
            idle_until = time.monotonic() + 6  # three timeouts
            while time.monotonic() < idle_until:
                assert repl.read(0.5) is None
            # The silent one never read, so never answered: the server dropped it.
            with pytest.raises(RetryableError, match="replication stream lost|failed"):
                silent.read(2.0)

            sql.execute("INSERT INTO t VALUES (1)")
            messages = collect(repl, PgOutputDecoder(), commits=1)
            assert [py(m.new) for m in messages if isinstance(m, Insert)] == [[1]]
            assert repl.server_wal_end >= messages[-1].end_lsn  # type: ignore[union-attr]
    finally:
        pg_server.execute("ALTER SYSTEM RESET wal_sender_timeout")
        pg_server.execute("SELECT pg_reload_conf()")


def test_errors_are_classified(pg_db: str, sql: psycopg.Connection[Any]) -> None:
    sql.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    # A key=value DSN works as well as a URI.
    params = conninfo_to_dict(pg_db)
    keyvalue = make_conninfo("", **params)
    assert "://" not in keyvalue
    with ReplicationConnection(keyvalue) as repl:
        with pytest.raises(SlotMissingError) as missing:
            repl.start("nope", "pub")
        assert missing.value.slot == "nope"
        assert 'replication slot "nope" does not exist' in str(missing.value)
        with pytest.raises(ConfigError, match="invalid replication slot name"):
            repl.create_slot("Bad-Name")
        repl.create_slot("s1")

    # The server ends the stream (walsender terminated): retryable.
    with ReplicationConnection(pg_db) as repl:
        repl.start("s1", "pub")
        sql.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_replication")
        with pytest.raises(RetryableError, match="terminating connection") as ended:
            while True:
                repl.read(1.0)
        assert not isinstance(ended.value, NonRetryableError)

    # A publication that does not exist fails at the first change: not retryable.
    sql.execute("INSERT INTO t VALUES (1)")
    wait_for(lambda: slot_released(sql, "s1"), "the terminated walsender to end")
    with ReplicationConnection(pg_db) as repl:
        repl.start("s1", "no_such_pub")
        with pytest.raises(NonRetryableError, match='publication "no_such_pub" does not exist'):
            while True:
                repl.read(1.0)

    closed = make_conninfo(pg_db, port=free_port(), password="s3cret-pw")
    with pytest.raises(RetryableError) as lost:
        ReplicationConnection(closed, connect_timeout=2)
    assert "s3cret-pw" not in str(lost.value)
    assert not isinstance(lost.value, NonRetryableError)

    no_role = make_conninfo(pg_db, user="nobody_here", password="s3cret-pw")
    with pytest.raises(NonRetryableError) as denied:
        ReplicationConnection(no_role)
    assert "nobody_here" in str(denied.value) and "s3cret-pw" not in str(denied.value)


def test_decode_rate(pg_db: str, sql: psycopg.Connection[Any]) -> None:
    """Prints the raw pgoutput decode rate; no timing assertion (see bench/ for figures)."""
    rows = 50_000
    sql.execute(
        "CREATE TABLE bench (id int PRIMARY KEY, amount numeric(12,2), name text,"
        " at timestamptz, flag boolean); CREATE PUBLICATION pub FOR TABLE bench"
    )
    with ReplicationConnection(pg_db) as repl:
        repl.create_slot("bench")
    sql.execute(
        "INSERT INTO bench SELECT i, i * 1.25, 'name ' || i, now(), i % 2 = 0"
        f" FROM generate_series(1, {rows}) AS i"
    )
    payloads: list[bytes] = []
    started = time.perf_counter()
    with ReplicationConnection(pg_db) as repl:
        repl.start("bench", "pub")
        collect(repl, PgOutputDecoder(), commits=1, timeout=120, on_data=payloads.append)
    streamed = time.perf_counter() - started

    decoder = PgOutputDecoder()
    started = time.perf_counter()
    inserts = sum(isinstance(decoder.decode(p), Insert) for p in payloads)
    decoded = time.perf_counter() - started
    assert inserts == rows
    print(
        f"\npgoutput decode: {rows / decoded:,.0f} rows/s decode only;"
        f" {rows / streamed:,.0f} rows/s stream + decode ({rows} rows)"
    )
