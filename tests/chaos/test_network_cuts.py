"""Network cuts between Tailrace's services and what they talk to, during a workload
(issue 16, item 1): each link (`tests/fix_links.py`) goes through a `TcpProxy`, which
drops every connection and refuses new ones for CUT_S while the source keeps committing.
Counted each time: every change in the sink once, per key in source order, no process
died; the service's `/ready` named the cut link while it was cut (`tailrace.links`, a
sink's failing batches); capture's memory stayed bounded.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fix_links import BEFORE, CUT_S, DURING, KEYS, LINKS, NAMED, TRANSACTIONS, Workload, probe, wire
from tests.fix_pipeline import write_account_tx

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.matrix(
    scenario="a network cut of 30 s on one link during a workload (capture to source, bus and "
             "control; delivery to bus, control, and its links to a sink of each kind at once)",
    guarantee="no loss, no duplicate, per-key order through a cut; /ready names the cut link; no process "
              "dies; capture's memory bounded")
def test_a_cut_link_loses_nothing_and_duplicates_nothing(
        counted: Any, link: str, pg_db: str, pg_redis_pipeline: Any, tcp_proxy: Any,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    pipeline, proxy, values = wire(link, "cut", pg_db, pg_redis_pipeline, tcp_proxy, tmp_path,
                                   request)
    pipeline.start("control")
    pipeline.start("capture", "--http-port", "0")
    pipeline.start("delivery", "--http-port", "0")
    pipeline.wait_capture_streaming()

    work = Workload(pipeline, values)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        work.write_first(conn)
        if link == "delivery-bus":  # capture's connections to the bus go on
            proxy.cut(clients=lambda: pipeline.tree_pids("delivery"))
        else:
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
                seen[name].append(f"{time.monotonic() - cut_at:.0f} s: {probe(pipeline, name)}")
                rss[name].append(pipeline.rss_mb(name))
            pipeline.assert_running()
            time.sleep(0.5)
        proxy.restore()
        for t in range(written, TRANSACTIONS):
            write_account_tx(conn, t, KEYS)
    work.wait_until(TRANSACTIONS - 1, f"every change in the sink after the {link} link came back")
    grew = {name: max(samples) - samples[0] for name, samples in rss.items()}
    work.count_all_once(counted, f"RSS growth during the cut: capture {grew['capture']:.0f} MB, "
                                 f"delivery {grew['delivery']:.0f} MB")
    pipeline.assert_running()
    assert grew["capture"] < 64, f"capture's memory grew {grew['capture']:.0f} MB during the cut"
    for service, named in NAMED[link]:
        assert any("ready 503" in line and named in line for line in seen[service]), \
            f"{service}'s /ready named the cut link ({named!r}) during the cut: {seen[service]}"
        pipeline.wait_for(lambda s=service: "ready 200" in probe(pipeline, s), 30,
                          f"{service}'s /ready 200 again once the link is back")
    if link == "delivery-bus":
        assert not any(named in line for named in ("bus at", "source")
                       for line in seen["capture"]), \
            f"capture's link to the bus was not cut: {seen['capture']}"
    print(f"\n[{link}] cut {CUT_S:.0f} s with transactions {BEFORE}..{DURING - 1} committed "
          f"meanwhile: {KEYS * TRANSACTIONS} changes in the sink once each, in order; RSS "
          f"growth during the cut: " + ", ".join(f"{n} {g:.0f} MB" for n, g in grew.items()))
    for name, lines in seen.items():  # one of each answer (the first time it was given)
        answers: dict[str, str] = {}
        for line in lines:
            at, answer = line.split(": ", 1)
            answers.setdefault(re.sub(r"failing for \d+ s", "failing for N s", answer), at)
        print(f"  {name} during the cut: " + " | ".join(f"{answer} (from {at})"
                                                         for answer, at in answers.items()))
