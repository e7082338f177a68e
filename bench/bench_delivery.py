"""Delivery throughput: the Spark job vs. the same batches through a plain Python loop.

Publishes N synthetic change events (transactions of `--tx-size`) to a throwaway
Kafka-protocol broker, then delivers them to a throwaway Redis twice, in the same run:
1. plain loop: read the bus range and call the same delivery runtime (processors,
   batching, fan-out, Redis sink) in this process — the ceiling without Spark;
2. the Spark job (`local[*]`), from its first micro-batch until the checkpoint
   reaches the end; start-up (JVM, session) is reported separately.
Prints events/s for both and the per-micro-batch latency p50/p99.

    .venv/bin/python bench/bench_delivery.py --events 200000
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fix_delivery

import redis

from tailrace.bus import BusReader
from tailrace.config import parse_pipeline
from tailrace.control_client import ControlClient
from tailrace.devservers import KafkaBroker, RedisServer
from tailrace_services.control.server import serve
from tailrace_services.control.storage import MemoryStorage
from tailrace_services.delivery import job as job_module
from tailrace_services.delivery.committer import BatchReport
from tailrace_services.delivery.executor import READ_CHUNK
from tailrace_services.delivery.processors import ProcessorChain
from tailrace_services.delivery.runtime import deliver_slice
from tailrace_services.delivery.sinks import build_sink
from tests.fix_delivery import synthetic_tx


def spec_for(name: str, brokers: str, topic: str, redis_url: str, control: str, batch: int,
             partitions: int = 1):
    return parse_pipeline(f"""
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  source: {{type: postgres, id: syn, dsn: "host=unused", tables: [public.items]}}
  sinks: [{{id: r, type: redis, url: "{redis_url}", stream: "{name}.{{table}}"}}]
  bus: {{brokers: "{brokers}", topic: {topic}, partitions: {partitions}}}
  control: {{address: "{control}"}}
  batch: {{max_events: {batch}, max_ms: 100}}
""")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--tx-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=20_000, help="batch.max_events")
    parser.add_argument("--partitions", type=int, default=1,
                        help="bus.partitions: the Spark job runs a task per partition; "
                             "the plain loop delivers them one after the other")
    parser.add_argument("--profile", metavar="FILE",
                        help="profile the plain loop (cProfile) into FILE (read with "
                             "`python -m pstats FILE`) and skip the Spark job")
    args = parser.parse_args()

    with KafkaBroker() as broker, RedisServer() as red:
        control = serve(MemoryStorage(), "127.0.0.1:0")
        address = f"127.0.0.1:{control.port}"
        client = ControlClient(address)
        topic = "bench-bus"
        parts = args.partitions
        broker.create_topic(topic, parts)
        from tailrace_services.capture.publisher import BusPublisher

        pub = BusPublisher(broker.bootstrap, topic, parts, "syn", client, epoch_ms=50)
        t0 = time.perf_counter()
        n_tx = args.events // args.tx_size
        for seq in range(1, n_tx + 1):
            pub.publish_transaction(synthetic_tx(seq, list(range(args.tx_size))))
        pub.close()
        publish_s = time.perf_counter() - t0
        ends = dict(client.latest_epoch("syn").end_offsets)
        print(f"published {n_tx * args.tx_size} events ({sum(ends.values())} bus records, "
              f"{parts} partition{'s' if parts > 1 else ''}) in {publish_s:.1f} s "
              f"({n_tx * args.tx_size / publish_s:,.0f} events/s)")

        # 1. plain Python loop over the same records, same runtime, same sink type
        plain = spec_for("plain", broker.bootstrap, topic, red.url, address, args.batch, parts)
        sink = build_sink(plain.spec.sinks[0], pipeline="plain")
        t0 = time.perf_counter()
        read_s = 0.0
        delivered = 0
        profiler = cProfile.Profile() if args.profile else None
        for partition, end in sorted(ends.items()):
            r0 = time.perf_counter()
            with BusReader(broker.bootstrap, topic) as reader:  # a new one, as a task's was
                records = list(reader.read_range(partition, 0, end, chunk=READ_CHUNK))
            read_s += time.perf_counter() - r0
            if profiler is not None:
                profiler.enable()
            result = deliver_slice(partition, records, [sink], {"r": None}, pipeline="plain",
                                   source_id="syn", batch=plain.spec.batch,
                                   processors=ProcessorChain([]))
            if profiler is not None:
                profiler.disable()
            delivered += result.delivered["r"]
        loop_s = time.perf_counter() - t0
        print(f"plain loop: {delivered} events in {loop_s:.2f} s "
              f"({delivered / loop_s:,.0f} events/s; bus read {read_s:.2f} s)")
        if profiler is not None:
            profiler.dump_stats(args.profile)
            control.stop()
            return

        # 2. the Spark job
        spark_spec = spec_for("spark", broker.bootstrap, topic, red.url, address, args.batch,
                              parts)
        batch_times: list[float] = []
        batch_events: list[int] = []

        def timed(report: BatchReport, seconds: float) -> None:
            if report.events:
                batch_times.append(seconds)
                batch_events.append(report.events)

        done = threading.Event()
        first_batch_at: list[float] = []

        def watch() -> None:
            while not done.is_set():
                cp = client.get_checkpoint("syn", "r")
                if cp is not None and cp.position.event_index and not first_batch_at:
                    first_batch_at.append(time.perf_counter())
                if cp is not None and cp.position.tx_seq >= n_tx:
                    done.set()
                time.sleep(0.05)

        threading.Thread(target=watch, daemon=True).start()
        t0 = time.perf_counter()
        job_module.run(spark_spec, master="local[*]", stop_after_s=900, stop_when=done.is_set,
                       on_batch=timed)
        total_s = time.perf_counter() - t0
        spark_events = redis.Redis.from_url(red.url).xlen("spark.items")
        steady = sum(batch_times)
        print(f"spark job: {spark_events} events; wall {total_s:.1f} s incl. start-up; "
              f"{len(batch_times)} micro-batches took {steady:.1f} s "
              f"({spark_events / steady:,.0f} events/s in batches)")
        if batch_times:
            print(f"per-batch latency: p50 {statistics.median(batch_times) * 1000:.0f} ms, "
                  f"p99 {percentile(batch_times, 0.99) * 1000:.0f} ms")
        print(f"spark/plain throughput: {(spark_events / steady) / (delivered / loop_s):.2f}")
        if len(batch_times) > 1:  # the first pays the Python workers' start and imports
            warm = sum(batch_events[1:]) / sum(batch_times[1:])
            print(f"after the first batch ({batch_times[0]:.1f} s for {batch_events[0]} events): "
                  f"{warm:,.0f} events/s, spark/plain {warm / (delivered / loop_s):.2f}")
        control.stop()


if __name__ == "__main__":
    main()
