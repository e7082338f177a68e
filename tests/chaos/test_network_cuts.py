"""Network cuts between Tailrace's services and what they talk to, during a workload
(issue 16, item 1): each link goes through a `TcpProxy`, which drops every connection and
refuses new ones for CUT_S while the source keeps committing. Counted each time: every
change in Redis once, per key in source order, no process died; and the service's `/ready`
named the cut link while it was cut (`tailrace.links`).

Links: capture <-> source database, capture <-> control, delivery <-> control,
delivery <-> sink (Redis), and the bus: a broker of its own that advertises the proxy, so
capture's and delivery's connections to it are cut together (capture alone:
tests/chaos/test_pg_capture_outages.py). Then the reply to a sink's commit lost (Redis
`EXEC`, PostgreSQL `COMMIT`), and each link slow and thin (150 ms each way, 20 kB/s).
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.fix_matrix import count_values
from tests.fix_pipeline import RunningPipeline, reached, values_per_key, write_account_tx

pytestmark = pytest.mark.chaos

KEYS = 20
# what `/ready` of which service names while the link is cut (`tailrace.links`)
NAMED = {"source": [("capture", "reconnecting to the source database")],
         "capture-control": [("capture", "control service at 127.0.0.1:")],
         "delivery-control": [("delivery", "control service at 127.0.0.1:")],
         "sink": [("delivery", "sink redis1 failed")],
         "bus": [("capture", "bus at 127.0.0.1:"), ("delivery", "bus at 127.0.0.1:")]}
BEFORE, DURING, TRANSACTIONS = 20, 50, 70  # t < BEFORE delivered first; up to DURING cut
CUT_S = 15.0
LINKS = ["source", "capture-control", "delivery-control", "sink", "bus"]


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


def wire(link: str, prefix: str, pg_db: str, redis_server: Any, pg_redis_pipeline: Any,
         tcp_proxy: Any, tmp_path: Path, request: pytest.FixtureRequest
         ) -> tuple[RunningPipeline, Any, str]:
    """A pipeline of an `acct` table whose `link` goes through a proxy the test controls:
    (the unstarted pipeline, the proxy, the Redis stream it writes)."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    stream = f"{prefix}-{link}.acct"  # the Redis server is shared by the whole run
    sink_url = redis_server.url
    if link == "sink":
        proxy = tcp_proxy(redis_server.port)
        sink_url = redis_server.url.replace(f":{redis_server.port}/", f":{proxy.port}/")
    brokers = ""
    if link == "bus":
        _, proxy = request.getfixturevalue("proxied_broker")
        brokers = f"127.0.0.1:{proxy.port}"
    pipeline = pg_redis_pipeline(
        tables="[public.acct]", brokers=brokers,
        sink=f'{{id: redis1, type: redis, url: "{sink_url}", stream: "{prefix}-{link}.{{table}}"}}')
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
    return pipeline, proxy, stream


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.matrix(
    scenario="a network cut of 15 s on one link during a workload (capture or delivery to source, bus, "
             "control, sink)",
    guarantee="no loss, no duplicate, per-key order through a cut; /ready names the cut link; no process "
              "dies")
def test_a_cut_link_loses_nothing_and_duplicates_nothing(
        counted: Any, link: str, pg_db: str, redis_server: Any, pg_redis_pipeline: Any, tcp_proxy: Any,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pipeline, proxy, stream = wire(link, "cut", pg_db, redis_server, pg_redis_pipeline,
                                   tcp_proxy, tmp_path, request)
    pipeline.start("control")
    pipeline.start("capture", "--http-port", "0")
    pipeline.start("delivery", "--http-port", "0")
    pipeline.wait_capture_streaming()

    def delivered_up_to() -> int:
        return reached(values_per_key(pipeline.redis_url, stream), KEYS)

    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(BEFORE):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: delivered_up_to() == BEFORE - 1, 180, "the first changes")
        proxy.cut()
        cut_at = time.monotonic()
        seen: dict[str, list[str]] = {"capture": [], "delivery": []}
        rss = {name: [pipeline.rss_mb(name)] for name in seen}
        written = BEFORE
        while time.monotonic() - cut_at < CUT_S:
            if written < DURING:
                write_account_tx(conn, written, KEYS)
                written += 1
            for name in seen:
                seen[name].append(probe(pipeline, name))
                rss[name].append(pipeline.rss_mb(name))
            pipeline.assert_running()
            time.sleep(0.5)
        proxy.restore()
        for t in range(written, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: delivered_up_to() == TRANSACTIONS - 1, 300,
                      f"every change in Redis after the {link} link came back")

    values = values_per_key(pipeline.redis_url, stream)
    grew = {name: max(samples) - samples[0] for name, samples in rss.items()}
    counted(**count_values(values, {k: list(range(TRANSACTIONS)) for k in range(KEYS)}),
            outcome=f"RSS growth during the cut: capture {grew['capture']:.0f} MB, delivery "
                    f"{grew['delivery']:.0f} MB")
    assert values == {k: list(range(TRANSACTIONS)) for k in range(KEYS)}, \
        "each key's values once each, in source order"
    pipeline.assert_running()
    assert grew["capture"] < 64, f"capture's memory grew {grew['capture']:.0f} MB during the cut"
    for service, named in NAMED[link]:
        assert any("ready 503" in line and named in line for line in seen[service]), \
            f"{service}'s /ready named the cut link ({named!r}) during the cut: {seen[service]}"
        pipeline.wait_for(lambda s=service: "ready 200" in probe(pipeline, s), 30,
                          f"{service}'s /ready 200 again once the link is back")
    print(f"\n[{link}] cut {CUT_S:.0f} s with transactions {BEFORE}..{DURING - 1} committed "
          f"meanwhile: {KEYS * TRANSACTIONS} changes in Redis once each, in order; RSS "
          f"growth during the cut: " + ", ".join(f"{n} {g:.0f} MB" for n, g in grew.items()))
    for name, lines in seen.items():  # one of each answer, whatever the seconds it gave
        answers = {re.sub(r"failing for \d+ s", "failing for N s", line) for line in lines}
        print(f"  {name} during the cut: " + " | ".join(sorted(answers)))


AUDIT = """
CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL);
CREATE TABLE audit (n bigserial PRIMARY KEY, id int, v int);
CREATE FUNCTION audit_acct() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO audit (id, v) VALUES (NEW.id, NEW.v); RETURN NEW; END $$;
CREATE TRIGGER audit_acct AFTER INSERT OR UPDATE ON acct
  FOR EACH ROW EXECUTE FUNCTION audit_acct();
"""


@pytest.mark.matrix(
    scenario="the reply to a sink's commit lost (Redis EXEC, PostgreSQL COMMIT): applied, not acknowledged",
    guarantee="exactly once where the sink allows it: the retry finds the batch stored and skips it")
@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_commit_whose_reply_is_lost_is_neither_lost_nor_applied_twice(
        counted: Any, kind: str, pg_db: str, pg_server: Any, redis_server: Any, pg_redis_pipeline: Any,
        tcp_proxy: Any) -> None:
    """The sink's server receives the batch's commit (Redis `EXEC`, PostgreSQL `COMMIT`)
    and commits it, but the reply never reaches delivery: the connection is gone and the
    sink cannot tell whether its transaction went through. The retry reads the checkpoint
    stored with the data and skips what is there. Counted: Redis's stream entries, and
    every row version the PostgreSQL target applied (an audit trigger)."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    stream = f"lost-reply-{kind}.acct"
    if kind == "redis":
        proxy = tcp_proxy(redis_server.port)
        url = redis_server.url.replace(f":{redis_server.port}/", f":{proxy.port}/")
        sink = f'{{id: s1, type: redis, url: "{url}", stream: "lost-reply-{kind}.{{table}}"}}'
        pattern = b"$4\r\nEXEC\r\n"
    else:
        target = f"t_{uuid.uuid4().hex[:12]}"
        pg_server.create_database(target)
        with psycopg.connect(pg_server.dsn(target), autocommit=True) as conn:
            conn.execute(AUDIT)
        proxy = tcp_proxy(pg_server.port)
        dsn = pg_server.dsn(target).replace(f":{pg_server.port}/", f":{proxy.port}/")
        sink = f'{{id: s1, type: postgres, dsn: "{dsn}"}}'
        pattern = b"COMMIT\x00"
    pipeline = pg_redis_pipeline(tables="[public.acct]", sink=sink)
    pipeline.start_all()

    def values() -> dict[int, list[int]]:
        if kind == "redis":
            return values_per_key(redis_server.url, stream)
        with psycopg.connect(pg_server.dsn(target)) as conn:
            found: dict[int, list[int]] = {}
            for key, v in conn.execute("SELECT id, v FROM audit ORDER BY n"):
                found.setdefault(key, []).append(v)
            return found

    def delivered_up_to() -> int:
        return reached(values(), KEYS)

    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(BEFORE):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: delivered_up_to() == BEFORE - 1, 180, "the first changes")
        proxy.lose_reply_to(pattern)
        written = BEFORE
        while proxy.replies_lost == 0 and written < TRANSACTIONS:
            write_account_tx(conn, written, KEYS)
            written += 1
            pipeline.wait_for(lambda w=written: proxy.replies_lost > 0
                              or delivered_up_to() == w - 1, 120, "the next batch")
        assert proxy.replies_lost == 1, "a commit's reply was lost"
        for t in range(written, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: delivered_up_to() == TRANSACTIONS - 1, 300,
                      "every change after the lost reply")
    counted(**count_values(values(), {k: list(range(TRANSACTIONS)) for k in range(KEYS)}))
    assert values() == {k: list(range(TRANSACTIONS)) for k in range(KEYS)}, \
        "each key's values once each, in source order"
    pipeline.assert_running()
    skipped = pipeline.log_count("delivery", "replayed events skipped")
    print(f"\n[{kind}] the reply to a commit lost after transaction {written - 1}: "
          f"{KEYS * TRANSACTIONS} changes applied once each, in order; the retry found the "
          f"batch stored ({skipped} 'replayed events skipped' log line(s))")



@pytest.mark.parametrize("link", LINKS)
@pytest.mark.matrix(
    scenario="a slow thin link (150 ms each way, 20 kB/s) on one link during a workload "
             "(capture or delivery to source, bus, control, sink)",
    guarantee="backpressure: slower, never lossy; no duplicate, per-key order")
def test_a_slow_thin_link_delays_but_loses_and_repeats_nothing(
        counted: Any, link: str, pg_db: str, redis_server: Any, pg_redis_pipeline: Any,
        tcp_proxy: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """One link at 150 ms each way and 20 kB/s while 30 transactions are written: batches
    take longer, nothing else changes."""
    pipeline, proxy, stream = wire(link, "slow", pg_db, redis_server, pg_redis_pipeline,
                                   tcp_proxy, tmp_path, request)
    pipeline.start_all()

    def delivered_up_to() -> int:
        return reached(values_per_key(redis_server.url, stream), KEYS)

    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(BEFORE):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: delivered_up_to() == BEFORE - 1, 180, "the first changes")
        proxy.slow(delay_s=0.15, bytes_per_s=20_000)
        started = time.monotonic()
        for t in range(BEFORE, DURING):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: delivered_up_to() == DURING - 1, 300,
                          "every change over the slow link")
        slow_s = time.monotonic() - started
        proxy.slow()
        for t in range(DURING, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: delivered_up_to() == TRANSACTIONS - 1, 180, "every change")
    values = values_per_key(redis_server.url, stream)
    counted(**count_values(values, {k: list(range(TRANSACTIONS)) for k in range(KEYS)}),
            outcome=f"{DURING - BEFORE} transactions over the slow link in {slow_s:.0f} s")
    assert values == {k: list(range(TRANSACTIONS)) for k in range(KEYS)}, \
        "once each, in source order"
    pipeline.assert_running()
    print(f"\n[{link}] slow link (150 ms each way, 20 kB/s): {DURING - BEFORE} transactions "
          f"delivered in {slow_s:.1f} s; {KEYS * TRANSACTIONS} changes once each, in order")
