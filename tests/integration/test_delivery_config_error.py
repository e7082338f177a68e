"""A configuration error found on a Spark executor stops delivery for good, within seconds.

Real processes: `tailrace-control`, `tailrace-capture` (PostgreSQL) and `tailrace-delivery`
(the Spark job, `--http-port 0`) and the `tailrace` CLI. The trigger is one a user can
cause and only an executor can find: a Kafka sink whose `client_config` holds a value the
executor's librdkafka refuses (`compression.type: zstandard`; `client_config` is passed
through as it is, and which settings and values exist is the business of the librdkafka
where the sink runs). The sink raises `ConfigError` on the executor, which reaches the
driver as a Java-wrapped Python traceback: delivery must not restart the batch forever
but stop it, say why on `/health` (503) and to the control service (`failed`), and exit
with code 2. The `client_config` also carries a SASL password, and the bus's one too:
neither may appear in any log or in the CLI's `--json` output.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fix_pipeline import write_account_tx

pytestmark = pytest.mark.integration

STARTED_WITHIN_S = 240  # Spark start-up and the first batch on this loaded 2-core machine
FAILED_WITHIN_S = 60    # from the failing batch's data to /health 503: no restart loop
SINK_SECRET = "sink-sasl-pw-5e1f9c"
BUS_SECRET = "bus-sasl-pw-77ad02"



def add_bus_client_config(spec: Path, settings: str) -> None:
    text = spec.read_text()
    bus = next(line for line in text.splitlines() if line.startswith("  bus: {"))
    spec.write_text(text.replace(bus, bus[:-1] + f", client_config: {settings}}}"))


@pytest.fixture
def acct(pg_db: str) -> str:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    return pg_db


def test_a_config_error_on_an_executor_stops_delivery_with_exit_2_and_says_why(
        acct: str, pg_redis_pipeline: Any, kafka_broker: Any) -> None:
    pipeline = pg_redis_pipeline(
        tables="[public.acct]",
        sink=f'{{id: k1, type: kafka, brokers: "{kafka_broker.bootstrap}", topic: "cfg.{{table}}",'
             f' client_config: {{sasl.username: cdc, sasl.password: "{SINK_SECRET}", '
             f'compression.type: zstandard}}}}')
    add_bus_client_config(pipeline.spec_path, f'{{sasl.password: "{BUS_SECRET}"}}')
    name = pipeline.spec_path.stem
    for service in ("control", "capture"):
        pipeline.start(service, "--log-level", "debug")
    pipeline.start("delivery", "--http-port", "0", "--log-level", "debug")
    pipeline.wait_capture_streaming()
    pipeline.wait_for(lambda: pipeline.log_count("delivery", '"event": "delivery running"') > 0,
                      STARTED_WITHIN_S, "the streaming query to start")
    assert pipeline.http_health("delivery")[0] == 200
    with psycopg.connect(acct, autocommit=True) as conn:
        write_account_tx(conn, 0, 3)
    written = time.monotonic()

    def failed() -> bool:
        status, body = pipeline.http_health("delivery")
        return status == 503 and "configuration error" in body.get("reason", "")

    pipeline.wait_for(failed, FAILED_WITHIN_S + STARTED_WITHIN_S, "delivery /health 503")
    took = time.monotonic() - written
    body = pipeline.http_health("delivery")[1]
    expected = ('configuration error: kafka sink k1: client_config: librdkafka refuses the '
                'settings: Invalid value "zstandard" for configuration property')
    assert body["status"] == "unhealthy" and body["reason"].startswith(expected), body
    (entry,) = [p for p in json.loads(pipeline.cli("pipelines", "--json"))
                if p["name"] == name]
    assert entry["state"] == "failed" and expected in entry["reason"], entry
    print(f"\n/health 503 {took:.1f} s after the change was written: {body['reason']}")
    assert took < FAILED_WITHIN_S

    assert pipeline.log_count("delivery", "restarting from checkpoints") == 0, \
        pipeline.log_tail("delivery")
    child = pipeline.procs["delivery"]
    assert child.process is not None
    child.process.terminate()  # it serves 503 until stopped; then exit code 2
    assert pipeline.exit_code("delivery", timeout=60) == 2

    shown = {n: (pipeline.dir / f"{n}.log").read_text(errors="replace")
             for n in ("control", "capture", "delivery")}
    shown["pipelines --json"] = pipeline.cli("pipelines", "--json")
    shown["checkpoints --json"] = pipeline.cli("checkpoints", name, "--json")
    for where, text in shown.items():
        assert SINK_SECRET not in text and BUS_SECRET not in text, f"a secret in {where}"
    assert "client_config" in shown["delivery"]  # the error was logged, without the secret
