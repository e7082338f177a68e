"""A pipeline end to end with mutual TLS and tokens between all its services.

Real processes: `tailrace-control` (TLS, client certificates required, service and admin
tokens), `tailrace-capture` and `tailrace-delivery` (the spec's `control.tls` and
`control.token_file`; the Spark planner reaches control the same way), and the `tailrace`
CLI. Changes arrive in Redis; the audit log names the services by their certificate. A
capture whose spec has no `control.tls` stops at once with exit code 2, naming the setting.
"""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest

from tailrace.proto import control_pb2 as pb
from tests.fix_pipeline import write_account_tx

pytestmark = pytest.mark.integration

KEYS, TXS = 3, 5


@pytest.fixture
def acct(pg_db: str) -> str:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    return pg_db


def test_changes_arrive_with_mutual_tls_between_all_services(acct, pg_redis_pipeline, tls_files):
    pipeline = pg_redis_pipeline(tables="[public.acct]", stream="mtls.{table}",
                                 control=tls_files.spec(), control_args=tls_files.server_args())
    pipeline.start_all()
    with psycopg.connect(acct, autocommit=True) as conn:
        for t in range(TXS):
            write_account_tx(conn, t, KEYS)
    pipeline.wait_for(lambda: len(pipeline.stream_entries("mtls.acct")) >= KEYS * TXS, 240,
                      f"{KEYS * TXS} changes in redis")
    seen = [(e["after"]["id"], e["after"]["v"]) for e in pipeline.stream_entries("mtls.acct")]
    assert sorted(seen) == sorted((k, t) for t in range(TXS) for k in range(KEYS))

    with pipeline.control_client(tls=tls_files.client(), retry_for=10) as admin:
        def service_calls() -> list[pb.AuditRecord]:
            return admin.list_audit(role="service", limit=10_000)

        # the batch's report follows its write to Redis
        pipeline.wait_for(lambda: any(r.method == "Commits/ReportBatch"
                                      for r in service_calls()), 60, "a batch report")
        records = service_calls()
    assert {"Identities/Compare", "Epochs/Record", "Commits/ClaimDelivery",
            "Commits/ReportBatch"} <= {r.method for r in records}
    assert {r.client_cert for r in records} == {"CN=tailrace-service"}

    cli = subprocess.run(
        [sys.executable, "-m", "tailrace_services.cli.main", "checkpoints", "--json",
         *pipeline.cli_args(), "--tls-ca", str(tls_files.ca), "--tls-cert",
         str(tls_files.client_cert), "--tls-key", str(tls_files.client_key)],
        capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    (answer,) = json.loads(cli.stdout)
    assert answer["sinks"][0]["found"] is True


def test_a_capture_without_control_tls_stops_and_names_the_setting(acct, pg_redis_pipeline,
                                                                  tls_files):
    pipeline = pg_redis_pipeline(tables="[public.acct]",
                                 control_args=tls_files.server_args())  # the spec has no tls
    pipeline.start("control")
    pipeline.start("capture")
    assert pipeline.exit_code("capture", timeout=60) == 2
    log = pipeline.log_tail("capture")
    assert "serves mutual TLS and this client speaks plaintext: set control.tls.ca" in log, log
