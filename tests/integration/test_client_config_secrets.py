"""client_config secrets never appear in logs, end to end.

A pipeline of real processes (`tailrace-control`, `tailrace-capture`, `tailrace-delivery`,
all at `--log-level debug`) whose bus and Kafka sink carry SASL/TLS secrets in
`client_config` (settings librdkafka takes and, on a plaintext listener, does not use),
delivers to Redis and Kafka. Every log line of every service, and the `tailrace` CLI's
`--json` answers, are searched for the secrets. (A `client_config` librdkafka refuses,
whose error is logged and reported as health, is covered by
test_delivery_config_error.py with the same check.)
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.fix_pipeline import write_account_tx
from tests.integration.test_delivery_config_error import add_bus_client_config

pytestmark = pytest.mark.integration

SECRETS = {"sink": "sink-sasl-pw-0c4e1b", "sink key": "sink-key-pw-93d1aa",
           "bus": "bus-sasl-pw-5b7e20"}
KEYS = 3
DELIVERED_WITHIN_S = 300  # Spark start-up and the first batches on a loaded 2-core machine



@pytest.fixture
def acct(pg_db: str) -> str:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    return pg_db


def test_client_config_secrets_never_appear_in_logs(acct: str, pg_redis_pipeline: Any,
                                                    redis_server: Any, kafka_broker: Any) -> None:
    stream = "sec.acct"
    pipeline = pg_redis_pipeline(
        tables="[public.acct]",
        sink=f'{{id: redis1, type: redis, url: "{redis_server.url}", stream: "{stream}"}}\n'
             f'    - {{id: k1, type: kafka, brokers: "{kafka_broker.bootstrap}", '
             f'topic: "sec.{{table}}", client_config: {{sasl.username: cdc, '
             f'sasl.password: "{SECRETS["sink"]}", ssl.key.password: "{SECRETS["sink key"]}"}}}}')
    add_bus_client_config(pipeline.spec_path, f'{{sasl.password: "{SECRETS["bus"]}"}}')
    name = pipeline.spec_path.stem
    for service in ("control", "capture", "delivery"):
        pipeline.start(service, "--log-level", "debug")
    pipeline.wait_capture_streaming()
    with psycopg.connect(acct, autocommit=True) as conn:
        for t in range(3):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: len(pipeline.stream_entries(stream)) == 3 * KEYS,
                      DELIVERED_WITHIN_S, "every change in Redis")

    def kafka_acknowledged() -> bool:
        (answer,) = json.loads(pipeline.cli("checkpoints", name, "--json"))
        k1 = next(s for s in answer["sinks"] if s["sink_id"] == "k1")
        return bool(k1["found"]) and not k1.get("last_error")

    pipeline.wait_for(kafka_acknowledged, 120, "the Kafka sink to acknowledge")
    shown = {"pipelines --json": pipeline.cli("pipelines", "--json"),
             "checkpoints --json": pipeline.cli("checkpoints", name, "--json")}
    pipeline.sup.stop(timeout=30)
    for service in ("control", "capture", "delivery"):
        shown[service] = (pipeline.dir / f"{service}.log").read_text(errors="replace")
    assert '"level": "debug"' in shown["control"]  # the most verbose level was on
    assert "CONFWARN" in shown["capture"] + shown["delivery"]  # librdkafka saw the settings
    for where, text in shown.items():
        for what, secret in SECRETS.items():
            assert secret not in text, f"the {what} secret in {where}"
