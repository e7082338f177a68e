"""Network cuts between Tailrace's services and what they talk to, during a workload
(issue 16, item 1): each link goes through a `TcpProxy`, which drops every connection and
refuses new ones for CUT_S while the source keeps committing. Counted each time: every
change in Redis once, per key in source order, no process died; and the service's `/ready`
named the cut link while it was cut (`tailrace.links`).

Links: capture <-> source database, capture <-> control, delivery <-> control,
delivery <-> sink (Redis). capture <-> bus is tests/chaos/test_pg_capture_outages.py.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from tests.fix_pipeline import RunningPipeline, values_per_key, write_account_tx

pytestmark = pytest.mark.chaos

KEYS = 20
# what `/ready` of which service names while the link is cut (`tailrace.links`)
NAMED = {"source": ("capture", "reconnecting to the source database"),
         "capture-control": ("capture", "control service at 127.0.0.1:"),
         "delivery-control": ("delivery", "control service at 127.0.0.1:"),
         "sink": ("delivery", "sink redis1 failed")}
BEFORE, DURING, TRANSACTIONS = 20, 50, 70  # t < BEFORE delivered first; up to DURING cut
CUT_S = 15.0


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


@pytest.mark.parametrize("link", ["source", "capture-control", "delivery-control", "sink"])
def test_a_cut_link_loses_nothing_and_duplicates_nothing(
        link: str, pg_db: str, redis_server: Any, pg_redis_pipeline: Any, tcp_proxy: Any,
        tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    stream = f"cut-{link}.acct"  # the Redis server is shared by the whole run
    sink_url = redis_server.url
    if link == "sink":
        proxy = tcp_proxy(redis_server.port)
        sink_url = redis_server.url.replace(f":{redis_server.port}/", f":{proxy.port}/")
    pipeline = pg_redis_pipeline(
        tables="[public.acct]",
        sink=f'{{id: redis1, type: redis, url: "{sink_url}", stream: "cut-{link}.{{table}}"}}')
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
    pipeline.start("control")
    pipeline.start("capture", "--http-port", "0")
    pipeline.start("delivery", "--http-port", "0")
    pipeline.wait_capture_streaming()

    def delivered_up_to() -> int:
        values = values_per_key(pipeline.redis_url, stream)
        return min((max(v) for v in values.values()), default=-1) if len(values) == KEYS \
            else -1

    with psycopg.connect(pg_db, autocommit=True) as conn:
        for t in range(BEFORE):
            write_account_tx(conn, t, KEYS)
        pipeline.wait_for(lambda: delivered_up_to() == BEFORE - 1, 180, "the first changes")
        proxy.cut()
        cut_at = time.monotonic()
        seen: dict[str, list[str]] = {"capture": [], "delivery": []}
        written = BEFORE
        while time.monotonic() - cut_at < CUT_S:
            if written < DURING:
                write_account_tx(conn, written, KEYS)
                written += 1
            for name in seen:
                seen[name].append(probe(pipeline, name))
            pipeline.assert_running()
            time.sleep(0.5)
        proxy.restore()
        for t in range(written, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: delivered_up_to() == TRANSACTIONS - 1, 300,
                      f"every change in Redis after the {link} link came back")

    values = values_per_key(pipeline.redis_url, stream)
    assert values == {k: list(range(TRANSACTIONS)) for k in range(KEYS)}, \
        "each key's values once each, in source order"
    pipeline.assert_running()
    service, named = NAMED[link]
    assert any("ready 503" in line and named in line for line in seen[service]), \
        f"{service}'s /ready named the cut link ({named!r}) during the cut: {seen[service]}"
    pipeline.wait_for(lambda: "ready 200" in probe(pipeline, service), 30,
                      f"{service}'s /ready 200 again once the link is back")
    print(f"\n[{link}] cut {CUT_S:.0f} s with transactions {BEFORE}..{DURING - 1} committed "
          f"meanwhile: {KEYS * TRANSACTIONS} changes in Redis once each, in order")
    for name, lines in seen.items():  # one of each answer, whatever the seconds it gave
        answers = {re.sub(r"failing for \d+ s", "failing for N s", line) for line in lines}
        print(f"  {name} during the cut: " + " | ".join(sorted(answers)))
