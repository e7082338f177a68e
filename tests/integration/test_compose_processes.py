"""docker-compose.yml's control replicas run as plain processes (no Docker engine here): each
service's command as written, with only what Docker would provide put in its place — the
listen address and side port on loopback, the secret files, the storage DSN from
control.env pointing at a throwaway PostgreSQL. Both answer /health, and a client naming
both, as the pipelines do, writes through one and reads through the other. (The Spark
master and worker commands run the same way in tests/fix_spark.py; capture and delivery
everywhere else.)
"""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tailrace.control_client import ControlClient
from tailrace.devservers import free_port
from tailrace_services.cli.supervisor import Supervisor, service_argv
from tailrace_services.cli.up import wait_for_port
from tests.fix_control import new_token, write_secret

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SERVICES = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_the_compose_control_replicas_serve_one_state_from_postgresql(
        tmp_path: Path, pg_server: Any) -> None:
    tokens = {"service_token": write_secret(tmp_path / "service.token", new_token()),
              "admin_token": write_secret(tmp_path / "admin.token", new_token())}
    storage = pg_server.create_database(f"ctl_{uuid.uuid4().hex[:10]}")
    sup = Supervisor({"TAILRACE_CONTROL_STORAGE": storage})  # as control.env gives it
    addresses, sides = [], []
    try:
        for name in ("control", "control-b"):
            script, *args = SERVICES[name]["command"]
            address, side = f"127.0.0.1:{free_port()}", free_port()
            args = [address if a == "0.0.0.0:50051" else str(side) if a == "8080" else
                    str(tokens[a.removeprefix("/run/secrets/")]) if a.startswith("/run/secrets/")
                    else a for a in args]
            sup.start(name, service_argv(script, *args), tmp_path / f"{name}.log")
            wait_for_port(address)
            addresses.append(address)
            sides.append(side)
        for side in sides:  # (the HTTP side starts after the gRPC port: a slow machine
            wait_for_port(f"127.0.0.1:{side}")  # refused the first /health in between)
            with urllib.request.urlopen(f"http://127.0.0.1:{side}/health", timeout=10) as r:
                assert r.status == 200
        admin = tokens["admin_token"].read_text().strip()
        with ControlClient(addresses[::-1], token=admin) as on_b:  # control-b first
            on_b.register_pipeline("orders", source_id="shop-primary",
                                   sinks=[("orders-redis", "redis", True)])
        with ControlClient(",".join(addresses), token=admin) as on_a:
            assert on_a.pipeline_state("orders")[0] == "running"
            assert on_a.current_address == addresses[0]
    finally:
        sup.stop(timeout=10)
    assert "postgresql" in (tmp_path / "control.log").read_text()
