"""Where a sink added to a running pipeline starts (issue 18 item 3): `start: now` receives
the changes committed after it was added and none before; `start: snapshot` ends with
exactly the source's rows, though the rows change while it is read; the sink that was there
is not moved (every change once), and the snapshot's reads reach it too. Real processes: a
control service, capture and delivery in managed mode, PostgreSQL, Kafka as the bus, Redis.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.integration

PLACED = '"event": "sink without a checkpoint placed where its spec\'s start says"'


def write(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def rows_of(dsn: str) -> dict[int, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT id, total FROM orders").fetchall())


def ops(pipeline: Any, stream: str, *wanted: str) -> list[int]:
    """The ids of the stream's events of these ops, in stream order."""
    return [(e["after"] or e["before"])["id"] for e in pipeline.stream_entries(stream)
            if e["op"] in wanted]


def folded(pipeline: Any, stream: str) -> dict[int, int]:
    """The rows a consumer of the stream ends with: each event applied in order."""
    rows: dict[int, int] = {}
    for e in pipeline.stream_entries(stream):
        if e["op"] in ("insert", "update", "read"):
            rows[e["after"]["id"]] = e["after"]["total"]
        elif e["op"] == "delete":
            rows.pop(e["before"]["id"], None)
    return rows


def placed(pipeline: Any) -> list[dict[str, Any]]:
    text = (pipeline.dir / "control.log").read_text(errors="replace")
    return [json.loads(line) for line in text.splitlines() if PLACED in line]


def loaded(pipeline: Any, service: str) -> int:
    return pipeline.log_count(service, '"event": "managed pipeline spec loaded"')


def apply(pipeline: Any, text: str, version: int) -> None:
    path = pipeline.dir / f"v{version}.yaml"
    path.write_text(text)
    assert f"configured: version {version}" in pipeline.cli("apply", "-f", str(path))


def test_added_sinks_start_now_or_from_a_snapshot_and_the_sink_there_is_not_moved(
        pg_db: str, pg_redis_pipeline: Any, redis_server: Any) -> None:
    write(pg_db, "CREATE TABLE orders (id int PRIMARY KEY, total int)",
          "INSERT INTO orders SELECT i, i * 10 FROM generate_series(0, 49) i")
    pipeline = pg_redis_pipeline(tables="[public.orders]", stream="start1.{table}",
                                 source="snapshot: {mode: initial, chunk_size: 20}")
    name = pipeline.spec_path.stem
    v1 = pipeline.spec_path.read_text()
    pids = pipeline.start_managed(name)
    write(pg_db, "INSERT INTO orders SELECT i, i * 10 FROM generate_series(50, 99) i",
          "UPDATE orders SET total = -7 WHERE id = 7", "DELETE FROM orders WHERE id = 8")
    pipeline.wait_for(lambda: folded(pipeline, "start1.orders") == rows_of(pg_db), 240,
                      "version 1 delivered")  # so every change so far is in an epoch

    # version 2: a sink that starts now
    r1 = f'{{id: redis1, type: redis, url: "{redis_server.url}", stream: "start1.{{table}}"}}'
    r2 = (f'{{id: redis2, type: redis, url: "{redis_server.url}", stream: "start2.{{table}}", '
          'start: now}')
    assert r1 in v1
    v2 = v1.replace(f"    - {r1}\n", f"    - {r1}\n    - {r2}\n")
    apply(pipeline, v2, 2)
    pipeline.wait_for(lambda: [p["sink"] for p in placed(pipeline)] == ["redis2"], 120,
                      "redis2 placed by a registration of version 2")
    (now,) = placed(pipeline)
    assert now["start"] == "now" and now["after_epoch"] and now["tx"] != "0.0"
    write(pg_db, "INSERT INTO orders SELECT i, i * 10 FROM generate_series(100, 149) i",
          "UPDATE orders SET total = -9 WHERE id = 9", "DELETE FROM orders WHERE id = 10")
    pipeline.wait_for(lambda: len(pipeline.stream_entries("start2.orders")) >= 52, 240,
                      "the changes since redis2 was added")
    pipeline.wait_for(lambda: folded(pipeline, "start1.orders") == rows_of(pg_db), 120,
                      "version 2 delivered to redis1")
    assert Counter(ops(pipeline, "start2.orders", "insert")) == Counter(range(100, 150))
    assert ops(pipeline, "start2.orders", "update") == [9] and \
        ops(pipeline, "start2.orders", "delete") == [10]
    assert len(pipeline.stream_entries("start2.orders")) == 52, "nothing committed before it"

    # version 3: a sink that starts with a snapshot, while rows keep changing
    r3 = (f'{{id: redis3, type: redis, url: "{redis_server.url}", stream: "start3.{{table}}", '
          'start: snapshot}')
    v3 = v2.replace(f"    - {r2}\n", f"    - {r2}\n    - {r3}\n")
    m1_reads = len(ops(pipeline, "start1.orders", "read"))
    stop = threading.Event()

    def keep_writing() -> None:
        i = 150
        while not stop.is_set() and i < 400:
            write(pg_db, f"INSERT INTO orders VALUES ({i}, {i * 10})",
                  f"UPDATE orders SET total = total + 1 WHERE id = {i % 97}",
                  f"DELETE FROM orders WHERE id = {(i * 7) % 150}")
            i += 1
            stop.wait(0.05)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        apply(pipeline, v3, 3)
        pipeline.wait_for(lambda: len(placed(pipeline)) == 2, 120,
                          "redis3 placed by a registration of version 3")
        pipeline.wait_for(lambda: loaded(pipeline, "capture") == loaded(pipeline, "delivery")
                          == 3, 120, "both services on version 3")
        stop.wait(5)
    finally:
        stop.set()
        writer.join()
    snap = placed(pipeline)[1]
    assert (snap["sink"], snap["start"], snap["snapshot_tables"]) == (
        "redis3", "snapshot", ["public.orders"])
    source = rows_of(pg_db)
    pipeline.wait_for(lambda: folded(pipeline, "start3.orders") == source, 240,
                      "redis3 to hold exactly the source's rows")
    pipeline.wait_for(lambda: folded(pipeline, "start1.orders") == folded(
        pipeline, "start2.orders") == source, 120, "the other sinks, the reads included")
    assert folded(pipeline, "start3.orders") == source
    m3_reads = ops(pipeline, "start3.orders", "read")
    assert m3_reads and len(m3_reads) == len(set(m3_reads)), "each row read once"
    assert not set(ops(pipeline, "start3.orders", "insert")) & set(range(150)), \
        "no change committed before redis3 was added"

    # the sinks that were there: every change once, and the snapshot's reads
    inserted = ops(pipeline, "start1.orders", "insert")
    assert len(inserted) == len(set(inserted)) and set(inserted) >= set(
        range(100, max(inserted) + 1)), "redis1: each insert once"  # (50-99: read, maybe)
    assert Counter(ops(pipeline, "start2.orders", "insert")) == Counter(range(100, max(inserted) + 1))
    assert len(ops(pipeline, "start1.orders", "read")) > m1_reads, "the reads reach redis1 too"
    assert len(ops(pipeline, "start2.orders", "read")) == len(m3_reads), "and redis2"
    assert [p["sink"] for p in placed(pipeline)] == ["redis2", "redis3"], \
        "redis2, which has a checkpoint, was not placed again by version 3"
    pipeline.delete_managed(name, pids)
    print(f"\nredis2 (start: now) got the {52} changes after it was added; redis3 (start: "
          f"snapshot) ends with the source's {len(source)} rows ({len(m3_reads)} read); "
          f"redis1 kept every insert once ({len(inserted)})")
