"""How long a delivery driver's Spark session takes to start, with the class-data archive
(`tailrace-spark archive`, what `make setup` writes) and without it ($TAILRACE_SPARK_CDS=off).

Each run is a fresh process, as a delivery start, failover or restart is: the session as
delivery builds it (`spark_session`, local mode), then a first small job.

    .venv/bin/python bench/bench_spark_start.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ONE_RUN = """
import time
t0 = time.monotonic()
from tailrace_services.delivery.job import spark_session
spark = spark_session("bench-start", "local[*]")
t1 = time.monotonic()
spark.range(10).count()
t2 = time.monotonic()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
spark.stop()
"""


def timings(archive: bool, runs: int) -> list[tuple[float, float]]:
    env = dict(os.environ)
    if not archive:
        env["TAILRACE_SPARK_CDS"] = "off"
    out = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", ONE_RUN], env=env, capture_output=True,
                              text=True, check=True)
        session, job = map(float, done.stdout.split()[-2:])
        out.append((session, job))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from tailrace_services.delivery.cluster import class_archive

    if class_archive() is None:
        raise SystemExit("no class-data archive: run `make setup` (tailrace-spark archive)")
    print(f"load average {os.getloadavg()[0]:.2f}; {args.runs} runs each, alternating")
    results: dict[str, list[tuple[float, float]]] = {"with archive": [], "without": []}
    for _ in range(args.runs):  # alternate, so a change in load hits both alike
        results["with archive"] += timings(True, 1)
        results["without"] += timings(False, 1)
    for name, runs in results.items():
        sessions, jobs = [s for s, _ in runs], [j for _, j in runs]
        print(f"{name:>13}: session start median {statistics.median(sessions):.2f} s "
              f"(min {min(sessions):.2f}, max {max(sessions):.2f}); first job median "
              f"{statistics.median(jobs):.2f} s")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
