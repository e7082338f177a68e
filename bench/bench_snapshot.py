"""Benchmark of snapshots: the server's own read rate vs. capture's snapshot rate.

    .venv/bin/python bench/bench_snapshot.py [--source postgres|mariadb] [--rows 1000000]
                                             [--chunk-size 10000] [--writer 1000]
                                             [--tables 1] [--parallelism 2]

Starts a throwaway PostgreSQL (or MariaDB), a Kafka-protocol broker and a control service,
fills one table of mixed types (bigint key, int, text, timestamp, numeric, JSON, boolean,
uuid) with `--rows` rows, then:

1. ceiling: the chunk query alone (`SELECT ... ORDER BY id LIMIT n` after the last key;
   PostgreSQL: every value as the server's text, nothing converted; MariaDB: PyMySQL's
   own conversion, rows streamed with an unbuffered cursor as capture reads them) — what
   reading costs;
2. snapshot: the capture service (`snapshot.mode: initial_only`, a separate process) reads
   the table in watermarked chunks, converts, merges and publishes every row, then exits:
   rows per second from its "streaming" log line to its exit, with its peak RSS.

`--writer N` updates random rows during the snapshot, N transactions of 5 updates per
second. `--tables N` (PostgreSQL) spreads the rows over N tables, which capture reads
`--parallelism` at a time (`snapshot.parallelism`). Figures, not assertions: they depend
on the machine and its load (printed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import pymysql  # noqa: E402
import pymysql.cursors  # noqa: E402
from psycopg.types.string import TextLoader  # noqa: E402

from tailrace.devservers import KafkaBroker, MariaDBServer, PostgresServer, TcpProxy  # noqa: E402
from tailrace_services.control.server import serve  # noqa: E402
from tailrace_services.control.storage import MemoryStorage  # noqa: E402

SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: bench, tenant: bench}}
spec:
  source:
    type: {source}
    id: bench-src
    dsn: "{dsn}"
    tables: [{table}]
    snapshot: {{mode: initial_only, chunk_size: {chunk}, parallelism: {parallelism}}}
  sinks: [{{id: none, type: redis, url: "redis://127.0.0.1:9"}}]
  bus: {{brokers: "{brokers}"}}
  control: {{address: "{control}"}}
"""
TABLE = """CREATE TABLE {name} (id bigint PRIMARY KEY, n int, label text, at timestamptz,
  amount numeric(12,2), doc jsonb, flag boolean, uid uuid)"""
FILL = """INSERT INTO {name} SELECT g, g %% 1000, 'row ' || g, now() - g * interval '1 s',
  g * 0.01, jsonb_build_object('g', g, 'tags', jsonb_build_array('a', 'b')), g %% 2 = 0,
  md5(g::text)::uuid FROM generate_series(%s::bigint, %s::bigint) g"""


MARIADB_TABLE = """CREATE TABLE bench.items (id bigint PRIMARY KEY, n int, label varchar(40),
  at datetime(6), amount decimal(12,2), doc json, flag boolean, uid uuid)"""
MARIADB_FILL = """INSERT INTO bench.items SELECT seq, seq % 1000, CONCAT('row ', seq),
  NOW(6) - INTERVAL seq SECOND, seq * 0.01, JSON_OBJECT('g', seq, 'tags', JSON_ARRAY('a', 'b')),
  seq % 2 = 0, UUID() FROM bench.seq_{start}_to_{end}"""


def mariadb_ceiling(server: MariaDBServer, rows: int, chunk: int) -> float:
    """Rows per second of the chunk queries alone, read as capture reads them."""
    conn = server.connect("bench")
    started = time.perf_counter()
    last, seen = 0, 0
    with conn.cursor(pymysql.cursors.SSCursor) as cur:
        while True:
            cur.execute("SELECT * FROM items WHERE id > %s ORDER BY id LIMIT %s", (last, chunk))
            got = 0
            for row in cur.fetchall_unbuffered():
                got += 1
                last = row[0]
            if not got:
                break
            seen += got
    conn.close()
    assert seen == rows, (seen, rows)
    return rows / (time.perf_counter() - started)


class MariadbWriter(threading.Thread):
    def __init__(self, server: MariaDBServer, rows: int, rate: int) -> None:
        super().__init__(daemon=True)
        self.server, self.rows, self.rate = server, rows, rate
        self.stopped = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        """`rate` transactions of 5 updates per second (5 x rate rows/s)."""
        rng = random.Random(1)
        started = time.monotonic()
        conn = self.server.connect("bench")
        with conn.cursor() as cur:
            while not self.stopped.is_set():
                cur.execute("BEGIN")
                for _ in range(5):
                    cur.execute("UPDATE items SET n = n + 1 WHERE id = %s",
                                (rng.randint(1, self.rows),))
                cur.execute("COMMIT")
                self.transactions += 1
                ahead = self.transactions / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        conn.close()


def ceiling(dsn: str, tables: list[str], rows: int, chunk: int) -> float:
    """Rows per second of the chunk queries alone (one table after the other), values as
    text."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor()
        for oid in (20, 23, 25, 1184, 1700, 3802, 16, 2950):
            cur.adapters.register_loader(oid, TextLoader)
        started = time.perf_counter()
        seen = 0
        for table in tables:
            last = "0"
            while True:
                got = cur.execute(f"SELECT * FROM {table} WHERE id > %s::bigint ORDER BY id "
                                  "LIMIT %s", (last, chunk)).fetchall()
                if not got:
                    break
                seen += len(got)
                last = got[-1][0]
        assert seen == rows, (seen, rows)
        return rows / (time.perf_counter() - started)


class Writer(threading.Thread):
    def __init__(self, dsn: str, rows: int, rate: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rows, self.rate = dsn, rows, rate
        self.stopped = threading.Event()
        self.transactions = 0

    def run(self) -> None:
        """`rate` transactions of 5 updates per second (5 x rate rows/s)."""
        rng = random.Random(1)
        started = time.monotonic()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stopped.is_set():
                with conn.transaction():
                    for _ in range(5):
                        conn.execute("UPDATE items SET n = n + 1 WHERE id = %s",
                                     (rng.randint(1, self.rows),))
                self.transactions += 1
                ahead = self.transactions / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)


def snapshot(spec: Path, log: Path, writer: Writer | MariadbWriter | None,
             profile: str | None = None) -> tuple[float, float, int, int]:
    """(rows/s, seconds, peak RSS in kB, writer transactions) of capture's snapshot."""
    hwm = 0
    with open(log, "wb") as out:
        command = [sys.executable, "-m", "tailrace_services.capture", str(spec)]
        if profile and profile.endswith(".prof"):
            command[1:1] = ["-m", "cProfile", "-o", profile]
        elif profile:  # every thread's stacks, sampled (py-spy, `pip install py-spy`)
            command[:0] = [str(Path(sys.executable).parent / "py-spy"), "record", "--threads",
                           "--format", "raw", "--rate", "200", "--output", profile, "--"]
        proc = subprocess.Popen(command,
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    filter(None, (os.environ.get("PYTHONPATH"), str(ROOT))))})
    if writer is not None:
        writer.start()
    deadline = time.monotonic() + 1800
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            hwm = max(hwm, next(int(line.split()[1]) for line in status.splitlines()
                                if line.startswith("VmHWM:")))
        except (OSError, StopIteration):
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the snapshot did not finish: see {log}")
        time.sleep(0.1)
    ended = time.time()
    if writer is not None:
        writer.stopped.set()
        writer.join(10)
    if proc.returncode != 0:
        raise SystemExit(f"capture exited with {proc.returncode}: see {log}")
    started = next(json.loads(line)["timestamp"] for line in log.read_text().splitlines()
                   if '"event": "streaming"' in line)
    start = dt.datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    done = sum(json.loads(line)["rows_done"] for line in log.read_text().splitlines()
               if '"event": "snapshot progress"' in line and '"done": true' in line)
    return done / (ended - start), ended - start, hwm, writer.transactions if writer else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=("postgres", "mariadb"), default="postgres")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=10_000)
    parser.add_argument("--tables", type=int, default=1,
                        help="PostgreSQL: spread the rows over this many tables (items, "
                             "items_2, ...), read `--parallelism` at a time")
    parser.add_argument("--parallelism", type=int, default=2,
                        help="snapshot.parallelism: readers at once (tables, and key ranges "
                             "of one table)")
    parser.add_argument("--link-delay-ms", type=float, default=0.0, metavar="MS",
                        help="PostgreSQL: capture (and the ceiling's queries) reach the server "
                             "through a proxy that holds every 64 kB it forwards this long, "
                             "each way: a remote server whose every connection is slow")
    parser.add_argument("--writer", type=int, default=0, metavar="TX_PER_S",
                        help="update random rows during the snapshot: this many transactions "
                             "of 5 updates per second")
    parser.add_argument("--profile", metavar="FILE",
                        help="FILE.prof: run the capture under cProfile (its main thread "
                             "only; read with `python -m pstats FILE`); any other name: "
                             "sample every thread with py-spy into collapsed stacks; the "
                             "rate then drops")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-snap-"))
    if args.source == "mariadb":
        run_mariadb(args, work)
        return
    with PostgresServer() as pg, KafkaBroker() as kafka:
        server = serve(MemoryStorage(), "127.0.0.1:0")
        try:
            tables = ["items"] + [f"items_{n}" for n in range(2, args.tables + 1)]
            per_table = args.rows // len(tables)
            started = time.perf_counter()
            for table in tables:
                pg.execute(TABLE.format(name=table))
                for start in range(1, per_table + 1, 100_000):
                    pg.execute(FILL.format(name=table), [start, min(start + 99_999, per_table)])
                pg.execute(f"VACUUM ANALYZE {table}")
            print(f"filled {', '.join(tables)} with {per_table * len(tables):,} rows of 8 "
                  f"columns in {time.perf_counter() - started:.1f} s")
            dsn = pg.dsn()
            if args.link_delay_ms:
                proxy = TcpProxy(pg.port).start()
                proxy.slow(args.link_delay_ms / 1000)
                dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
                print(f"capture reaches the server through a link that holds each 64 kB "
                      f"{args.link_delay_ms} ms each way")
            rate = ceiling(dsn, tables, per_table * len(tables), args.chunk_size)
            print(f"ceiling: the chunk queries alone, values as text: {rate:,.0f} rows/s")
            spec = work / "bench.yaml"
            spec.write_text(SPEC.format(source="postgres", dsn=dsn,
                                        table=", ".join(f"public.{t}" for t in tables),
                                        brokers=kafka.bootstrap, chunk=args.chunk_size,
                                        parallelism=args.parallelism,
                                        control=f"127.0.0.1:{server.port}"))
            writer = Writer(pg.dsn(), per_table, args.writer) if args.writer else None
            report(*snapshot(spec, work / "capture.log", writer, args.profile), args.writer)
        finally:
            server.stop(0)


def run_mariadb(args: argparse.Namespace, work: Path) -> None:
    with MariaDBServer() as maria, KafkaBroker() as kafka:
        server = serve(MemoryStorage(), "127.0.0.1:0")
        try:
            maria.execute("CREATE DATABASE bench")
            maria.execute(MARIADB_TABLE)
            started = time.perf_counter()
            for start in range(1, args.rows + 1, 100_000):
                maria.execute(MARIADB_FILL.format(start=start,
                                                  end=min(start + 99_999, args.rows)))
            maria.execute("ANALYZE TABLE bench.items")
            print(f"filled bench.items with {args.rows:,} rows of 8 columns in "
                  f"{time.perf_counter() - started:.1f} s")
            rate = mariadb_ceiling(maria, args.rows, args.chunk_size)
            print(f"ceiling: the chunk queries alone, PyMySQL's values: {rate:,.0f} rows/s")
            spec = work / "bench.yaml"
            spec.write_text(SPEC.format(source="mysql", dsn=maria.dsn(), table="bench.items",
                                        brokers=kafka.bootstrap, chunk=args.chunk_size,
                                        parallelism=args.parallelism,
                                        control=f"127.0.0.1:{server.port}"))
            writer = MariadbWriter(maria, args.rows, args.writer) if args.writer else None
            report(*snapshot(spec, work / "capture.log", writer, args.profile), args.writer)
        finally:
            server.stop(0)


def report(rows_s: float, took: float, hwm: int, txs: int, writer: int) -> None:
    print(f"capture snapshot (read, convert, merge, publish, cursor per chunk): "
          f"{rows_s:,.0f} rows/s ({took:.1f} s"
          f"{f'; {txs:,} writer transactions of 5 updates meanwhile' if writer else ''}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"capture peak RSS (VmHWM): {hwm / 1024:.0f} MB")

if __name__ == "__main__":
    main()
