"""docker-compose.yml as a reader finds it (issue 17 item 7): no Docker engine runs here, so
what can be checked without one is — every command is an installed console script whose
arguments its own parser accepts, every pipeline spec a service mounts loads with the
environment compose gives it, every service named (depends_on, addresses in commands and
environments) exists, every service restarts and has a healthcheck, nothing is published
beyond loopback, no password is written in it, state lives in volumes, the source
databases get tables, and the image runs as a user other than root. The same commands run
as plain processes in tests/integration/test_compose_processes.py.
"""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tailrace.config import parse_pipeline

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text()
                                        )["project"]["scripts"]
TAILRACE = [name for name, s in SERVICES.items() if s.get("command", [""])[0] in SCRIPTS]
# what `make secrets` writes into each env file (values of the same shape)
ENV_FILES = {
    "./deploy/secrets/postgres.env": {
        "POSTGRES_PASSWORD": "pw", "PG_DSN": "postgresql://postgres:pw@postgres:5432/shop"},
    "./deploy/secrets/control.env": {
        "TAILRACE_CONTROL_STORAGE": "postgresql://postgres:pw@postgres:5432/tailrace_control"},
    "./deploy/secrets/mysql.env": {
        "MYSQL_ROOT_PASSWORD": "pw", "MYSQL_DSN": "mysql://root:pw@mysql:3306/shop"},
}


def environment(name: str) -> dict[str, str]:
    """What a service's process sees: its env files, then its `environment`."""
    env: dict[str, str] = {}
    for path in SERVICES[name].get("env_file", []):
        env.update(ENV_FILES[path])
    env.update({k: str(v) for k, v in SERVICES[name].get("environment", {}).items()})
    return env


def test_the_services_are_all_there() -> None:
    assert sorted(TAILRACE) == ["capture", "capture-mysql", "control", "control-b",
                                "delivery", "delivery-mysql", "spark-master", "spark-worker"]
    assert {"postgres", "mysql", "kafka", "redis"} <= set(SERVICES)


def test_make_secrets_writes_every_env_file_the_services_read() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for path, keys in ENV_FILES.items():
        assert path.removeprefix("./") in makefile, path
        for key in keys:
            assert f"{key}=" in makefile, key


@pytest.mark.parametrize("name", TAILRACE)
def test_every_command_is_an_installed_script_its_parser_accepts(name: str) -> None:
    script, *args = SERVICES[name]["command"]
    module = importlib.import_module(SCRIPTS[script].split(":")[0])
    parsed = module._parser().parse_args(args)  # exits (fails the test) on a bad argument
    if script in ("tailrace-capture", "tailrace-delivery"):
        mounted = {v.split(":")[1]: v.split(":")[0] for v in SERVICES[name]["volumes"]}
        directory, file = parsed.pipeline.rsplit("/", 1)
        assert (ROOT / mounted[directory] / file).is_file(), parsed.pipeline


@pytest.mark.parametrize("name", [n for n in TAILRACE if n.startswith(("capture", "delivery"))])
def test_each_pipeline_spec_loads_with_the_environment_compose_gives(name: str) -> None:
    pipeline = SERVICES[name]["command"][1].removeprefix("/pipelines/")
    spec = parse_pipeline((ROOT / "deploy/pipelines" / pipeline).read_text(),
                          env=environment(name)).spec
    assert spec.control.addresses == ["control:50051", "control-b:50051"], \
        "both control replicas"
    assert spec.source.snapshot.mode == "initial", "the seeded rows arrive first"
    needs = SERVICES[name]["depends_on"]
    for needed in ("kafka", "control"):
        assert needs[needed] == {"condition": "service_healthy"}
    assert needs["control-b"] == {"condition": "service_started", "required": False}, \
        "one control replica down must not keep the pipeline from starting"
    if name.startswith("delivery"):
        command = SERVICES[name]["command"]
        assert command[command.index("--driver-host") + 1] == name, \
            "executors on the worker reach the driver at its service name"


def test_make_secrets_leaves_tokens_readable_by_the_image_user(tmp_path: Path) -> None:
    """A token written 0600 by an older `make secrets` (or by hand) becomes 0644 in the 0700
    directory: the image's non-root user reads it where compose mounts it."""
    import shutil
    import subprocess

    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    secrets = tmp_path / "deploy" / "secrets"
    secrets.mkdir(parents=True)
    old = secrets / "service.token"
    old.write_text("an-old-token\n")
    old.chmod(0o600)
    subprocess.run(["make", "-s", "secrets"], cwd=tmp_path, check=True, capture_output=True)
    assert old.read_text() == "an-old-token\n", "kept"
    for token in ("service.token", "admin.token"):
        assert (secrets / token).stat().st_mode & 0o777 == 0o644, token
    assert secrets.stat().st_mode & 0o777 == 0o700
    for env in ("postgres.env", "control.env", "mysql.env"):
        assert (secrets / env).stat().st_mode & 0o777 == 0o600, env


def test_every_service_named_exists() -> None:
    for name, service in SERVICES.items():
        for needed in service.get("depends_on", {}):
            assert needed in SERVICES, f"{name} depends on {needed}"
        text = " ".join(str(part) for part in service.get("command", []))
        text += " " + " ".join(environment(name).values())
        for host in re.findall(r"(?:@|//|\b)([a-z][a-z0-9-]*):\d{2,5}\b", text):
            assert host in SERVICES or host in ("localhost", "0.0.0.0"), f"{name} names {host}"


def test_every_service_restarts_and_has_a_healthcheck() -> None:
    for name, service in SERVICES.items():
        assert service.get("restart") == "unless-stopped", name
        assert service.get("healthcheck", {}).get("test"), name


def test_tailrace_services_serve_the_health_their_healthcheck_asks() -> None:
    for name in TAILRACE:
        command, check = SERVICES[name]["command"], " ".join(SERVICES[name]["healthcheck"]["test"])
        flag = "--http-port" if "--http-port" in command else "--webui-port"
        assert f"127.0.0.1:{command[command.index(flag) + 1]}/" in check, name


def test_ports_are_published_on_loopback_only_and_kafka_advertises_them() -> None:
    published = {name: s.get("ports", []) for name, s in SERVICES.items()}
    assert all(p.startswith("127.0.0.1:") for ports in published.values() for p in ports)
    kafka = SERVICES["kafka"]["environment"]
    host_port = published["kafka"][0].split(":")[1]
    assert f"EXTERNAL://localhost:{host_port}" in kafka["KAFKA_ADVERTISED_LISTENERS"]
    assert published["control"] and published["control-b"], "the CLI reaches both from the host"


def test_no_password_is_written_in_the_file() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert not re.search(r"PASSWORD\s*:", text) and not re.search(r"://\w+:[^@/\s]+@", text)
    assert "--storage" not in text, "the control storage DSN (a password) comes from control.env"


def test_state_lives_in_volumes() -> None:
    for name, path in (("postgres", "/var/lib/postgresql/data"), ("mysql", "/var/lib/mysql"),
                       ("kafka", "/var/lib/kafka/data"), ("redis", "/data")):
        assert any(v.split(":")[1] == path for v in SERVICES[name]["volumes"]
                   if not v.startswith(".")), name
    assert "--appendonly" in SERVICES["redis"]["command"]
    assert environment("control")["TAILRACE_CONTROL_STORAGE"].startswith("postgresql://")


def test_the_source_databases_have_the_tables_their_pipelines_capture() -> None:
    for server, tables in (("postgres", ["customers", "orders"]), ("mysql", ["products", "stock"])):
        init = (ROOT / f"deploy/{server}/init.sql").read_text()
        assert re.findall(r"CREATE TABLE (\w+)", init) == tables
        assert "INSERT INTO" in init
        mounted = [v for v in SERVICES[server]["volumes"] if "init.sql" in v]
        assert mounted and "/docker-entrypoint-initdb.d/" in mounted[0]
    control_db = [v for v in SERVICES["postgres"]["volumes"] if "00-control.sql" in v]
    assert control_db and "tailrace_control" in (ROOT / "deploy/postgres/00-control.sql"
                                                 ).read_text()


def test_mysql_keeps_the_binlog_capture_needs() -> None:
    command = " ".join(SERVICES["mysql"]["command"])
    for setting in ("--gtid-mode=ON", "--enforce-gtid-consistency=ON", "--binlog-format=ROW",
                    "--binlog-row-image=FULL", "--binlog-row-metadata=FULL"):
        assert setting in command
    assert SERVICES["mysql"]["image"] == "mysql:8.4"


def test_deliveries_submit_to_the_spark_cluster() -> None:
    for name in ("delivery", "delivery-mysql"):
        command = SERVICES[name]["command"]
        assert command[command.index("--master") + 1] == "spark://spark-master:7077"
    worker = SERVICES["spark-worker"]["command"]
    cores = int(worker[worker.index("--cores") + 1])
    asked = sum(int(part.split("=")[1]) for name in ("delivery", "delivery-mysql")
                for part in SERVICES[name]["command"] if part.startswith("spark.cores.max="))
    assert asked <= cores, "each delivery gets its executors: a streaming app never gives back"


def test_the_image_runs_as_an_unprivileged_user() -> None:
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users and users[-1] not in ("root", "0")
