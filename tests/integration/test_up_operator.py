"""`tailrace up` as an operator meets it: each service's `/health`, `/ready` and `/metrics` on
printed ports, the pipeline-state gauge on control's `/metrics`, one log format for the whole
run, and — when a service dies of a wrong password or a missing database — the cause on the
terminal, not only where the log is. Real processes and servers throughout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from tailrace.devservers import PostgresServer, free_port

pytestmark = pytest.mark.integration

SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: {name}}}
spec:
  source: {{type: postgres, id: src-{name}, dsn: "{dsn}", tables: [public.acct]}}
  sinks:
    - {{id: redis1, type: redis, url: "{redis}", stream: "{name}.{{table}}"}}
  bus: {{brokers: "{brokers}"}}
  control: {{address: "127.0.0.1:{control_port}"}}
"""
SERVING_WITHIN_S = 120  # control and capture at once; delivery's side port before Spark starts
ARRIVE_WITHIN_S = 240   # Spark start-up on this loaded machine, then the first batch
EXIT_WITHIN_S = 120
PORT_LINE = re.compile(r"^\s+(control|capture|delivery)\s+(http://\S+)/health\s")


class Up:
    """`tailrace up` as a subprocess; its terminal (stderr) collected line by line."""

    def __init__(self, spec: Path, directory: Path, *extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TAILRACE_")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tailrace_services.cli.main", "up", str(spec),
             "--state-dir", str(directory / "state"), "--log-dir", str(directory / "logs"),
             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def terminal(self) -> str:
        return "\n".join(self.lines)

    def urls(self) -> dict[str, str]:
        return {m.group(1): m.group(2) for m in map(PORT_LINE.match, self.lines) if m}

    def wait_for(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.process.poll() is not None:
                self._reader.join(5)
                raise AssertionError(f"tailrace up exited ({self.process.returncode}) while "
                                     f"waiting for {what}:\n{self.terminal}")
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n"
                             f"{self.terminal}")

    def stop(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(EXIT_WITHIN_S)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
            self._reader.join(5)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def write_spec(directory: Path, dsn: str, redis_url: str, brokers: str) -> tuple[Path, str]:
    name = f"up{uuid.uuid4().hex[:8]}"
    path = directory / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, dsn=dsn, redis=redis_url, brokers=brokers,
                                control_port=free_port()))
    return path, name


def test_up_serves_health_ready_metrics_on_printed_ports_with_one_log_format(
        tmp_path: Path, pg_db: str, redis_server: Any, kafka_broker: Any) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id int PRIMARY KEY, v int NOT NULL)")
    spec, name = write_spec(tmp_path, pg_db, redis_server.url, kafka_broker.bootstrap)
    up = Up(spec, tmp_path, "--log-format", "json")
    try:
        up.wait_for(lambda: len(up.urls()) == 3, SERVING_WITHIN_S, "the printed ports")
        urls = up.urls()
        assert "tailrace_pipeline_state" in up.terminal, "where the state gauge is exported"
        for service, base in urls.items():
            up.wait_for(lambda base=base: get(f"{base}/ready")[0] == 200, SERVING_WITHIN_S,
                        f"{service} /ready")
            assert get(f"{base}/health") == (200, "ok\n"), service
            assert get(f"{base}/metrics")[0] == 200, service
        gauge = f'tailrace_pipeline_state{{pipeline="{name}",state="running"}} 1.0'
        up.wait_for(lambda: gauge in get(f"{urls['control']}/metrics")[1], SERVING_WITHIN_S,
                    "the pipeline state gauge on control's /metrics")
        assert f'tailrace_pipeline_state{{pipeline="{name}",state="paused"}} 0.0' in \
            get(f"{urls['control']}/metrics")[1]

        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO acct VALUES (1, 1)")
        client = redis.Redis.from_url(redis_server.url)
        up.wait_for(lambda: client.xlen(f"{name}.acct") == 1, ARRIVE_WITHIN_S,
                    "the change to arrive in Redis")
    finally:
        assert up.stop() == 0, up.terminal
    for service in ("control", "capture", "delivery"):
        for line in (tmp_path / "logs" / f"{service}.log").read_text().splitlines():
            assert isinstance(json.loads(line), dict), f"{service}: {line}"


@pytest.fixture
def password_pg(make_pg_server: Any) -> PostgresServer:
    """A PostgreSQL where user `app` must give the password `right-pw` (scram)."""
    server: PostgresServer = make_pg_server()
    server.execute("CREATE ROLE app LOGIN REPLICATION PASSWORD 'right-pw'")
    server.create_database("shop")
    hba = server.datadir / "pg_hba.conf"
    hba.write_text("host all app 127.0.0.1/32 scram-sha-256\n"
                   "host replication app 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    server.execute("SELECT pg_reload_conf()")
    return server


@pytest.mark.parametrize(("dsn_of", "cause"), [
    (lambda pg: pg.dsn("shop", user="app").replace("//app@", "//app:wrong-pw@"),
     'password authentication failed for user "app"'),
    (lambda pg: pg.dsn("no_such_db"), 'database "no_such_db" does not exist'),
], ids=["wrong-password", "missing-database"])
def test_up_prints_why_a_service_died(tmp_path: Path, password_pg: PostgresServer,
                                      redis_server: Any, kafka_broker: Any, dsn_of: Any,
                                      cause: str) -> None:
    dsn = dsn_of(password_pg)
    spec, _ = write_spec(tmp_path, dsn, redis_server.url, kafka_broker.bootstrap)
    up = Up(spec, tmp_path)
    try:
        up.wait_for(lambda: any("exited with code" in line for line in up.lines),
                    EXIT_WITHIN_S, "tailrace up to report the dead service")
        code = up.process.wait(EXIT_WITHIN_S)
    finally:
        up.stop()
    (line,) = [line for line in up.lines if "exited with code" in line]
    assert code == 1
    assert line.startswith("tailrace: capture exited with code 1: capture stopped: "), line
    assert cause in line and f"full log: {tmp_path / 'logs' / 'capture.log'}" in line
    assert "wrong-pw" not in up.terminal
    print(f"\n{line}")
