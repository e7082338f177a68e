"""docker-compose.yml as a reader finds it (issue 17 item 6): no Docker here to run it, so
what can be checked without one is — every service restarts and has a healthcheck, the
Tailrace services serve it, nothing is published beyond loopback, no password is written in
it, state lives in volumes, the source database gets tables, and the pipeline spec the
services load is valid with the environment compose gives them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tailrace.config import parse_pipeline

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
TAILRACE = ("control", "capture", "delivery")


def test_every_service_restarts_and_has_a_healthcheck() -> None:
    for name, service in SERVICES.items():
        assert service.get("restart") == "unless-stopped", name
        assert service.get("healthcheck", {}).get("test"), name


def test_tailrace_services_serve_the_health_their_healthcheck_asks() -> None:
    for name in TAILRACE:
        command = SERVICES[name]["command"]
        port = command[command.index("--http-port") + 1]
        assert f"127.0.0.1:{port}/health" in " ".join(SERVICES[name]["healthcheck"]["test"])


def test_ports_are_published_on_loopback_only_and_kafka_advertises_them() -> None:
    published = {name: s.get("ports", []) for name, s in SERVICES.items()}
    assert all(p.startswith("127.0.0.1:") for ports in published.values() for p in ports)
    kafka = SERVICES["kafka"]["environment"]
    host_port = published["kafka"][0].split(":")[1]
    assert f"EXTERNAL://localhost:{host_port}" in kafka["KAFKA_ADVERTISED_LISTENERS"]
    assert "control" in published, "the admin CLI reaches control from the host"


def test_no_password_is_written_in_the_file() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert not re.search(r"PASSWORD\s*:", text) and "://postgres:" not in text
    assert "./deploy/secrets/postgres.env" in text
    makefile = (ROOT / "Makefile").read_text()
    assert "deploy/secrets/postgres.env" in makefile and "PG_DSN=" in makefile, \
        "make secrets writes what the file reads"


def test_state_lives_in_volumes() -> None:
    for name, path in (("postgres", "/var/lib/postgresql/data"), ("kafka", "/var/lib/kafka/data"),
                       ("redis", "/data"), ("control", "/data")):
        assert any(v.split(":")[1] == path for v in SERVICES[name]["volumes"]
                   if not v.startswith(".")), name
    assert "--appendonly" in SERVICES["redis"]["command"]


def test_the_source_database_has_the_tables_the_pipeline_captures() -> None:
    init = (ROOT / "deploy/postgres/init.sql").read_text()
    assert re.findall(r"CREATE TABLE (\w+)", init) == ["customers", "orders"]
    assert "INSERT INTO orders" in init
    mounted = [v for v in SERVICES["postgres"]["volumes"] if "init.sql" in v]
    assert mounted and "/docker-entrypoint-initdb.d/" in mounted[0]


def test_the_pipeline_spec_loads_with_the_environment_compose_gives() -> None:
    for name in ("capture", "delivery"):
        env = {k: str(v) for k, v in SERVICES[name]["environment"].items()}
        assert SERVICES[name]["env_file"] == ["./deploy/secrets/postgres.env"]
        env["PG_DSN"] = "postgresql://postgres:pw@postgres:5432/shop"  # as make secrets writes
        spec = parse_pipeline((ROOT / "deploy/pipelines/orders.yaml").read_text(), env=env)
        assert spec.spec.source.tables == ["public.*"]
        assert SERVICES[name]["depends_on"]["control"] == {"condition": "service_healthy"}
