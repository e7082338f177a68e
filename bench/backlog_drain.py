"""Backlog drain: changes pile up on the bus while delivery is stopped, then drain.

    .venv/bin/python bench/backlog_drain.py [--rows 1000000] [--tx-rows 1000]
                                            [--source postgres|mariadb] [--sink redis|kafka]

The pipeline runs as `tailrace up` runs it (`bench_e2e.running_pipeline`). Delivery is
stopped (SIGTERM), `--rows` rows are inserted in transactions of `--tx-rows`, capture
publishes them to the bus (timed: its own rate), then delivery is started again and drains
the backlog into the sink. Prints the capture rate, the drain rate (from delivery's start,
and from the first row's arrival: without Spark's start-up), each service's peak resident
memory (process trees sampled every second) and the exact count: every row once.
Figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import time
import urllib.request

import bench_e2e
from bench_e2e import Running, _connect, insert_range, rss_bytes, running_pipeline

from tailrace_services.cli.supervisor import service_argv

FIRST_ID = 10_000_000


def published(run: Running) -> int:
    """Change events capture has published (`tailrace_capture_events_total`)."""
    with urllib.request.urlopen(f"{run.ports.url('capture')}/metrics", timeout=10) as r:
        text = r.read().decode()
    return int(sum(float(v) for v in
                   re.findall(r"^tailrace_capture_events_total\{[^}]*\} (\S+)$", text, re.M)))


def write_backlog(args: argparse.Namespace, dsn: str) -> float:
    """Insert the rows; returns the seconds it took."""
    started = time.monotonic()
    conn = _connect(args.source, dsn)
    with conn.cursor() as cur:
        for first in range(FIRST_ID, FIRST_ID + args.rows, args.tx_rows):
            last = min(first + args.tx_rows, FIRST_ID + args.rows) - 1
            insert_range(cur, args.source, first, last, "backlog")
            conn.commit()
    conn.close()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_e2e.add_pipeline_args(parser)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tx-rows", type=int, default=1_000)
    args = parser.parse_args()
    services = ("control", "capture", "delivery")
    with running_pipeline(args, "bench-drain-") as run:
        delivery = run.child("delivery")
        os.killpg(delivery.process.pid, signal.SIGTERM)
        delivery.process.wait(60)
        run.sup.children.remove(delivery)
        before = published(run)
        print(f"delivery stopped; writing {args.rows:,} rows", flush=True)
        wrote_s = write_backlog(args, run.dsn)
        print(f"written in {wrote_s:.1f} s", flush=True)
        started = time.monotonic() - wrote_s
        peak = {name: 0 for name in services}
        apart = frozenset(pid for pid in run.roots.values() if pid is not None)
        while published(run) - before < args.rows:
            for name in ("control", "capture"):
                peak[name] = max(peak[name], rss_bytes(run.roots[name] or 0, apart))
            time.sleep(0.5)
        capture_s = time.monotonic() - started
        print(f"capture published them {capture_s:.1f} s after the first insert", flush=True)

        argv = service_argv("tailrace-delivery", str(run.spec_path), "--http-port",
                            str(run.ports.delivery), "--exit-on-fatal")
        run.sup.start("delivery", argv, run.work / "delivery.log")
        run.roots["delivery"] = run.child("delivery").process.pid
        apart = frozenset(pid for pid in run.roots.values() if pid is not None)
        restarted = time.monotonic()
        ids = range(FIRST_ID, FIRST_ID + args.rows)
        first_at = None
        remaining = list(ids)
        while remaining:
            dead = run.sup.failed()
            if dead is not None:
                raise SystemExit(f"{dead.name} exited: see {dead.log_path}")
            for name in services:
                peak[name] = max(peak[name], rss_bytes(run.roots[name] or 0, apart))
            remaining = [i for i in remaining if i not in run.arrivals.at]
            if first_at is None and len(remaining) < args.rows:
                first_at = min(run.arrivals.at[i] for i in ids if i in run.arrivals.at)
            if time.monotonic() - restarted > 600 + args.rows / 2_000:
                break
            time.sleep(1.0)
        arrived = [run.arrivals.at[i] for i in ids if i in run.arrivals.at]
        copies = run.arrivals.copies
        restarted_wall = time.time() - (time.monotonic() - restarted)
    last = max(arrived)
    print(f"\nbacklog drain: {args.source} -> {args.sink}, {args.rows:,} rows in transactions "
          f"of {args.tx_rows:,}; load average {os.getloadavg()[0]:.1f} (1 min) on "
          f"{os.cpu_count()} cores")
    print(f"capture: {args.rows / capture_s:,.0f} events/s onto the bus (delivery stopped)")
    print(f"drain: {len(arrived) / (last - restarted_wall):,.0f} events/s from delivery's "
          f"start ({last - restarted_wall:.1f} s), "
          f"{len(arrived) / (last - first_at):,.0f} events/s from the first arrival "
          f"({last - first_at:.1f} s; Spark's start-up {first_at - restarted_wall:.1f} s)")
    print(f"count: {len(arrived):,} of {args.rows:,} in the sink, "
          f"{args.rows - len(arrived):,} missing, {copies:,} arrived twice")
    print("peak RSS (capture: while publishing the backlog too): " + ", ".join(f"{n} {b / 2**20:.0f} MB"
                                                   for n, b in peak.items()))
    print(json.dumps({"logs": str(run.work)}))


if __name__ == "__main__":
    main()
