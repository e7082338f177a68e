"""The links of a running pipeline behind a `TcpProxy` the test controls, for the network
fault tests (issue 16, item 1): `wire(link, ...)` starts nothing; it writes a pipeline of
one `acct` table whose `link` goes through the proxy, and returns what its sink holds.

Links: capture <-> source database, capture <-> control, delivery <-> control, the bus (a
broker of its own that advertises the proxy) for both services at once or for delivery
alone (the test cuts the connections delivery's processes own: `TcpProxy.cut(clients=)`),
and delivery <-> each sink kind: Redis, PostgreSQL, NATS JetStream, Kafka exactly-once
(noida-db behind a proxy that rewrites its metadata to name the proxy).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from tailrace.devservers import TcpProxy
from tests.fix_matrix import count_values
from tests.fix_pipeline import (
    RunningPipeline,
    kafka_values,
    nats_values,
    reached,
    values_per_key,
    write_account_tx,
)

KEYS = 20
SINK_KINDS = ("redis", "postgres", "nats", "kafka")
# what `/ready` of which service names while the link is cut (`tailrace.links`)
NAMED = {"source": [("capture", "reconnecting to the source database")],
         "capture-control": [("capture", "control service at 127.0.0.1:")],
         "delivery-control": [("delivery", "control service at 127.0.0.1:")],
         "bus": [("capture", "bus at 127.0.0.1:"), ("delivery", "bus at 127.0.0.1:")],
         "delivery-bus": [("delivery", "bus at 127.0.0.1:")],
         **{f"sink-{kind}": [("delivery", "sink s1 failed")] for kind in SINK_KINDS},
         "sinks": [("delivery", f"sink {kind} failed") for kind in SINK_KINDS]}
BEFORE, DURING, TRANSACTIONS = 20, 50, 70  # t < BEFORE delivered first; up to DURING cut
CUT_S = 30.0
# "sinks": delivery's link to each sink kind at once, in one pipeline of four sinks (one
# pipeline's start instead of four, on a machine where the suite is CPU-bound)
LINKS = ["source", "capture-control", "delivery-control", "bus", "delivery-bus", "sinks"]
SLOW_LINKS = ["source", "capture-control", "delivery-control", "bus", "sinks"]


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def probe(pipeline: RunningPipeline, name: str) -> str:
    """`/health` and `/ready` of a service started with `--http-port 0`, in one line."""
    url = next(json.loads(line)["url"] for line in
               (pipeline.dir / f"{name}.log").read_text(errors="replace").splitlines()
               if '"event": "http side port"' in line)
    out = []
    for path in ("health", "ready"):
        try:
            with urllib.request.urlopen(f"{url}/{path}", timeout=5) as r:
                out.append(f"{path} {r.status} {r.read().decode().strip()}")
        except urllib.error.HTTPError as e:
            out.append(f"{path} {e.code} {e.read().decode().strip()}")
        except OSError as e:
            out.append(f"{path} unreachable ({e})")
    return "; ".join(out)


Values = Callable[[], dict[int, list[int]]]  # what a sink holds: each key's values in order


@dataclass
class Proxies:
    """Several proxies cut, slowed and restored together."""

    proxies: list[TcpProxy]

    def cut(self) -> None:
        for proxy in self.proxies:
            proxy.cut()

    def slow(self, delay_s: float = 0.0, bytes_per_s: int = 0) -> None:
        for proxy in self.proxies:
            proxy.slow(delay_s, bytes_per_s)

    def restore(self) -> None:
        for proxy in self.proxies:
            proxy.restore()


def wire(link: str, prefix: str, pg_db: str, pg_redis_pipeline: Any, tcp_proxy: Any,
         tmp_path: Path, request: pytest.FixtureRequest, batch: str = "{max_ms: 200}"
         ) -> tuple[RunningPipeline, Any, dict[str, Values]]:
    """A pipeline of an `acct` table whose `link` goes through a proxy the test controls:
    (the unstarted pipeline, the proxy, what each sink holds by its id). The sink is
    Redis `s1` unless the link is another sink's; for "sinks", one sink of each kind (its
    id the kind), each behind its own proxy, and the proxy returned a `Proxies`."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    proxy: Any = None
    if link == "sinks":
        wired = {kind: proxied_sink(kind, f"{prefix}-{kind}", tcp_proxy, request, kind)
                 for kind in SINK_KINDS}
        proxy = Proxies([p for p, _, _ in wired.values()])
        sink = "\n    - ".join(spec for _, spec, _ in wired.values())
        values = {kind: v for kind, (_, _, v) in wired.items()}
    elif link.startswith("sink-"):
        proxy, sink, one = proxied_sink(link.removeprefix("sink-"), f"{prefix}-{link}",
                                        tcp_proxy, request)
        values = {"s1": one}
    else:
        _, sink, one = proxied_sink("redis", f"{prefix}-{link}", None, request)
        values = {"s1": one}
    brokers = ""
    if link in ("bus", "delivery-bus"):
        _, proxy = request.getfixturevalue("proxied_broker")
        brokers = f"127.0.0.1:{proxy.port}"
    pipeline = pg_redis_pipeline(tables="[public.acct]", brokers=brokers, sink=sink, batch=batch)
    text = pipeline.spec_path.read_text()
    if link == "source":
        proxy = tcp_proxy(port_of(pg_db))
        pipeline.spec_path.write_text(text.replace(f":{port_of(pg_db)}/", f":{proxy.port}/"))
    elif link in ("capture-control", "delivery-control"):
        control_port = int(pipeline.control_address.rsplit(":", 1)[1])
        proxy = tcp_proxy(control_port)
        own = tmp_path / f"{link}.yaml"
        own.write_text(text.replace(f"127.0.0.1:{control_port}", f"127.0.0.1:{proxy.port}"))
        pipeline.specs[link.split("-")[0]] = own
    return pipeline, proxy, values


def proxied_sink(kind: str, name: str, tcp_proxy: Any, request: pytest.FixtureRequest,
                 sink_id: str = "s1") -> tuple[Any, str, Values]:
    """A sink `sink_id` of `kind` named `name` (its stream, subject, topic or database),
    behind a proxy when `tcp_proxy` is given: (the proxy, the sink's spec, what it holds
    per key).
    PostgreSQL counts every row it applied with an audit trigger; Kafka is noida-db,
    exactly-once, read committed."""
    proxy: Any = None
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        url = server.url
        if tcp_proxy is not None:
            proxy = tcp_proxy(server.port)
            url = url.replace(f":{server.port}/", f":{proxy.port}/")
        return proxy, f'{{id: {sink_id}, type: redis, url: "{url}", stream: "{name}.{{table}}"}}', \
            lambda: values_per_key(server.url, f"{name}.acct")
    if kind == "postgres":
        server = request.getfixturevalue("pg_server")
        target = f"t_{uuid.uuid4().hex[:12]}"
        server.create_database(target)
        with psycopg.connect(server.dsn(target), autocommit=True) as conn:
            conn.execute(AUDIT)
        dsn = server.dsn(target)
        if tcp_proxy is not None:
            proxy = tcp_proxy(server.port)
            dsn = dsn.replace(f":{server.port}/", f":{proxy.port}/")

        def audited() -> dict[int, list[int]]:
            with psycopg.connect(server.dsn(target)) as conn:
                found: dict[int, list[int]] = {}
                for key, v in conn.execute("SELECT id, v FROM audit ORDER BY n"):
                    found.setdefault(key, []).append(v)
                return found

        return proxy, f'{{id: {sink_id}, type: postgres, dsn: "{dsn}"}}', audited
    if kind == "nats":
        server = request.getfixturevalue("nats_server")
        stream = "S" + uuid.uuid4().hex[:10]
        url = server.url
        if tcp_proxy is not None:
            proxy = tcp_proxy(server.port)
            url = url.replace(f":{server.port}", f":{proxy.port}")
        return proxy, (f'{{id: {sink_id}, type: nats, url: "{url}", stream: "{stream}", '
                       f'subject: "{stream}.{{table}}"}}'), lambda: nats_values(server.url, stream)
    broker = request.getfixturevalue("noida_kafka")
    bootstrap = broker.bootstrap
    if tcp_proxy is not None:
        proxy = tcp_proxy(broker.port)
        proxy.kafka = True  # its metadata names the proxy, not the broker
        bootstrap = f"127.0.0.1:{proxy.port}"
    return proxy, (f'{{id: {sink_id}, type: kafka, brokers: "{bootstrap}", topic: "{name}.{{table}}", '
                   'exactly_once: true}'), lambda: kafka_values(broker.bootstrap, f"{name}.acct")


AUDIT = """
CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL);
CREATE TABLE audit (n bigserial PRIMARY KEY, id int, v int);
CREATE FUNCTION audit_acct() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO audit (id, v) VALUES (NEW.id, NEW.v); RETURN NEW; END $$;
CREATE TRIGGER audit_acct AFTER INSERT OR UPDATE ON acct
  FOR EACH ROW EXECUTE FUNCTION audit_acct();
"""


@dataclass
class Workload:
    """A link test's workload: TRANSACTIONS transactions over KEYS keys, BEFORE of them
    delivered before the fault, and what the sink holds (`values`)."""

    pipeline: RunningPipeline
    sinks: dict[str, Values]

    def delivered_up_to(self) -> int:
        """The last transaction every sink holds."""
        return min(reached(values(), KEYS) for values in self.sinks.values())

    def write_first(self, conn: Any) -> None:
        """The first BEFORE transactions, waited for in the sink."""
        for t in range(BEFORE):
            write_account_tx(conn, t, KEYS)
        self.wait_until(BEFORE - 1, "the first changes", 180)

    def wait_until(self, t: int, what: str, timeout: float = 300) -> None:
        self.pipeline.wait_for(lambda: self.delivered_up_to() == t, timeout, what)

    def count_all_once(self, counted: Callable[..., None], outcome: str = "") -> None:
        """Count what the sinks hold for the matrix (summed over them); in each, every
        change once, per key in order."""
        expected = {k: list(range(TRANSACTIONS)) for k in range(KEYS)}
        got = {sink: values() for sink, values in self.sinks.items()}
        counts = [count_values(held, expected) for held in got.values()]
        counted(**{name: sum(c[name] for c in counts) for name in counts[0]},
                outcome=(f"{len(got)} sinks: " if len(got) > 1 else "") + outcome)
        for sink, held in got.items():
            assert held == expected, f"sink {sink}: each key's values once each, in source order"
