"""Soak: a steady rate for a long time, with each service's memory and the checkpoint lag
sampled, and an exact count at the end.

    .venv/bin/python bench/soak.py [--minutes 30] [--rate 1000] [--sample-s 10]
                                   [--source postgres|mariadb] [--sink redis|kafka]

The pipeline runs as `tailrace up` runs it (`bench_e2e.running_pipeline`). A writer process
inserts rows in transactions of 10 at `--rate` rows/s for `--minutes`; every `--sample-s`
this prints, per service, the resident memory of its process tree (delivery: the JVM and
the Python workers too), the sink's checkpoint lag as the control service reports it, the
rows written but not yet in the sink, and the p99 commit -> sink latency of the rows that
arrived since the last sample. At the end: every row in the sink, once (both sinks are
exactly-once), and each service's memory slope over the run after the first 2 minutes
(least squares, MB per hour). Figures, not assertions.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path
from typing import Any

import bench_e2e
from bench_e2e import Running, percentile, rss_bytes, running_pipeline, write_paced

SETTLE_S = 120.0  # memory slope from here on: start-up and the first batches excluded
DRAIN_S = 120.0


def slope_mb_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per hour."""
    if len(samples) < 3:
        return float("nan")
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    cov = sum((t - mean_t) * (m - mean_m) for t, m in samples)
    return cov / var * 3600 if var else float("nan")


def lag(run: Running) -> str:
    try:
        sinks = run.control.sink_checkpoints("e2e").sinks
    except Exception as e:  # noqa: BLE001 - a sample, not a verdict
        return f"lag ? ({type(e).__name__})"
    return ", ".join(f"{s.sink_id} lag {s.lag_offsets} offsets / {s.lag_seconds:.1f} s"
                     for s in sinks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_e2e.add_pipeline_args(parser)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=1000, help="rows per second")
    parser.add_argument("--sample-s", type=float, default=10.0)
    args = parser.parse_args()
    with running_pipeline(args, "bench-soak-") as run:
        services = ("control", "capture", "delivery")
        apart = frozenset(pid for pid in run.roots.values() if pid is not None)
        memory: dict[str, list[tuple[float, float]]] = {name: [] for name in services}
        committed: dict[int, float] = {}
        queue: Any = mp.get_context("fork").Queue()
        writer = mp.get_context("fork").Process(
            target=write_paced, args=(args.source, run.dsn, 1_000, args.rate,
                                      args.minutes * 60, queue))

        def collect() -> None:
            while (batch := queue.get()) is not None:
                for start, count, at in batch:
                    for i in range(start, start + count):
                        committed[i] = at

        collector = threading.Thread(target=collect, daemon=True)
        started = time.monotonic()
        writer.start()
        collector.start()
        pending: list[int] = []  # rows written, not in the sink yet
        known = 0
        while collector.is_alive():
            time.sleep(args.sample_s)
            dead = run.sup.failed()
            if dead is not None:
                raise SystemExit(f"{dead.name} exited: see {dead.log_path}")
            elapsed = time.monotonic() - started
            mb = {name: rss_bytes(run.roots[name] or 0, apart) / 2**20 for name in services}
            for name in services:
                memory[name].append((elapsed, mb[name]))
            ids = list(committed)
            pending.extend(ids[known:])
            known = len(ids)
            arrived = [i for i in pending if i in run.arrivals.at]
            pending = [i for i in pending if i not in run.arrivals.at]
            recent = [(run.arrivals.at[i] - committed[i]) * 1000 for i in arrived]
            print(f"{elapsed:6.0f} s  " + "  ".join(f"{n} {m:.0f} MB" for n, m in mb.items())
                  + f"  | {lag(run)} | backlog {len(pending):,} rows"
                  + (f" | p99 {percentile(recent, 0.99):.0f} ms" if recent else ""),
                  flush=True)
        writer.join()
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and any(i not in run.arrivals.at for i in committed):
            time.sleep(0.5)
        missing = sum(1 for i in committed if i not in run.arrivals.at)
        latencies = [(run.arrivals.at[i] - t) * 1000 for i, t in committed.items()
                     if i in run.arrivals.at]
        copies = run.arrivals.copies
    print(f"\nsoak: {args.source} -> {args.sink}, {args.rate:,} rows/s for "
          f"{args.minutes:.0f} min; load average {os.getloadavg()[0]:.1f} "
          f"(1 min), {os.getloadavg()[2]:.1f} (15 min) on {os.cpu_count()} cores")
    print(f"rows written {len(committed):,}, in the sink {len(committed) - missing:,}, "
          f"missing {missing:,}, arrived twice {copies:,}")
    if latencies:
        print(f"commit -> sink over the run: p50 {percentile(latencies, 0.5):.0f} ms, "
              f"p99 {percentile(latencies, 0.99):.0f} ms, max {max(latencies):.0f} ms")
    for name, points in memory.items():
        settled = [(t, m) for t, m in points if t >= SETTLE_S]
        if points:
            print(f"{name:>9}: RSS first {points[0][1]:.0f} MB, peak "
                  f"{max(m for _, m in points):.0f} MB, last {points[-1][1]:.0f} MB; slope "
                  f"after {SETTLE_S:.0f} s {slope_mb_per_hour(settled):+.1f} MB/hour")
    print(f"logs in {Path(run.work)}")


if __name__ == "__main__":
    main()
