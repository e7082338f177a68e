"""Poison under load (issue 16, item 4): a change the sink refuses goes to the dead-letter
queue while the rest flows, and `tailrace dlq replay` after the fix delivers it once.

The sink is a PostgreSQL replica whose table has a CHECK the source's does not: rows with a
negative value break it (SQLSTATE 23514). With the journal on, those rows fail alone
(`PerEventError`, named with the constraint) and are dead-lettered; every other change of
the same batches is written, in source order, once (an audit trigger on the replica counts
each row written). The operator then drops the constraint and replays the queue through
the pipeline's own spec: each poison row arrives once and the replica equals the source.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from tests.fix_matrix import count_values
from tests.fix_pipeline import write_account_tx

pytestmark = pytest.mark.chaos

KEYS = 20
TRANSACTIONS = 40
POISON_EVERY = 4  # a transaction of poison rows after every fourth account transaction


def rows(dsn: str) -> dict[int, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT id, v FROM acct").fetchall())  # type: ignore[arg-type]


@pytest.mark.matrix(
    scenario="rows the PostgreSQL sink refuses (a CHECK) among a workload, journal on; then dlq replay "
             "after the fix",
    guarantee="poison goes to the DLQ named with its reason while the rest flows once in order; dlq replay "
              "delivers each once")
def test_rows_the_sink_refuses_are_dead_lettered_while_the_rest_flows_and_replayed_once(
        counted: Any, pg_db: str, pg_server: Any, pg_redis_pipeline: Any) -> None:
    replica = pg_server.create_database(f"r_{uuid.uuid4().hex[:12]}")
    with psycopg.connect(replica, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL, "
                     "CONSTRAINT v_not_negative CHECK (v >= 0))")
        conn.execute("CREATE TABLE audit (n bigserial, id int, v int)")
        conn.execute("CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                     "INSERT INTO audit (id, v) VALUES (NEW.id, NEW.v); RETURN NULL; END $$")
        conn.execute("CREATE TRIGGER audit AFTER INSERT OR UPDATE ON acct FOR EACH ROW "
                     "EXECUTE FUNCTION audit()")
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    pipeline = pg_redis_pipeline(
        tables="[public.acct]", sink=f'{{id: pg1, type: postgres, dsn: "{replica}"}}',
        extra="  journal: {enabled: true, max_entries: 1000}\n")
    pipeline.start_all()
    poison: list[int] = []
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
            if t % POISON_EVERY == POISON_EVERY - 1:  # new keys, never changed afterwards
                keys = [1000 + len(poison) + i for i in range(3)]
                with conn.transaction():
                    conn.cursor().executemany("INSERT INTO acct VALUES (%s, %s)",
                                              [(k, -k) for k in keys])
                poison += keys
    control = pipeline.control_client()
    name = pipeline.spec_path.stem
    source = rows(pg_db)
    good = {k: v for k, v in source.items() if v >= 0}
    pipeline.wait_for(lambda: rows(replica) == good, 300,
                      "every change but the poison rows in the replica")
    pipeline.wait_for(lambda: control.dlq_count(name) == len(poison), 60,
                      "the poison rows in the dead-letter queue")
    entries = control.dlq_list(name)
    reasons = {e.reason for e in entries}
    assert all("v_not_negative" in r and "23514" in r for r in reasons), reasons
    with psycopg.connect(replica) as conn:
        written = conn.execute("SELECT id, v FROM audit ORDER BY n").fetchall()
    per_key: dict[int, list[int]] = {}
    for key, value in written:
        per_key.setdefault(key, []).append(value)
    counted(**count_values(per_key, {k: list(range(TRANSACTIONS)) for k in range(KEYS)}),
            outcome=f"{len(poison)} poison rows dead-lettered, then replayed once each")
    assert per_key == {k: list(range(TRANSACTIONS)) for k in range(KEYS)}, \
        "each good change written once, per key in source order; no poison row"
    pipeline.assert_running()

    with psycopg.connect(replica, autocommit=True) as conn:
        conn.execute("ALTER TABLE acct DROP CONSTRAINT v_not_negative")
    out = pipeline.cli("dlq", "replay", name, "--spec", str(pipeline.spec_path))
    assert f"replayed {len(poison)} dead letter(s)" in out, out
    assert rows(replica) == source
    assert control.dlq_count(name) == 0
    with psycopg.connect(replica) as conn:
        replayed = conn.execute("SELECT id, count(*) FROM audit WHERE id >= 1000 GROUP BY id"
                                ).fetchall()
    assert dict(replayed) == {k: 1 for k in poison}, "each poison row written once"  # type: ignore[arg-type]
    pipeline.assert_running()
    print(f"\n{KEYS * TRANSACTIONS} changes written once each, in order per key, while "
          f"{len(poison)} poison rows (CHECK v_not_negative) went to the dead-letter queue; "
          f"after the constraint was dropped, `tailrace dlq replay` wrote each of them once; "
          f"the replica equals the source ({len(source)} rows)")
