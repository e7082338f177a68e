"""deploy/grafana/tailrace.json and deploy/prometheus/alerts.yml (issue 18 item 4) ask only for
metrics the services really export: a pipeline runs (control, capture and delivery, each
with its /metrics), delivers changes, and every metric name in a panel's or a rule's
expression is in what the three serve. A metric renamed in the code fails here, not on
an operator's empty panel or an alert that can never fire.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.fix_pipeline import reached, values_per_key, write_account_txs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((ROOT / "deploy/grafana/tailrace.json").read_text())
RULES = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"][0]["rules"]
_SUFFIX = re.compile(r"_(bucket|sum|count|total|created)$")


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and alert rule."""
    out = [(f"panel {p['title']!r}", t["expr"]) for p in DASHBOARD["panels"]
           for t in p["targets"]]
    return out + [(f"alert {r['alert']}", r["expr"]) for r in RULES]


def families(metrics_text: str) -> set[str]:
    """The metric families a /metrics page declares (with or without samples yet)."""
    return {_SUFFIX.sub("", m) for m in re.findall(r"^# TYPE (\S+) ", metrics_text, re.M)}


def test_the_dashboard_and_the_alerts_are_well_formed() -> None:
    assert DASHBOARD["uid"] and DASHBOARD["schemaVersion"] >= 36
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DASHBOARD["panels"]:
        assert panel["targets"] and panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    names = [r["alert"] for r in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
    wanted = {"position lost": "position_lost", "pipeline failed": 'state="failed"',
              "lag growing": "deriv(tailrace_sink_lag_seconds", "retained log high":
              "tailrace_source_retained_bytes", "DLQ non-empty": "tailrace_dlq_entries"}
    for what, needle in wanted.items():
        assert any(needle in r["expr"] for r in RULES), f"no alert for {what}"
    panels = " ".join(e for _, e in expressions())
    for needle in ("tailrace_capture_events_total", "tailrace_delivery_events_total",
                   "tailrace_sink_lag_seconds", "tailrace_source_retained_bytes",
                   "tailrace_delivery_end_to_end_seconds_bucket", "tailrace_dlq_entries",
                   "tailrace_delivery_sink_errors_total", "tailrace_capture_snapshot_rows_total"):
        assert needle in panels, needle


def test_every_metric_they_ask_for_is_exported(pg_db: str, pg_redis_pipeline: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    pipeline = pg_redis_pipeline(tables="[public.acct]", stream="dash.{table}",
                                 source="snapshot: {mode: initial}")
    for name in ("control", "capture", "delivery"):
        pipeline.start(name, "--http-port", "0")
    pipeline.wait_capture_streaming()
    write_account_txs(pg_db, 0, 5, 3)
    pipeline.wait_for(lambda: reached(values_per_key(pipeline.redis_url, "dash.acct"), 3) == 4,
                      180, "the changes delivered")
    listening = next(json.loads(line) for line in (pipeline.dir / "control.log").read_text()
                     .splitlines() if '"control service listening"' in line)
    exported: set[str] = set()
    for url in (f"http://127.0.0.1:{listening['http_port']}", pipeline.side_url("capture"),
                pipeline.side_url("delivery")):
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            exported |= families(r.read().decode())
    missing = [(where, m) for where, expr in expressions()
               for m in re.findall(r"\btailrace_[a-z_]+", expr)
               if _SUFFIX.sub("", m) not in exported]
    assert not missing, f"not exported by any service: {missing}"
