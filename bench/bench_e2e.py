"""End to end: a row's commit on the client to its arrival in the sink, at paced rates.

    .venv/bin/python bench/bench_e2e.py [--source postgres|mariadb] [--sink redis|kafka]
                                        [--rates 1000,2500,5000] [--seconds 60]
                                        [--bulk 200000]

Starts a throwaway source server, a Kafka-protocol broker (the bus; the Kafka sink gets
its own noida-db broker, which keeps transactions correct), Redis, and the pipeline as
`tailrace up` runs it (control, capture, Spark delivery: three processes), then:

1. per rate: a separate writer process inserts rows in transactions of 10, paced to the
   rate for `--seconds`, and reports each transaction's commit time (taken on the
   client, right after COMMIT returned); a reader in this process takes each row's
   arrival in the sink (Redis stream entries; or the Kafka sink's topic, exactly-once,
   read committed) and the difference is the row's latency;
2. bulk: `--bulk` rows committed in one transaction; events/s from that commit to the
   last row's arrival. `--bulk-statements N --bulk-seconds S`: the transaction writes them
   in N INSERTs over S seconds before its COMMIT (a batch job's, open while it writes).

Prints one table (rate, rows, p50, p90, p99, max, missing) and the bulk rate. A rate
whose rows have not all arrived 60 s after the writer stopped counts the rest as
missing. Figures, not assertions: they depend on the machine and its load (printed).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import pymysql  # noqa: E402
import redis  # noqa: E402
from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from tailrace.bus import BusReader  # noqa: E402
from tailrace.config import load_pipeline  # noqa: E402
from tailrace.control_client import ControlClient  # noqa: E402
from tailrace.devservers import (  # noqa: E402
    KafkaBroker,
    MariaDBServer,
    PostgresServer,
    RedisServer,
    free_port,  # noqa: E402
)
from tailrace.devservers.noida import NoidaKafka  # noqa: E402
from tailrace.events import key_bytes  # noqa: E402
from tailrace_services.cli.localauth import local_tokens  # noqa: E402
from tailrace_services.cli.supervisor import Supervisor  # noqa: E402
from tailrace_services.cli.up import HttpPorts, start_pipeline  # noqa: E402

TX_ROWS = 10
DRAIN_S = 60.0

SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: e2e, tenant: bench}}
spec:
  source:
    type: {source}
    id: e2e-src
    dsn: "{dsn}"
    tables: [{table}]
{epoch}  sinks: [{sink}]
  bus: {{brokers: "{brokers}", partitions: {partitions}}}
  control: {{address: "127.0.0.1:{control_port}"}}
{batch}"""
REDIS_SINK = '{{id: out, type: redis, url: "{url}", stream: "e2e"}}'
KAFKA_SINK = '{{id: out, type: kafka, brokers: "{brokers}", topic: "e2e", exactly_once: true}}'


# -- the writer (a separate process) -------------------------------------------------------

def _connect(source: str, dsn: str) -> Any:
    if source == "postgres":
        return psycopg.connect(dsn, autocommit=False)
    return pymysql.connect(**json.loads(dsn), autocommit=False)  # MariaDBServer.connect_kwargs


def write_paced(source: str, dsn: str, first_id: int, rate: int, seconds: float,
                out: Any) -> None:
    """Transactions of TX_ROWS inserts at `rate` rows/s; (first id, rows, commit time) of
    each goes to `out`."""
    conn = _connect(source, dsn)
    started = time.monotonic()
    total = int(rate * seconds)
    sent: list[tuple[int, int, float]] = []
    next_id = first_id
    placeholders = ", ".join(["(%s, %s)"] * TX_ROWS)
    with conn.cursor() as cur:
        for tx in range(total // TX_ROWS):
            ids = range(next_id, next_id + TX_ROWS)
            cur.execute(f"INSERT INTO items (id, payload) VALUES {placeholders}",  # noqa: S608
                        [v for i in ids for v in (i, f"row {i} " + "x" * 40)])
            conn.commit()
            sent.append((next_id, TX_ROWS, time.time()))
            next_id += TX_ROWS
            if len(sent) >= 50:
                out.put(sent)
                sent = []
            ahead = (tx + 1) * TX_ROWS / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    out.put(sent)
    out.put(None)
    conn.close()


# -- the reader (this process) -------------------------------------------------------------

_ID_KEY = b'{"pk":{"id":'  # how the native key of a bench row begins


def row_of(key: bytes | str) -> int | None:
    """The row id an event's message key names; None for a DDL event's (MySQL sends the
    CREATE TABLE). A native key is read without parsing it (a bulk's 200,000 keys took the
    reader ~0.5 s of JSON)."""
    if isinstance(key, bytes) and key.startswith(_ID_KEY):
        end = key.find(b"}", len(_ID_KEY))
        if end > 0 and key[len(_ID_KEY):end].isdigit():
            return int(key[len(_ID_KEY):end])
    pk = json.loads(key)["pk"]
    return int(pk["id"]) if "id" in pk else None


class Arrivals(threading.Thread):
    """Each row's arrival time in the sink, by id."""

    def __init__(self, sink: str, url: str, prefetch: int = 1_000) -> None:
        super().__init__(daemon=True)
        self.sink, self.url, self.prefetch = sink, url, prefetch
        self.at: dict[int, float] = {}
        self.written: dict[int, float] = {}  # when the sink wrote it: stream id, record time
        self.copies = 0  # arrivals of a row seen before
        self.stopped = threading.Event()

    def run(self) -> None:
        if self.sink == "redis":
            self._redis()
        else:
            self._kafka()

    def _note(self, key: bytes | str, written_ms: int, now: float) -> None:
        """`now`: when the read that brought it returned (not when the reader got to it:
        a read of 200,000 messages took the reader seconds to go through)."""
        row = row_of(key)
        if row is not None:
            if row in self.at:
                self.copies += 1
            else:
                self.at[row] = now
                self.written[row] = written_ms / 1000

    def _redis(self) -> None:
        client = redis.Redis.from_url(self.url)
        last = "0-0"
        while not self.stopped.is_set():
            found = client.xread({"e2e": last}, count=10_000, block=200)
            now = time.time()
            for _, entries in found or []:
                for entry_id, fields in entries:  # the id's first part: Redis's clock, ms
                    self._note(fields[b"key"], int(entry_id.split(b"-")[0]), now)
                    last = entry_id

    def _kafka(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.url, "group.id": "bench-e2e",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "isolation.level": "read_committed",
                             # noida-db answers a fetch with the whole committed
                             # transaction, past librdkafka's default limit (100 MB)
                             "receive.message.max.bytes": 1_000_000_000,
                             # librdkafka's default prefetch (100,000 messages) against
                             # noida-db took ~60 % of a core here, away from the pipeline
                             # it measures; 1,000: ~2 % (`--sink-broker noida`)
                             "queued.min.messages": self.prefetch,
                             # ...but a fetch that fills that queue (a transaction of more
                             # than 1,000 messages) postpones the next one by this (default
                             # 1 s): it had added 0-1 s to every row at 5,000 rows/s
                             "fetch.queue.backoff.ms": 10})
        # assigned, not subscribed: the sink creates the topic at its first write, and a
        # subscription to a missing topic waits for the next metadata refresh (minutes)
        partitions: list[int] = []
        while not partitions and not self.stopped.is_set():
            topic = consumer.list_topics("e2e", timeout=5).topics.get("e2e")
            if topic is not None and topic.error is None:
                partitions = sorted(topic.partitions)
            else:
                time.sleep(0.1)
        consumer.assign([TopicPartition("e2e", p, 0) for p in partitions])
        while not self.stopped.is_set():
            # `consume` returns when it has all it asked for or its timeout passed: a longer
            # timeout would count up to itself as latency (it did: 200 ms)
            messages = consumer.consume(10_000, 0.01)
            now = time.time()
            for message in messages:
                if message.error() is None and message.key() is not None:
                    self._note(message.key(), message.timestamp()[1], now)  # its produce()
        consumer.close()


_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _proc_stats() -> dict[int, list[str]]:
    """Each process's /proc/PID/stat fields after its name (field n at index n - 3)."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
    return stats


def _tree(root: int, stats: dict[int, list[str]], apart: frozenset[int]) -> list[int]:
    """`root` and every process below it, but not below the processes `apart`."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(child for child, fields in stats.items()
                    if int(fields[1]) == pid and child not in apart)
    return found


def cpu_seconds(root: int, apart: frozenset[int] = frozenset()) -> float:
    """CPU time (user + system) of `root` and every process below it (Spark's JVM and
    workers under delivery, PostgreSQL's backends under the postmaster), but not below
    the processes `apart` (measured on their own)."""
    stats = _proc_stats()
    total = 0.0
    for pid in _tree(root, stats, apart):
        fields = stats.get(pid)
        if fields is None:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
        if pid == os.getpid():  # and its children that ended (the writer)
            total += (int(fields[13]) + int(fields[14])) / _TICK
    return total


def rss_bytes(root: int, apart: frozenset[int] = frozenset()) -> int:
    """Resident memory of `root` and every process below it (as `cpu_seconds`)."""
    stats = _proc_stats()
    return sum(int(stats[pid][21]) * _PAGE for pid in _tree(root, stats, apart)
               if pid in stats)


class CpuMeter:
    """CPU seconds each named process tree used between `start` and `report`."""

    def __init__(self, roots: dict[str, int | None]) -> None:
        self.roots = {name: pid for name, pid in roots.items() if pid is not None}
        self.before: dict[str, float] = {}
        self.wall = 0.0

    def _now(self) -> dict[str, float]:
        apart = frozenset(self.roots.values())
        return {name: cpu_seconds(pid, apart) for name, pid in self.roots.items()}

    def start(self) -> None:
        self.before = self._now()
        self.wall = time.monotonic()

    def report(self) -> str:
        wall = time.monotonic() - self.wall
        now = self._now()
        used = {name: now[name] - self.before[name] for name in self.roots}
        parts = [f"{name} {seconds / wall:.0%}" for name, seconds in
                 sorted(used.items(), key=lambda item: -item[1])]
        return f"  CPU over {wall:.0f} s (share of one core): " + ", ".join(parts)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def paced_phase(args: argparse.Namespace, dsn: str, arrivals: Arrivals, rate: int,
                first_id: int) -> tuple[list[float], int, int, dict[int, float]]:
    """(latencies in ms, rows written, rows missing, each row's commit time) of one rate."""
    queue: Any = mp.get_context("fork").Queue()
    writer = mp.get_context("fork").Process(
        target=write_paced, args=(args.source, dsn, first_id, rate, args.seconds, queue))
    writer.start()
    committed: dict[int, float] = {}
    while True:
        batch = queue.get()
        if batch is None:
            break
        for start, count, at in batch:
            for i in range(start, start + count):
                committed[i] = at
    writer.join()
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and any(i not in arrivals.at for i in committed):
        time.sleep(0.2)
    latencies = [(arrivals.at[i] - t) * 1000 for i, t in committed.items() if i in arrivals.at]
    return latencies, len(committed), len(committed) - len(latencies), committed


class BusTimes:
    """Each row's change as capture published it: when capture stamped it
    (`ts_captured_micros`, at the commit, right before it is produced to the bus), where it
    lies on the bus, and when the epoch holding it closed (the epoch's `ts_unix_ms`).
    Read after each phase, from where the last read stopped."""

    def __init__(self, brokers: str, topic: str, partitions: int, control: ControlClient,
                 source_id: str) -> None:
        self.reader = BusReader(brokers, topic, client_id="bench-e2e")
        self.control, self.source_id = control, source_id
        self.captured: dict[int, float] = {}
        self.closed: dict[int, float] = {}
        self._next = {p: 0 for p in range(partitions)}  # the next offset to read
        self._epoch_id = 0  # the last epoch read
        self._ends: dict[int, list[tuple[int, float]]] = {}  # partition: (end, closed)

    def read(self) -> None:
        where: dict[int, tuple[int, int]] = {}  # row: partition, offset
        for partition, start in list(self._next.items()):
            for message in self.reader.read_to_end(partition, start, timeout_s=120):
                self._next[partition] = message.offset + 1
                record = message.record()
                row = row_of(key_bytes(record.event)) \
                    if record.WhichOneof("record") == "event" else None
                if row is not None and row not in self.captured:
                    self.captured[row] = record.event.ts_captured_micros / 1_000_000
                    where[row] = partition, message.offset
        while page := self.control.epoch_range(self.source_id, self._epoch_id, 0, 1000):
            for epoch in page:  # in order: each partition's ends ascend
                for partition, end in epoch.end_offsets.items():
                    self._ends.setdefault(partition, []).append((end, epoch.ts_unix_ms / 1000))
            self._epoch_id = page[-1].epoch_id
        for row, (partition, offset) in where.items():
            ends = self._ends.get(partition, [])
            at = bisect.bisect_right(ends, (offset, float("inf")))  # the first end past it
            if at < len(ends):
                self.closed[row] = ends[at][1]

    def close(self) -> None:
        self.reader.close()


def stages(committed: dict[int, float], bus: BusTimes, arrivals: Arrivals) -> str:
    """Where the rows' time went, p50 / p90 / p99 of each stage."""
    captured, closed = bus.captured, bus.closed
    rows = [i for i in committed if i in arrivals.at and i in captured and i in closed]
    if not rows:
        return "  stages: no row seen on the bus and in the sink"
    parts = {
        "commit -> captured": [captured[i] - committed[i] for i in rows],
        "captured -> epoch closed (epoch_ms)": [closed[i] - captured[i] for i in rows],
        "epoch closed -> sink write (acks, Spark, task)": [arrivals.written[i] - closed[i]
                                                           for i in rows],
        "sink write -> read (sink commit, reader)": [arrivals.at[i] - arrivals.written[i]
                                                     for i in rows],
    }
    return f"  stages of {len(rows):,} rows, p50 / p90 / p99 ms: " + "; ".join(
        f"{name} {percentile(v, 0.5) * 1000:.0f} / {percentile(v, 0.9) * 1000:.0f} / "
        f"{percentile(v, 0.99) * 1000:.0f}" for name, v in parts.items())


class Bulk(NamedTuple):
    committed: float  # when the COMMIT returned (time.time())
    ids: range  # the rows
    rate: float  # events/s to the bench's read of the last row, when the wait ended
    missing: int  # then

    def timeline(self, bus: BusTimes, arrivals: Arrivals) -> str:
        """When the first and last rows passed each stage, in s after the commit."""
        moments = {"captured": bus.captured, "epoch closed": bus.closed,
                   "sink write": arrivals.written, "read": arrivals.at}
        parts = []
        for name, times in moments.items():
            seen = [times[i] for i in self.ids if i in times]
            if seen:
                parts.append(f"{name} {min(seen) - self.committed:.2f}-"
                             f"{max(seen) - self.committed:.2f}")
        return "  bulk, s after its commit (first-last row): " + "; ".join(parts)


def insert_range(cur: Any, source: str, first: int, last: int, label: str) -> None:
    """Rows `first`..`last` of `items` in one INSERT, their payload `{label} {id}` (`label`:
    the bench's own word)."""
    if source == "postgres":
        cur.execute(f"INSERT INTO items SELECT g, '{label} ' || g "  # noqa: S608
                    "FROM generate_series(%s::bigint, %s::bigint) g", (first, last))
    else:
        cur.execute(f"INSERT INTO items SELECT seq, CONCAT('{label} ', seq) "  # noqa: S608
                    f"FROM seq_{first}_to_{last}")


def bulk_phase(args: argparse.Namespace, dsn: str, arrivals: Arrivals, first_id: int) -> Bulk:
    ids = range(first_id, first_id + args.bulk)
    conn = _connect(args.source, dsn)
    parts = max(args.bulk_statements, 1)
    started = time.monotonic()
    with conn.cursor() as cur:
        for part in range(parts):  # the transaction stays open while they run, paced
            first, last = ids[len(ids) * part // parts], ids[len(ids) * (part + 1) // parts - 1]
            insert_range(cur, args.source, first, last, "bulk")
            time.sleep(max(0.0, started + args.bulk_seconds * (part + 1) / parts
                           - time.monotonic()))
    conn.commit()
    committed = time.time()
    conn.close()
    deadline = time.monotonic() + DRAIN_S + args.bulk / 5_000
    while time.monotonic() < deadline and any(i not in arrivals.at for i in ids):
        time.sleep(0.2)
    return Bulk(committed, ids, rate_to(committed, ids, arrivals.at),
                sum(i not in arrivals.at for i in ids))


def rate_to(committed: float, ids: range, times: dict[int, float]) -> float:
    """Events/s from `committed` to the last of the rows' `times` (an `Arrivals`'s `at`:
    the bench read them; `written`: the sink's times)."""
    seen = [times[i] for i in ids if i in times]
    return len(seen) / (max(seen) - committed) if seen else 0.0


@dataclass
class Running:
    """A pipeline started as `tailrace up` starts it, with its servers and a reader of the
    sink: what `main`, `bench/soak.py` and `bench/backlog_drain.py` measure."""

    args: argparse.Namespace
    work: Path
    dsn: str
    sup: Supervisor
    arrivals: Arrivals
    roots: dict[str, int | None]  # process trees to measure, by name
    control: ControlClient
    ports: HttpPorts
    spec_path: Path

    def child(self, name: str) -> Any:
        return next(c for c in self.sup.children if c.name == name)


def add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", choices=("postgres", "mariadb"), default="postgres")
    parser.add_argument("--sink", choices=("redis", "kafka"), default="redis")
    parser.add_argument("--max-events", type=int, default=0,
                        help="spec.batch.max_events (default: the spec's default)")
    parser.add_argument("--partitions", type=int, default=1, help="spec.bus.partitions")
    parser.add_argument("--epoch-ms", type=int, default=0,
                        help="spec.source.epoch_ms (default: the spec's default)")
    parser.add_argument("--stream-over", default="",
                        help="spec.source.stream_transactions_over, PostgreSQL (a size, e.g. "
                             "16MiB, or null: no streaming; default: the spec's default)")
    parser.add_argument("--sink-broker", choices=("noida", "tansu"), default="noida",
                        help="the Kafka sink's broker: noida-db filters aborted transactions "
                             "(what the tests need), Tansu does not (a healthy run aborts "
                             "none) and costs a fraction of noida-db's CPU")
    parser.add_argument("--bus", choices=("tansu", "noida"), default="tansu",
                        help="the bus's broker: Tansu keeps topics in memory and its fetch "
                             "slows as a partition grows (docs/performance.md, soak); "
                             "noida-db does not")


@contextlib.contextmanager
def running_pipeline(args: argparse.Namespace, prefix: str) -> Iterator[Running]:
    """Servers, the pipeline (three processes) and the sink's reader, warmed up: a row
    written has arrived. Everything stops on leaving."""
    # SIGTERM unwinds as Ctrl-C does: the servers and the pipeline stop with the bench
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    source_server = PostgresServer() if args.source == "postgres" else MariaDBServer()
    # The Kafka sink is exactly-once: on noida-db, which filters aborted transactions and
    # reports fencing as the tests need (DESIGN.md); the bus stays on Tansu.
    # `--sink-broker tansu`: a broker of compiled code, to tell delivery's cost from
    # noida-db's (a Python broker: up to a core of this machine's two in a bulk)
    sink_broker: Any = contextlib.nullcontext() if args.sink != "kafka" \
        else KafkaBroker() if args.sink_broker == "tansu" else NoidaKafka()
    bus_broker = NoidaKafka() if args.bus == "noida" else KafkaBroker()
    with source_server as source, bus_broker as kafka, RedisServer() as red, \
            sink_broker as out_kafka:
        if isinstance(source, PostgresServer):
            source.execute("CREATE TABLE items (id bigint PRIMARY KEY, payload text)")
            dsn, table = source.dsn(), "public.items"
            spec_dsn = dsn
        else:
            source.execute("CREATE DATABASE bench")
            source.execute("CREATE TABLE bench.items (id bigint PRIMARY KEY, payload text)")
            spec_dsn, table = source.dsn("bench"), "bench.items"
            dsn = json.dumps({**source.connect_kwargs(), "database": "bench"})
        sink = REDIS_SINK.format(url=red.url) if args.sink == "redis" else \
            KAFKA_SINK.format(brokers=out_kafka.bootstrap)
        spec_path = work / "e2e.yaml"
        spec_path.write_text(SPEC.format(source="postgres" if args.source == "postgres" else "mysql",
                                         dsn=spec_dsn, table=table,
                                         sink=sink, brokers=kafka.bootstrap,
                                         control_port=free_port(),
                                         partitions=args.partitions,
                                         epoch=(f"    epoch_ms: {args.epoch_ms}\n"
                                                if args.epoch_ms else "") +
                                         (f"    stream_transactions_over: {args.stream_over}\n"
                                          if args.stream_over else ""),
                                         batch=f"  batch: {{max_events: {args.max_events}}}\n"
                                         if args.max_events else ""))
        spec = load_pipeline(spec_path)
        sup = Supervisor({"TAILRACE_LOG_FORMAT": "json", "TAILRACE_LOG_LEVEL": "info"})
        ports = HttpPorts.from_base(0)
        start_pipeline(sup, spec_path, spec, work, work, ports)
        # on Tansu a prefetch of 1,000 messages held the bulk's read to ~125,000 a second
        # (one fetch each fetch.queue.backoff.ms): 1.6 s of a 7.4 s bulk
        arrivals = Arrivals(args.sink, red.url if args.sink == "redis" else out_kafka.bootstrap,
                            prefetch=20_000 if args.sink_broker == "tansu" else 1_000)
        arrivals.start()
        token = local_tokens(spec, work).admin_file.read_text().strip()
        control = ControlClient(spec.spec.control.address, token=token)
        try:
            running = Running(args, work, dsn, sup, arrivals, {}, control, ports, spec_path)
            warm = _warm_up(args, dsn, arrivals, sup)
            print(f"pipeline up; first row arrived after {warm:.1f} s (Spark start-up); "
                  f"logs in {work}", flush=True)
            running.roots = {**{c.name: c.process.pid if c.process else None
                                for c in sup.children},
                             "source server": source.pid, "broker": kafka.pid,
                             "redis": red.pid}
            if out_kafka is not None:  # a child of this process too: measured on its own
                running.roots["sink broker"] = out_kafka.pid
            yield running
        finally:
            arrivals.stopped.set()
            control.close()
            sup.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pipeline_args(parser)
    parser.add_argument("--rates", default="1000,2500,5000",
                        help="rows per second, comma-separated (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--bulk", type=int, default=200_000, help="0 skips the bulk run")
    parser.add_argument("--bulk-statements", type=int, default=1,
                        help="the bulk's rows in so many INSERTs of its one transaction")
    parser.add_argument("--bulk-seconds", type=float, default=0.0,
                        help="...spread over so many seconds before the COMMIT (a batch job's "
                             "transaction, open while it writes)")
    args = parser.parse_args()
    with running_pipeline(args, "bench-e2e-") as run:
        meter = CpuMeter({**run.roots, "bench (writer, reader)": os.getpid()})
        spec = load_pipeline(run.spec_path)
        bus_times = BusTimes(spec.spec.bus.brokers, spec.bus_topic, args.partitions,
                             run.control, spec.spec.source.id)
        with contextlib.closing(bus_times) as bus:
            rows: list[tuple[str, int, list[float], int]] = []
            first_id = 1_000
            for rate in [int(r) for r in args.rates.split(",") if r]:
                meter.start()
                latencies, written, missing, committed = paced_phase(args, run.dsn, run.arrivals,
                                                                     rate, first_id)
                first_id += written + 1_000
                rows.append((f"{rate:,} rows/s", written, latencies, missing))
                print(_line(*rows[-1]), flush=True)
                print(meter.report(), flush=True)
                bus.read()
                print(stages(committed, bus, run.arrivals), flush=True)
            meter.start()
            bulk = bulk_phase(args, run.dsn, run.arrivals, first_id) if args.bulk else None
            if bulk is not None:
                print(meter.report(), flush=True)
                bus.read()
                print(bulk.timeline(bus, run.arrivals), flush=True)
    print(f"\n{args.source} -> {args.sink}"
          f"{' (exactly-once)' if args.sink == 'kafka' else ''}, transactions of "
          f"{TX_ROWS} rows, {args.seconds:.0f} s per rate; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'rate':>16} {'rows':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'missing':>8}")
    for row in rows:
        print(_line(*row))
    if bulk is not None:
        clock = "the record produced, before its commit" if args.sink == "kafka" else "Redis"
        print(f"bulk: {args.bulk:,} rows in one transaction -> {bulk.rate:,.0f} events/s "
              f"end to end (to the bench's read of the last row), "
              f"{rate_to(bulk.committed, bulk.ids, run.arrivals.written):,.0f} to its write "
              f"in the sink ({clock}), "
              f"{bulk.missing} missing")


def _warm_up(args: argparse.Namespace, dsn: str, arrivals: Arrivals, sup: Supervisor
             ) -> float:
    """Write one row until it arrives: capture streams and Spark runs."""
    started = time.monotonic()
    conn = _connect(args.source, dsn)
    next_id = 1
    while time.monotonic() - started < 300:
        dead = sup.failed()
        if dead is not None:
            raise SystemExit(f"{dead.name} exited: see {dead.log_path}")
        if not any(i in arrivals.at for i in range(1, next_id)):
            with conn.cursor() as cur:
                cur.execute("INSERT INTO items VALUES (%s, 'warm')", (next_id,))
            conn.commit()
            next_id += 1
            time.sleep(1.0)
        else:
            conn.close()
            return time.monotonic() - started
    raise SystemExit("no row arrived in 300 s")


def _line(name: str, written: int, latencies: list[float], missing: int) -> str:
    if not latencies:
        return f"{name:>16} {written:>8,} {'-':>8} {'-':>8} {'-':>8} {'-':>8} {missing:>8,}"
    return (f"{name:>16} {written:>8,} {statistics.median(latencies):>8.0f} "
            f"{percentile(latencies, 0.9):>8.0f} {percentile(latencies, 0.99):>8.0f} "
            f"{max(latencies):>8.0f} {missing:>8,}")


if __name__ == "__main__":
    main()
