"""`tailrace demo` (what `make run` runs): everything on loopback, changes arriving live.

Starts a throwaway PostgreSQL (wal_level=logical), a Kafka-protocol broker,
Redis and NATS on free ports, writes a sample pipeline spec, starts control,
capture and delivery as separate processes, makes changes in PostgreSQL and
prints them as they arrive in the Redis streams. Ctrl-C (or --duration)
stops it all and removes the throwaway servers.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import cast

import redis
from redis.typing import KeyT, StreamIdT

from tailrace.config import load_pipeline
from tailrace.devservers import (
    DevServer,
    KafkaBroker,
    NatsServer,
    PostgresServer,
    RedisServer,
    free_port,
)
from tailrace.logs import ENV_FORMAT, ENV_LEVEL
from tailrace.stopping import call_on_stop_signals
from tailrace_services.cli.supervisor import Supervisor
from tailrace_services.cli.up import HttpPorts, exit_message, start_pipeline

FIRST_EVENTS_WITHIN_S = 300  # Spark's start on a busy machine, with room to spare

SCHEMA_SQL = """
CREATE SCHEMA shop;
CREATE TABLE shop.customers (id serial PRIMARY KEY, name text NOT NULL, email text);
CREATE TABLE shop.orders (
    id bigserial PRIMARY KEY,
    customer_id int NOT NULL REFERENCES shop.customers (id),
    amount numeric(12,2) NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now(),
    note text
);
-- rows that exist before the pipeline starts: they arrive as snapshot reads (op read)
INSERT INTO shop.customers (name, email)
    SELECT 'seed customer ' || g, 'seed' || g || '@example.com' FROM generate_series(1, 20) g;
INSERT INTO shop.orders (customer_id, amount, note)
    SELECT 1 + g % 20, round((g * 7.5)::numeric, 2), 'seed' FROM generate_series(1, 50) g;
"""

SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: demo, tenant: acme}}
spec:
  source:
    type: postgres
    id: demo-pg
    dsn: {dsn}
    tables: [shop.*]
    snapshot: {{mode: initial}}
  sinks:
    - {{id: demo-redis, type: redis, url: "{redis}", stream: "tailrace.{{database}}.{{table}}"}}
  bus: {{brokers: "{brokers}"}}
  control: {{address: "127.0.0.1:{control_port}"}}
"""


def _write_changes(pg: PostgresServer, stop: threading.Event) -> None:
    """A small shop: new customers and orders, price corrections, cancellations."""
    rng = random.Random(7)
    with pg.connect("shop", autocommit=False) as conn:
        n = 0
        while not stop.wait(1.0):
            n += 1
            with conn.transaction():
                row = conn.execute("INSERT INTO shop.customers (name, email) VALUES (%s, %s) "
                                   "RETURNING id", (f"customer {n}", f"c{n}@example.com")
                                   ).fetchone()
                assert row is not None  # INSERT ... RETURNING answers one row
                cid = row[0]
                conn.execute("INSERT INTO shop.orders (customer_id, amount, note) "
                             "VALUES (%s, %s, %s)", (cid, f"{rng.uniform(5, 500):.2f}", "new"))
            if n % 3 == 0:
                conn.execute("UPDATE shop.orders SET amount = amount * 0.9, note = 'discounted' "
                             "WHERE id = (SELECT max(id) FROM shop.orders)")
                conn.commit()
            if n % 5 == 0:
                conn.execute("DELETE FROM shop.orders WHERE id = (SELECT min(id) FROM shop.orders)")
                conn.commit()


def _show_arrivals(url: str, stop: threading.Event, counter: list[int]) -> None:
    client = redis.Redis.from_url(url)
    last: dict[KeyT, StreamIdT] = {"tailrace.shop.customers": "0-0", "tailrace.shop.orders": "0-0"}
    while not stop.is_set():
        # A sync client answers a list (None: nothing new); redis-py's ResponseT also allows the
        # asyncio client's awaitable.
        answer = cast(list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None,
                      client.xread(last, block=500))
        for stream, entries in answer or []:
            name = stream.decode()
            for entry_id, fields in entries:
                last[name] = entry_id.decode()
                event = json.loads(fields[b"event"])
                row = event["after"] or event["before"] or {}
                shown = ", ".join(f"{k}={v}" for k, v in list(row.items())[:4])
                counter[0] += 1
                print(f"  redis {name:<26} {event['op']:<7} {shown}", flush=True)


def _ready(url: str) -> bool:
    """True when `url` (a service's `/ready`) answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def run_demo(directory: str, duration: float | None, log_format: str = "json",
             log_level: str = "info") -> int:
    base = Path(directory).resolve()
    log_dir = base / "logs"
    base.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    call_on_stop_signals(stop.set)
    servers: list[DevServer] = []
    sup = Supervisor({ENV_FORMAT: log_format, ENV_LEVEL: log_level})  # one format per run
    ports = HttpPorts.from_base(0)
    try:
        print("tailrace demo: starting throwaway PostgreSQL, Kafka-protocol broker, Redis, NATS",
              flush=True)
        pg = PostgresServer().start()
        servers.append(pg)
        broker = KafkaBroker().start()
        servers.append(broker)
        red = RedisServer().start()
        servers.append(red)
        servers.append(NatsServer().start())
        pg.create_database("shop")
        pg.execute(SCHEMA_SQL, dbname="shop")

        spec_path = base / "pipeline.yaml"
        spec_path.write_text(SPEC.format(dsn=pg.dsn("shop"), redis=red.url,
                                         brokers=broker.bootstrap, control_port=free_port()))
        spec = load_pipeline(spec_path)
        state = base / "state"
        if state.exists():
            for f in state.iterdir():
                f.unlink()
        start_pipeline(sup, spec_path, spec, state, log_dir, ports)
        print(f"""tailrace demo: pipeline running
  spec      {spec_path}
  logs      {log_dir}/{{control,capture,delivery}}.log
  postgres  psql '{pg.dsn('shop')}'
  redis     redis-cli -p {red.url.rsplit(':', 1)[1].split('/')[0]} XRANGE tailrace.shop.orders - +
  control   {spec.spec.control.address} (gRPC)
  http      /health, /ready and /metrics of each service:
{ports.describe("127.0.0.1")}
tailrace demo: the 70 rows already in shop.customers and shop.orders arrive first, as
  snapshot reads (op read); then changes written every second. The first events take
  ~20 s (Spark starts up). {"Ctrl-C stops." if duration is None else
  f"Stopping by itself {duration:.0f} s after the first events arrive."}""", flush=True)

        # changes made before the replication slot exists are not captured: wait for it
        # (capture is ready once it streams)
        while not _ready(f"{ports.url('capture')}/ready"):
            if stop.wait(0.2) or sup.failed() is not None:
                break
        counter = [0]
        threads = [threading.Thread(target=_write_changes, args=(pg, stop), daemon=True),
                   threading.Thread(target=_show_arrivals, args=(red.url, stop, counter),
                                    daemon=True)]
        for t in threads:
            t.start()
        # --duration counts from the first events: a loaded machine starts Spark slowly
        deadline: float | None = None
        first_by = time.monotonic() + FIRST_EVENTS_WITHIN_S
        while not stop.is_set():
            dead = sup.failed()
            if dead is not None:
                print(exit_message(dead, "tailrace demo"), file=sys.stderr)
                return 1
            if duration is not None and deadline is None and counter[0] > 0:
                deadline = time.monotonic() + duration
            if deadline is not None and time.monotonic() >= deadline:
                break
            if counter[0] == 0 and time.monotonic() >= first_by:
                print(f"tailrace demo: no event arrived in {FIRST_EVENTS_WITHIN_S} s; "
                      f"the logs in {log_dir} say why", file=sys.stderr, flush=True)
                break
            time.sleep(0.2)
        stop.set()
        print(f"tailrace demo: {counter[0]} events arrived in Redis; stopping", flush=True)
        return 0 if counter[0] > 0 else 1
    finally:
        stop.set()
        sup.stop()
        for server in reversed(servers):
            server.stop()
        print("tailrace demo: stopped; all services and throwaway servers are gone", flush=True)
