"""Managed capture and delivery (issue 18 item 3): `tailrace-capture --managed NAME` and
`tailrace-delivery --managed NAME` run the spec the control service keeps, and load each
version `tailrace apply` stores, without a restart of their processes and without loss: a
table added (its existing rows arrive by snapshot), a sink added, a sink removed; a delete
stops both (exit 0). Counted: every row in each sink it was meant for, no event twice, no
row read twice (`assert_each_row_once`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.integration


def insert(dsn: str, table: str, ids: range) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in ids:
            conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (i, i * 10))


def ids_in(pipeline: Any, stream: str) -> list[int]:
    return [e["after"]["id"] for e in pipeline.stream_entries(stream)
            if e["op"] in ("insert", "read")]


def inserted_and_read(pipeline: Any, stream: str) -> set[int]:
    """The rows that came both as their insert and as a snapshot's read."""
    entries = pipeline.stream_entries(stream)
    return ({e["after"]["id"] for e in entries if e["op"] == "insert"}
            & {e["after"]["id"] for e in entries if e["op"] == "read"})


def assert_each_row_once(pipeline: Any, stream: str, expected: range, before: range) -> None:
    """Every row arrived, no event twice, no row read twice; the rows inserted `before` the
    table was captured only as reads. A row inserted after its table joined the stream
    but before the snapshot's read of it may arrive both as its insert and then as the
    read (docs/snapshots.md: the read carries the same state): two events, neither a
    duplicate."""
    entries = [e for e in pipeline.stream_entries(stream) if e["op"] in ("insert", "read")]
    events = Counter(e["id"] for e in entries)
    assert max(events.values(), default=1) == 1, f"{stream}: an event twice: " \
        f"{sorted(k for k, n in events.items() if n > 1)[:5]}"
    for op in ("insert", "read"):
        per_row = Counter(e["after"]["id"] for e in entries if e["op"] == op)
        assert max(per_row.values(), default=1) == 1, f"{stream}: a row's {op} twice"
    assert sorted({e["after"]["id"] for e in entries}) == list(expected), \
        f"{stream}: every row"
    assert not [e for e in entries if e["op"] == "insert" and e["after"]["id"] in before], \
        f"{stream}: an insert from before capture"
    ops = [(e["after"]["id"], e["op"]) for e in entries]
    assert all(ops.index((row, "insert")) < ops.index((row, "read"))
               for row, op in ops if op == "read" and (row, "insert") in ops), \
        f"{stream}: a row read before its insert"


def loaded(pipeline: Any, service: str) -> int:
    """How many spec versions the service has loaded (the log line of each)."""
    return pipeline.log_count(service, '"event": "managed pipeline spec loaded"')


def test_managed_services_follow_applied_versions_without_restart_or_loss(
        pg_db: str, pg_redis_pipeline: Any, redis_server: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int)")
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, price int)")
    insert(pg_db, "orders", range(0, 50))  # before anything: the snapshot brings them
    insert(pg_db, "items", range(0, 30))
    pipeline = pg_redis_pipeline(tables="[public.orders]", stream="m1.{table}",
                                 source="snapshot: {mode: initial}")
    name = pipeline.spec_path.stem
    v1 = pipeline.spec_path.read_text()
    pids = pipeline.start_managed(name)
    insert(pg_db, "orders", range(50, 100))
    pipeline.wait_for(lambda: len(set(ids_in(pipeline, "m1.orders"))) >= 100, 240, "version 1")

    # version 2: a table and a sink more; rows keep coming while the services reload
    r1 = f'{{id: redis1, type: redis, url: "{redis_server.url}", stream: "m1.{{table}}"}}'
    r2 = f'{{id: redis2, type: redis, url: "{redis_server.url}", stream: "m2.{{table}}"}}'
    assert r1 in v1
    v2 = v1.replace("tables: [public.orders]", "tables: [public.orders, public.items]"
                    ).replace(f"    - {r1}\n", f"    - {r1}\n    - {r2}\n")
    (pipeline.dir / "v2.yaml").write_text(v2)
    assert "configured: version 2" in pipeline.cli("apply", "-f", str(pipeline.dir / "v2.yaml"))
    insert(pg_db, "orders", range(100, 150))
    insert(pg_db, "items", range(30, 60))
    pipeline.wait_for(lambda: len(set(ids_in(pipeline, "m1.items"))) >= 60
                      and len(set(ids_in(pipeline, "m1.orders"))) >= 150
                      and len(ids_in(pipeline, "m2.orders")) >= 50, 240, "version 2")

    # version 3: the first sink removed
    v3 = v2.replace(f"    - {r1}\n", "")
    (pipeline.dir / "v3.yaml").write_text(v3)
    assert "configured: version 3" in pipeline.cli("apply", "-f", str(pipeline.dir / "v3.yaml"))
    pipeline.wait_for(lambda: loaded(pipeline, "delivery") == 3, 120, "delivery on version 3")
    m1_before = len(ids_in(pipeline, "m1.orders"))
    insert(pg_db, "orders", range(150, 200))
    pipeline.wait_for(lambda: 150 <= max(ids_in(pipeline, "m2.orders"), default=0) + 1 >= 200,
                      240, "version 3's rows in the remaining sink")

    for stream, expected, before in (("m1.orders", range(0, 150), range(0, 50)),
                                     ("m1.items", range(0, 60), range(0, 30))):
        assert_each_row_once(pipeline, stream, expected, before)
    assert len(ids_in(pipeline, "m1.orders")) == m1_before, "a removed sink gets nothing more"
    m2 = ids_in(pipeline, "m2.orders")
    assert sorted(set(m2)) == sorted(set(m2) | set(range(100, 200))) and len(m2) == len(set(m2)), \
        "the added sink: everything from its start on, once"
    assert loaded(pipeline, "capture") == loaded(pipeline, "delivery") == 3
    pipeline.delete_managed(name, pids)
    print(f"\nthree versions applied to running services (pids unchanged); m1.orders "
          f"{len(ids_in(pipeline, 'm1.orders'))}, m1.items {len(ids_in(pipeline, 'm1.items'))}, "
          f"m2.orders {len(m2)} (rows both inserted and read: m1.items "
          f"{len(inserted_and_read(pipeline, 'm1.items'))}); "
          "the delete stopped both with exit 0")
