"""Delivery's own look at the bus (`buswatch.py`): a cut bus is named by `/ready` within
seconds, not when a worker's read gives up (a real broker behind a cuttable proxy)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tailrace.config import parse_pipeline
from tailrace.links import LINKS
from tailrace_services.delivery.buswatch import BusWatch

pytestmark = pytest.mark.integration

SPEC = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: watch}}
spec:
  source: {{type: postgres, id: w, dsn: "postgresql://u@127.0.0.1/db", tables: [public.t]}}
  sinks: [{{id: r1, type: redis, url: "redis://127.0.0.1:6379/0"}}]
  bus: {{brokers: "{brokers}"}}
"""


def test_a_cut_bus_is_named_and_cleared_when_it_answers_again(proxied_broker: Any) -> None:
    _, proxy = proxied_broker
    brokers = f"127.0.0.1:{proxy.port}"
    watch = BusWatch(parse_pipeline(SPEC.format(brokers=brokers)))
    try:
        watch.check()  # the topic does not exist yet: the broker answers all the same
        assert LINKS.reason() == ""
        proxy.cut()
        watch.check()
        failing = LINKS.broken(now=float("inf"))
        assert [b.link for b in failing] == [f"bus at {brokers}"], failing
        assert "no answer within 3 s" in failing[0].error
        proxy.restore()
        deadline = time.monotonic() + 20  # the client reconnects with its own backoff
        while LINKS.broken(now=float("inf")) and time.monotonic() < deadline:
            watch.check()
        assert LINKS.broken(now=float("inf")) == []
    finally:
        watch.stop()
