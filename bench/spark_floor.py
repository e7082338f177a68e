"""What a micro-batch costs Spark itself, with nothing to deliver: the floor under delivery.

A Python streaming data source hands out one tiny partition per micro-batch (two numbers)
on a 100 ms trigger, as delivery's `tailrace_bus` source does with its bus ranges; the
`foreachBatch` body is either a plain `collect()`, as delivery runs now (its source's
`read()` is the delivering task) or ONE `mapInArrow(...).collect()` (an identity function
here), as it ran until 2026-11-29 (a second Python worker per task), in a session made as
delivery makes its own (`job.spark_session`, plus `--conf`). Prints, per variant, the
medians of Spark's own `triggerExecution` and `addBatch` and of the body, over the batches
after the first five.

    .venv/bin/python bench/spark_floor.py --seconds 35
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa


def run(variant: str, seconds: float, conf: dict[str, str]) -> None:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Reader(DataSourceStreamReader):
        def __init__(self) -> None:
            self.started = time.time()

        def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
            return {"n": 0}

        def latestOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
            return {"n": int((time.time() - self.started) * 10)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            return [InputPartition(json.dumps([start["n"], end["n"]]).encode())]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            first, last = json.loads(partition.value)
            yield pa.RecordBatch.from_pydict({"v": pa.array([first, last], pa.int64())})

        def commit(self, end: dict[str, int]) -> None:
            pass

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "floor"

        def schema(self) -> str:
            return "v long"

        def streamReader(self, schema: Any) -> Reader:  # noqa: N802 - Spark's name
            return Reader()

    def identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches

    from tailrace_services.delivery.job import spark_session

    spark = spark_session("spark-floor", "local[2]", conf=conf)  # delivery's own settings
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(Source)
    body_ms: list[float] = []

    def body(df: Any, batch_id: int) -> None:
        started = time.perf_counter()
        if variant == "mapInArrow":
            df.mapInArrow(identity, "v long").collect()
        else:
            df.collect()
        body_ms.append((time.perf_counter() - started) * 1000)

    query = (spark.readStream.format("floor").load().writeStream.foreachBatch(body)
             .trigger(processingTime="100 milliseconds").start())
    time.sleep(seconds)
    progress = list(query.recentProgress)[5:]
    query.stop()
    spark.stop()
    trigger = [p["durationMs"].get("triggerExecution", 0) for p in progress]
    add = [p["durationMs"].get("addBatch", 0) for p in progress]
    print(f"{variant:>10}{' ' + str(conf) if conf else ''}: {len(progress)} batches; median triggerExecution "
          f"{statistics.median(trigger):.0f} ms, addBatch {statistics.median(add):.0f} ms, "
          f"foreachBatch body {statistics.median(body_ms[5:]):.0f} ms")
    phases = sorted({key for p in progress for key in p["durationMs"]})
    print("  medians, ms: " + ", ".join(
        f"{key} {statistics.median(p['durationMs'].get(key, 0) for p in progress):.0f}"
        for key in phases))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=35.0)
    parser.add_argument("--variant", choices=("mapInArrow", "collect"), action="append")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting on top of delivery's (repeatable)")
    args = parser.parse_args()
    conf = dict(item.split("=", 1) for item in args.conf)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for variant in args.variant or ["mapInArrow", "collect"]:
        run(variant, args.seconds, conf)


if __name__ == "__main__":
    main()
