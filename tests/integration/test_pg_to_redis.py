"""The first real path: PostgreSQL -> capture -> bus -> Spark delivery -> Redis, three processes."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

import psycopg
import pytest

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE accounts (
    id int PRIMARY KEY,
    owner text NOT NULL,
    balance numeric(20,6),
    opened_at timestamptz,
    note text
);
CREATE TABLE transfers (
    id bigint PRIMARY KEY,
    account_id int NOT NULL,
    amount numeric(12,2) NOT NULL,
    at timestamptz NOT NULL
);
"""


def test_changes_arrive_in_redis_in_order_with_types(pg_db, pg_redis_pipeline):
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(SCHEMA)
    pipeline = pg_redis_pipeline(tables="[public.accounts, public.transfers]")
    pipeline.start_all()

    # (table, key) -> list of (op, after-or-before row) in source order
    expected: dict[tuple[str, int], list[tuple[str, dict | None]]] = defaultdict(list)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'Asia/Kolkata'")
        # single-row transactions
        conn.execute("INSERT INTO accounts VALUES (1, 'ann', 12345678901234.123456, "
                     "'2024-02-29 23:59:59.123456+05:30', NULL)")
        expected[("accounts", 1)].append(("insert", {"balance": "12345678901234.123456",
                                                     "opened_at": "2024-02-29T18:29:59.123456+00:00",
                                                     "note": None}))
        conn.execute("INSERT INTO accounts VALUES (2, 'bob', -0.000001, NULL, 'n')")
        expected[("accounts", 2)].append(("insert", {"balance": "-0.000001", "opened_at": None,
                                                     "note": "n"}))
        # a multi-row transaction over two tables
        with conn.transaction():
            for i in range(1, 21):
                conn.execute("INSERT INTO transfers VALUES (%s, %s, %s, "
                             "'2025-01-01 00:00:00+00')", (i, 1 + i % 2, Decimal(f"{i}.50")))
                expected[("transfers", i)].append(("insert", {"amount": f"{i}.50"}))
            conn.execute("UPDATE accounts SET balance = balance - 210 WHERE id = 1")
            expected[("accounts", 1)].append(("update", {"balance": "12345678901024.123456"}))
        # updates and deletes, several per key, each its own transaction
        for step in range(5):
            conn.execute("UPDATE accounts SET note = %s WHERE id = 2", (f"step {step}",))
            expected[("accounts", 2)].append(("update", {"note": f"step {step}"}))
        conn.execute("DELETE FROM transfers WHERE id <= 3")
        for i in (1, 2, 3):
            expected[("transfers", i)].append(("delete", None))
        conn.execute("DELETE FROM accounts WHERE id = 2")
        expected[("accounts", 2)].append(("delete", None))
    total = sum(len(v) for v in expected.values())

    streams = {"accounts": "tr.{db}.accounts", "transfers": "tr.{db}.transfers"}
    dbname = psycopg.conninfo.conninfo_to_dict(pg_db)["dbname"]
    names = {t: s.format(db=dbname) for t, s in streams.items()}

    def arrived() -> int:
        return sum(len(pipeline.stream_entries(s)) for s in names.values())

    pipeline.wait_for(lambda: arrived() >= total, timeout=240, what=f"{total} events in redis")

    got: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for table, stream in names.items():
        for event in pipeline.stream_entries(stream):
            row = event["after"] if event["op"] != "delete" else event["before"]
            got[(table, row["id"])].append(event)
    assert sum(len(v) for v in got.values()) == total, "exactly as many events as changes"

    for key, changes in expected.items():
        events = got[key]
        assert [e["op"] for e in events] == [op for op, _ in changes], key
        for event, (op, fields) in zip(events, changes, strict=True):
            if op == "delete":
                assert event["after"] is None and event["before"]["id"] == key[1]
                continue
            for column, value in (fields or {}).items():
                assert event["after"][column] == value, (key, column, event["after"])
            assert event["tx"]["size"] >= 1 and event["idempotency_key"].startswith("acme|")
            if op == "update":
                assert event["before"]["id"] == key[1]  # key-only before-image (default identity)
    # the multi-row transaction: 21 events over two tables, one tx id, contiguous indexes
    big = [e for evs in got.values() for e in evs if e["tx"]["size"] == 21]
    assert len(big) == 21 and len({e["tx"]["id"] for e in big}) == 1
    assert sorted(e["tx"]["index"] for e in big) == list(range(21))
    assert sum(e["tx"]["end"] for e in big) == 1
