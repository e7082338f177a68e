"""Schema drift under load (issue 16, item 4), on both sources, through the whole pipeline:
a column added, renamed and dropped while transactions keep changing the same rows. Every
change reaches Redis once, per key in source order, and each carries the columns its row
had when it was committed (and the schema version of that structure)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tailrace.devservers import MariaDBServer
from tests.fix_matrix import count_values

pytestmark = pytest.mark.chaos

KEYS = 10
# transactions per phase: before the ALTERs, then after each; the columns each phase's rows have
PHASES = [(range(0, 10), {"id", "v"}), (range(10, 20), {"id", "v", "note"}),
          (range(20, 30), {"id", "v", "memo"}), (range(30, 40), {"id", "v"})]
ALTERS = ["ALTER TABLE acct ADD COLUMN note varchar(20)",
          "ALTER TABLE acct RENAME COLUMN note TO memo",
          "ALTER TABLE acct DROP COLUMN memo"]


def write(run: Callable[[str, list[tuple[Any, ...]]], None], t: int, column: str) -> None:
    """Transaction `t`: every key's v = t (inserted at 0), and the extra column if any."""
    if t == 0:
        run("INSERT INTO acct (id, v) VALUES (%s, 0)", [(k,) for k in range(KEYS)])
    elif column:
        run(f"UPDATE acct SET v = %s, {column} = %s WHERE id = %s",  # noqa: S608 - our column
            [(t, f"{column[0]}{t}", k) for k in range(KEYS)])
    else:
        run("UPDATE acct SET v = %s WHERE id = %s", [(t, k) for k in range(KEYS)])


def run_workload(execute: Callable[[str], None],
                 transaction: Callable[[str, list[tuple[Any, ...]]], None]) -> None:
    for phase, (ts, columns) in enumerate(PHASES):
        if phase:
            execute(ALTERS[phase - 1])
        extra = next(iter(columns - {"id", "v"}), "")
        for t in ts:
            write(transaction, t, extra)


@pytest.mark.matrix(
    scenario="a column added, renamed and dropped mid-workload (PostgreSQL, MariaDB)",
    guarantee="every change once, per key in order, with the columns its row had at commit and one schema "
              "version per structure")
@pytest.mark.parametrize("source", ["postgres", "mariadb"])
def test_a_column_added_renamed_and_dropped_mid_workload_keeps_every_change_and_its_columns(
        counted: Any, source: str, pg_db: str, mariadb_server: MariaDBServer, pg_redis_pipeline: Any) -> None:
    stream = f"drift{uuid.uuid4().hex[:6]}.acct"
    if source == "postgres":
        dsn, tables, source_type = pg_db, "[public.acct]", "postgres"
        conn: Any = psycopg.connect(pg_db, autocommit=True)

        def execute(statement: str) -> None:
            conn.execute(statement)

        def transaction(statement: str, params: list[tuple[Any, ...]]) -> None:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(statement, params)
    else:
        db = f"d_{uuid.uuid4().hex[:10]}"
        mariadb_server.create_database(db)
        dsn, tables, source_type = mariadb_server.dsn(db), f"[{db}.acct]", "mysql"
        conn = mariadb_server.connect(db)
        conn.autocommit(True)

        def execute(statement: str) -> None:
            with conn.cursor() as cur:
                cur.execute(statement)

        def transaction(statement: str, params: list[tuple[Any, ...]]) -> None:
            with conn.cursor() as cur:
                cur.execute("BEGIN")
                cur.executemany(statement, params)
                cur.execute("COMMIT")

    execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    pipeline = pg_redis_pipeline(tables=tables, stream=stream.replace(".acct", ".{table}"),
                                 source_type=source_type, dsn=dsn)
    pipeline.start_all()
    try:
        run_workload(execute, transaction)
    finally:
        conn.close()
    last = PHASES[-1][0][-1]

    def arrived() -> bool:
        entries = pipeline.stream_entries(stream)
        return sum(1 for e in entries if e["after"] and e["after"]["v"] == last) == KEYS

    pipeline.wait_for(arrived, 300, "the last transaction in Redis")
    entries = pipeline.stream_entries(stream)
    per_key: dict[int, list[int]] = {}
    versions: dict[int, set[str]] = {}
    ddl = [e for e in entries if not e["after"]]  # MySQL/MariaDB: the ALTERs as DDL events
    for entry in entries:
        after = entry["after"]
        if not after:
            continue
        per_key.setdefault(after["id"], []).append(after["v"])
        phase = next(i for i, (ts, _) in enumerate(PHASES) if after["v"] in ts)
        assert set(after) == PHASES[phase][1], (after, PHASES[phase][1])
        extra = set(after) - {"id", "v"}
        if extra and after["v"]:
            column = extra.pop()
            assert after[column] == f"{column[0]}{after['v']}", after
        versions.setdefault(phase, set()).add(entry["schema_version"])
    alters = [e for e in ddl if "ALTER TABLE" in json.dumps(e).upper()]
    assert len(alters) == (len(ALTERS) if source == "mariadb" else 0), ddl
    counted(**count_values(per_key, {k: list(range(last + 1)) for k in range(KEYS)}))
    assert per_key == {k: list(range(last + 1)) for k in range(KEYS)}, \
        "each change once, per key in source order"
    assert all(len(v) == 1 for v in versions.values()), versions
    assert len(set().union(*versions.values())) >= 3, "a new schema version per structure"
    pipeline.assert_running()
    print(f"\n{source}: {len(entries) - len(ddl)} changes through ADD, RENAME and DROP COLUMN, each once, "
          f"in order per key, with its row's columns; schema versions per phase: "
          f"{[sorted(v)[0][:8] for _, v in sorted(versions.items())]}")
