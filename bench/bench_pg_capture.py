"""Benchmark of capture-postgres: raw pgoutput decoding vs. the service's publish rate.

    .venv/bin/python bench/bench_pg_capture.py [--rows 100000] [--tx-size 100]

Starts a throwaway PostgreSQL, a Kafka-protocol broker and a control service, and
creates two slots before writing `--rows` inserts (in transactions of `--tx-size`):

1. decode: `ReplicationConnection` + `PgOutputDecoder` alone read the backlog from
   the first slot — the ceiling of the Python path;
2. publish: the capture service (`python -m tailrace_services.capture`, a separate
   process) reads the same backlog from its own slot and publishes it: from its
   "streaming" log line until the control service holds the epoch of the last
   transaction (every event acknowledged by the broker).

Prints both rates (rows or events per second) and the capture process's peak RSS.
Figures, not assertions: they depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tailrace.control_client import ControlClient  # noqa: E402
from tailrace.devservers import KafkaBroker, PostgresServer  # noqa: E402
from tailrace_services.capture_postgres.connection import ReplicationConnection  # noqa: E402
from tailrace_services.capture_postgres.position import lsn_of  # noqa: E402
from tailrace_services.capture_postgres.reader import (  # noqa: E402
    Commit,
    Insert,
    PgOutputDecoder,
)
from tailrace_services.control.server import serve  # noqa: E402
from tailrace_services.control.storage import MemoryStorage  # noqa: E402

NAME = "bench"
SLOT = "tailrace_bench"  # the capture service's default for pipeline `bench`
RAW_SLOT = "bench_raw"

SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: {name}, tenant: bench}}
spec:
  source: {{type: postgres, id: bench-src, dsn: "{dsn}", tables: [public.items]{stream}}}
  sinks: [{{id: none, type: redis, url: "redis://127.0.0.1:9"}}]
  bus: {{brokers: "{brokers}"}}
  control: {{address: "{control}"}}
"""


def write_rows(pg: PostgresServer, rows: int, tx_size: int) -> None:
    with pg.connect() as conn:
        for start in range(1, rows + 1, tx_size):
            end = min(start + tx_size - 1, rows)
            conn.execute("INSERT INTO items SELECT g, g %% 1000, 'row ' || g, now(), g * 0.01 "
                         "FROM generate_series(%s::bigint, %s::bigint) g", (start, end))


def decode_rate(dsn: str, rows: int) -> tuple[float, int]:
    """Rows per second of the bare reader + decoder, and the last commit's end LSN."""
    decoder = PgOutputDecoder()
    seen = last_end = 0
    with ReplicationConnection(dsn) as repl:
        repl.start(RAW_SLOT, NAME)
        started = time.perf_counter()
        while seen < rows:
            data = repl.read(1.0)
            if data is None:
                continue
            msg = decoder.decode(data.payload)
            if isinstance(msg, Insert):
                seen += 1
            elif isinstance(msg, Commit):
                last_end = msg.end_lsn
        elapsed = time.perf_counter() - started
        while True:  # the commit of the last transaction
            data = repl.read(1.0)
            if data is None:
                break
            msg = decoder.decode(data.payload)
            if isinstance(msg, Commit):
                last_end = msg.end_lsn
                break
    return rows / elapsed, last_end


def publish_rate(spec: Path, log: Path, control: ControlClient, rows: int, last_end: int,
                 profile: str | None = None) -> tuple[float, int, float, float]:
    """Events per second of the capture service, its peak RSS in kB, the seconds it took and
    the CPU seconds the capture process used (start-up included)."""
    with open(log, "wb") as out:
        wrap = ["-m", "cProfile", "-o", profile] if profile else []
        proc = subprocess.Popen([sys.executable, *wrap, "-m", "tailrace_services.capture",
                                 str(spec)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    filter(None, (os.environ.get("PYTHONPATH"), str(ROOT))))})
    try:
        deadline = time.monotonic() + 600
        while True:
            epoch = control.latest_epoch("bench-src")
            if epoch is not None and lsn_of(epoch.position.tx_seq) >= last_end:
                done = time.time()
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"capture did not finish: see {log}")
            time.sleep(0.02)
        hwm = next(int(line.split()[1]) for line in
                   Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                   if line.startswith("VmHWM:"))
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    finally:
        proc.terminate()
        proc.wait(30)
    started = next(json.loads(line)["timestamp"] for line in log.read_text().splitlines()
                   if '"event": "streaming"' in line)
    start = dt.datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
    return rows / (done - start), hwm, done - start, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--tx-size", type=int, default=100)
    parser.add_argument("--stream-over", default="",
                        help="spec.source.stream_transactions_over (a size, or null: no "
                             "streaming; default: the spec's default)")
    parser.add_argument("--profile", metavar="FILE",
                        help="run the capture under cProfile and write its stats to FILE "
                             "(read with `python -m pstats FILE`); the rate then drops")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-pgc-"))
    with PostgresServer() as pg, KafkaBroker() as kafka:
        server = serve(MemoryStorage(), "127.0.0.1:0")
        control = ControlClient(f"127.0.0.1:{server.port}")
        try:
            pg.execute("CREATE TABLE items (id bigint PRIMARY KEY, n int, label text, "
                       "at timestamptz, amount numeric(12,2))")
            pg.execute(f"CREATE PUBLICATION {NAME} FOR TABLE items")
            pg.execute(f"CREATE PUBLICATION {SLOT} FOR TABLE items")
            for slot in (RAW_SLOT, SLOT):
                pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
            started = time.perf_counter()
            write_rows(pg, args.rows, args.tx_size)
            print(f"wrote {args.rows} rows in transactions of {args.tx_size} "
                  f"in {time.perf_counter() - started:.1f} s")

            rate, last_end = decode_rate(pg.dsn(), args.rows)
            print(f"raw pgoutput decode (ReplicationConnection + PgOutputDecoder): "
                  f"{rate:,.0f} rows/s")

            spec = work / "bench.yaml"
            stream = f", stream_transactions_over: {args.stream_over}" if args.stream_over else ""
            spec.write_text(SPEC.format(name=NAME, dsn=pg.dsn(), brokers=kafka.bootstrap,
                                        stream=stream,
                                        control=f"127.0.0.1:{server.port}"))
            events, hwm, wall, cpu = publish_rate(spec, work / "capture.log", control,
                                                  args.rows, last_end, args.profile)
            print(f"capture service publish rate (decode, build, buffer, publish, epochs): "
                  f"{events:,.0f} events/s ({wall:.1f} s; the capture process used {cpu:.1f} "
                  f"s of CPU; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
            print(f"capture peak RSS (VmHWM): {hwm / 1024:.0f} MB")
        finally:
            control.close()
            server.stop(0)


if __name__ == "__main__":
    main()
