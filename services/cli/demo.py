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
import signal
import sys
import threading
import time
from pathlib import Path

import redis

from tailrace.config import load_pipeline
from tailrace.devservers import KafkaBroker, NatsServer, PostgresServer, RedisServer, free_port
from tailrace_services.cli.supervisor import Supervisor
from tailrace_services.cli.up import start_pipeline

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
                cid = conn.execute("INSERT INTO shop.customers (name, email) VALUES (%s, %s) "
                                   "RETURNING id", (f"customer {n}", f"c{n}@example.com")
                                   ).fetchone()[0]  # type: ignore[index]
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
    last = {"tailrace.shop.customers": "0-0", "tailrace.shop.orders": "0-0"}
    while not stop.is_set():
        for stream, entries in client.xread(last, block=500) or []:  # type: ignore[arg-type]
            name = stream.decode()
            for entry_id, fields in entries:
                last[name] = entry_id.decode()
                event = json.loads(fields[b"event"])
                row = event["after"] or event["before"] or {}
                shown = ", ".join(f"{k}={v}" for k, v in list(row.items())[:4])
                counter[0] += 1
                print(f"  redis {name:<26} {event['op']:<7} {shown}", flush=True)


def run_demo(directory: str, duration: float | None) -> int:
    base = Path(directory).resolve()
    log_dir = base / "logs"
    base.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    servers: list = []
    sup = Supervisor()
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
        start_pipeline(sup, spec_path, spec, state, log_dir)
        print(f"""tailrace demo: pipeline running
  spec      {spec_path}
  logs      {log_dir}/{{control,capture,delivery}}.log
  postgres  psql '{pg.dsn('shop')}'
  redis     redis-cli -p {red.url.rsplit(':', 1)[1].split('/')[0]} XRANGE tailrace.shop.orders - +
  control   {spec.spec.control.address} (gRPC)
tailrace demo: writing changes to shop.customers and shop.orders every second; the first
  events take ~20 s (Spark starts up). {"Ctrl-C stops." if duration is None else
  f"Stopping by itself after {duration:.0f} s."}""", flush=True)

        # changes made before the replication slot exists are not captured: wait for it
        capture_log = log_dir / "capture.log"
        while '"streaming"' not in (capture_log.read_text() if capture_log.exists() else ""):
            if stop.wait(0.2) or sup.failed() is not None:
                break
        counter = [0]
        threads = [threading.Thread(target=_write_changes, args=(pg, stop), daemon=True),
                   threading.Thread(target=_show_arrivals, args=(red.url, stop, counter),
                                    daemon=True)]
        for t in threads:
            t.start()
        deadline = None if duration is None else time.monotonic() + duration
        while not stop.is_set():
            dead = sup.failed()
            if dead is not None:
                print(f"tailrace demo: {dead.name} exited; see {dead.log_path}", file=sys.stderr)
                return 1
            if deadline is not None and time.monotonic() >= deadline:
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
