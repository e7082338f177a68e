"""Benchmark of the sinks: events/s each, and Kafka exactly-once vs. at-least-once.

    .venv/bin/python bench/bench_sinks.py [--events 20000] [--batch 2000] [--rounds 3]
                                          [--pure-python]

Starts throwaway Redis, NATS, PostgreSQL and noida-db's Kafka, and writes the same
deterministic change stream (transactions of 1-8 rows over two tables) through each
sink as the runtime does: `write(batch, commit)` per batch of whole transactions,
native JSON envelope. Each figure is the median of `--rounds` runs into fresh
streams/topics/tables; the Kafka tiers alternate round by round so that machine
load hits both alike. The envelope encoding rates are printed first: they are part
of every sink's cost. Figures, not assertions: they depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tailrace.devservers import NatsServer, PostgresServer, RedisServer  # noqa: E402
from tailrace.devservers.noida import NoidaKafka  # noqa: E402
from tailrace.envelopes import ENVELOPES, Encoder  # noqa: E402
from tailrace.events import ChangeEvent  # noqa: E402
from tailrace_services.delivery.sinks import Sink, build_sink  # noqa: E402
from tailrace_services.delivery.sinks.base import BatchCommit  # noqa: E402
from tailrace_services.delivery.sinks.exactly_once import ExactlyOnceSink  # noqa: E402
from tests.fix_sinks import batches_of, sink_spec, source_events  # noqa: E402


def timed_run(make: Callable[[str], Sink], batches: list[list[ChangeEvent]]) -> float:
    """Seconds to write every batch through a freshly opened sink. Opening it is not
    counted, nor its clients' one-time start: one event of another table is written first
    (an idempotent Kafka producer's first message waits ~500 ms for its producer id,
    librdkafka's idempotence timer; that made the at-least-once tier look half as fast)."""
    tag = uuid.uuid4().hex[:8]
    sink = make(tag)
    sink.open()
    warm = ChangeEvent()
    warm.CopyFrom(batches[0][0])
    warm.table = "warm"
    if isinstance(sink, ExactlyOnceSink):
        sink.write_unchecked([warm])  # no checkpoint: the batches' first one is still written
    else:
        sink.write([warm])
    started = time.perf_counter()
    for batch in batches:
        sink.write(batch, BatchCommit(pipeline=f"bench{tag}", source_id="src1", sink_id=sink.id,
                                      position=batch[-1].position))
    elapsed = time.perf_counter() - started
    sink.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pure-python", action="store_true",
                        help="encode JSON with the Python twins of _cjson (as without a compiler)")
    args = parser.parse_args()
    if args.pure_python:
        from tailrace.events import _codec

        _codec.cjson = None  # type: ignore[assignment]
    events = source_events(args.events)
    batches = batches_of(events, args.batch)
    n = len(events)
    print(f"{n} events in {len(batches)} batches of ~{args.batch}, median of {args.rounds} rounds")

    for envelope in ENVELOPES:
        encoder = Encoder(envelope)
        started = time.perf_counter()
        for event in events:
            encoder.encode(event)
        print(f"  encode {envelope:<12} {n / (time.perf_counter() - started):>10,.0f} events/s")

    with RedisServer() as rds, NatsServer() as nts, PostgresServer() as pg, NoidaKafka() as kfk:
        makers: dict[str, Callable[[str], Sink]] = {
            "redis streams (MULTI/EXEC + checkpoint)": lambda t: build_sink(sink_spec(
                id="r", type="redis", url=rds.url, stream=f"b{t}.{{table}}")),
            "nats jetstream (Nats-Msg-Id, acks)": lambda t: build_sink(sink_spec(
                id="n", type="nats", url=nts.url, stream=f"B{t}", subject=f"b{t}.{{table}}")),
            "postgresql (upsert + checkpoint row)": lambda t: build_sink(sink_spec(
                id="p", type="postgres", dsn=pg.dsn(), table=f"b{t}_{{table}}")),
        }
        for envelope in ("native", "protobuf"):
            for eos, tier in ((False, "at-least-once"), (True, "exactly-once")):
                makers[f"kafka {tier} ({envelope})"] = (
                    lambda t, eos=eos, envelope=envelope: build_sink(sink_spec(
                        id="k", type="kafka", brokers=kfk.bootstrap, topic=f"b{t}.{{table}}",
                        exactly_once=eos, envelope=envelope)))
        times: dict[str, list[float]] = {name: [] for name in makers}
        for _ in range(args.rounds):
            for name, make in makers.items():  # round-robin: load hits every sink alike
                times[name].append(timed_run(make, batches))
        print()
        rates = {}
        for name, samples in times.items():
            rates[name] = n / statistics.median(samples)
            spread = ", ".join(f"{n / s:,.0f}" for s in samples)
            print(f"  {name:<42} {rates[name]:>10,.0f} events/s   (rounds: {spread})")
        print()
        for envelope in ("native", "protobuf"):
            alo = statistics.median(times[f"kafka at-least-once ({envelope})"])
            eos = statistics.median(times[f"kafka exactly-once ({envelope})"])
            print(f"  kafka exactly-once overhead vs at-least-once, {envelope} envelope: "
                  f"{100 * (eos - alo) / alo:+.1f} % time per event (medians)")
        print("  (DeltaForge reports 7-11 %; the protobuf run is closest to the transport alone)")
        print("\n  fixed cost per batch (one-event batches, median of 50):")
        for eos, tier in ((False, "at-least-once"), (True, "exactly-once")):
            sink = makers[f"kafka {tier} (protobuf)"](uuid.uuid4().hex[:8])
            sink.open()
            samples = []
            for event in events[:51]:
                started = time.perf_counter()
                sink.write([event], BatchCommit(pipeline=f"lat{eos}", source_id="src1",
                                                sink_id=sink.id, position=event.position))
                samples.append(time.perf_counter() - started)
            sink.close()
            print(f"    kafka {tier:<14} {1000 * statistics.median(samples[1:]):6.1f} ms")


if __name__ == "__main__":
    main()
