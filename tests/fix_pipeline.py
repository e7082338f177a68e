"""Fixtures that run a whole pipeline as real processes against the harness's servers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
import redis
from confluent_kafka.admin import AdminClient

from tailrace.control_client import ControlClient
from tailrace.devservers import free_port
from tailrace_services.cli.supervisor import Child, Supervisor, service_argv
from tailrace_services.cli.up import wait_for_port
from tests.fix_control import new_token, write_secret
from tests.fix_sinks import read_kafka

SPEC_TEMPLATE = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: {name}, tenant: {tenant}}}
spec:
  source:
    type: {source_type}
    id: {source_id}
    dsn: "{dsn}"
    tables: {tables}{source_extra}
  sinks:
    - {sink}
  bus: {{brokers: "{brokers}", partitions: {partitions}}}
  control: {{address: "127.0.0.1:{control_port}", token_file: "{token_file}"{control_extra}}}
  batch: {batch}
"""


def write_account_tx(conn: Any, t: int, keys: int) -> None:
    """Source transaction `t` of an `acct (id, v)` table: t = 0 inserts keys 0..keys-1 with
    v = 0, every later t sets v = t on all of them, so each key's values in source order are
    0, 1, 2, ... (per-key order and whole transactions are easy to check downstream)."""
    with conn.transaction(), conn.cursor() as cur:
        if t == 0:
            cur.executemany("INSERT INTO acct VALUES (%s, 0)", [(k,) for k in range(keys)])
        else:
            cur.executemany("UPDATE acct SET v = %s WHERE id = %s", [(t, k) for k in range(keys)])


def write_account_txs(dsn: str, first: int, count: int, keys: int) -> None:
    """Transactions `first`..`first + count - 1` of `write_account_tx`, on a connection of
    their own."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in range(first, first + count):
            write_account_tx(conn, t, keys)


def reached(values: dict[int, list[int]], keys: int) -> int:
    """How far a `write_account_tx` workload arrived: the last transaction every one of
    `keys` keys has reached (-1 until each key has a value)."""
    return min((max(v) for v in values.values()), default=-1) if len(values) == keys else -1


def values_per_key(url: str, stream: str) -> dict[int, list[int]]:
    """An `acct` stream in Redis (`write_account_tx`): each key's values, in stream order."""
    out: dict[int, list[int]] = {}
    for _, fields in redis.Redis.from_url(url).xrange(stream):
        after = json.loads(fields[b"event"])["after"]
        out.setdefault(after["id"], []).append(after["v"])
    return out


def nats_values(url: str, stream: str) -> dict[int, list[int]]:
    """An `acct` JetStream stream (`write_account_tx`): each key's values, in stream order."""
    async def fetch() -> list[Any]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            return []
        msgs = [await js.get_msg(stream, seq)  # none yet: first_seq 0 (not a message)
                for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1)]
        await nc.close()
        return msgs

    out: dict[int, list[int]] = {}
    for msg in asyncio.run(fetch()):
        after = json.loads(msg.data)["after"]
        out.setdefault(after["id"], []).append(after["v"])
    return out


def kafka_values(brokers: str, topic: str) -> dict[int, list[int]]:
    """An `acct` topic (`write_account_tx`), read committed: each key's values in order."""
    values: dict[int, list[int]] = {}
    try:
        topics = AdminClient({"bootstrap.servers": brokers}).list_topics(timeout=5)
    except Exception:  # noqa: BLE001 - the broker is away: nothing to count now
        return values
    if topic not in topics.topics:
        return values  # the sink has not written one yet
    for m in read_kafka(brokers, [topic], timeout=30):
        after = json.loads(m.value())["after"]
        values.setdefault(after["id"], []).append(after["v"])
    return values


@dataclass
class RunningPipeline:
    """A pipeline's three services as processes, with their logs in `dir`. Control runs with
    a service token (the spec's `control.token_file`) and an admin token (`admin_token_file`,
    for `control_client()` and `cli_args()`); `control_args` are more arguments for it.
    Control replicas: `control_storage` (a PostgreSQL DSN they share, instead of a SQLite file)
    and `control_listens` (each instance's own address, `control2`...), with
    `control_address` naming them all (`host:a,host:b`)."""

    dir: Path
    spec_path: Path
    control_address: str
    redis_url: str
    stream: str
    service_token_file: Path
    admin_token_file: Path
    control_args: tuple[str, ...] = ()
    control_storage: str | None = None
    control_listens: dict[str, str] = field(default_factory=dict)
    specs: dict[str, Path] = field(default_factory=dict)  # a service's own spec file
    sup: Supervisor = field(default_factory=Supervisor)
    procs: dict[str, Child] = field(default_factory=dict)

    def start(self, name: str, *extra: str) -> None:
        """`name`: control, capture or delivery; a digit after it starts another instance
        of that service (`delivery2`) with its own log. `extra`: more arguments for it
        (`--http-port 0`)."""
        listen = self.control_listens.get(name, self.control_address)
        argv = {
            "control": service_argv("tailrace-control", "--listen", listen, "--storage",
                                    self.control_storage or f"sqlite:///{self.dir / 'control.db'}",
                                    "--service-token-file", str(self.service_token_file),
                                    "--admin-token-file", str(self.admin_token_file),
                                    *self.control_args),
            "capture": service_argv("tailrace-capture",
                                    str(self.specs.get("capture", self.spec_path))),
            "delivery": service_argv("tailrace-delivery",
                                     str(self.specs.get("delivery", self.spec_path))),
        }[name.rstrip("0123456789")]
        self.procs[name] = self.sup.start(name, [*argv, *extra], self.dir / f"{name}.log")
        if name.startswith("control"):
            wait_for_port(listen)

    def start_managed(self, name: str) -> dict[str, int]:
        """The control service with this spec applied as version 1 of pipeline `name`, then
        capture and delivery in managed mode (`--managed name`, polling every second);
        their pids by service."""
        self.start("control")
        assert "created: version 1" in self.cli("apply", "-f", str(self.spec_path))
        for service in ("capture", "delivery"):
            argv = service_argv(f"tailrace-{service}", "--managed", name, "--control",
                                self.control_address, "--token-file",
                                str(self.service_token_file), "--poll-s", "1")
            self.procs[service] = self.sup.start(service, argv, self.dir / f"{service}.log")
        return {s: self.procs[s].process.pid for s in ("capture", "delivery")}

    def delete_managed(self, name: str, pids: dict[str, int]) -> None:
        """The managed services ran on in the processes `start_managed` started; a delete
        of the pipeline stops both with exit 0."""
        assert {s: self.procs[s].process.pid for s in pids} == pids, "no process restarted"
        self.assert_running()
        self.cli("delete", name, "--confirm", name)
        assert self.exit_code("capture", 60) == 0
        assert self.exit_code("delivery", 60) == 0

    def control_client(self, role: str = "admin", **options: Any) -> ControlClient:
        """A client of this pipeline's control service with the `role` token (admin, service)."""
        path = self.admin_token_file if role == "admin" else self.service_token_file
        return ControlClient(self.control_address, token=path.read_text().strip(), **options)

    def cli_args(self) -> list[str]:
        """What the `tailrace` admin CLI needs to reach this pipeline's control service."""
        return ["--control", self.control_address, "--token-file", str(self.admin_token_file)]

    def cli(self, *argv: str) -> str:
        """Run the `tailrace` admin CLI against this pipeline's control service; its output
        (it must succeed)."""
        result = subprocess.run(
            [sys.executable, "-m", "tailrace_services.cli.main", *argv, *self.cli_args()],
            capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def start_all(self) -> None:
        for name in ("control", "capture", "delivery"):
            self.start(name)
        self.wait_capture_streaming()

    def wait_capture_streaming(self, timeout: float = 60) -> None:
        """Changes made before the slot exists are not captured: wait for the stream to start."""
        self.wait_for(lambda: '"event": "streaming"' in (self.dir / "capture.log").read_text(),
                      timeout, "capture to start streaming")

    def kill(self, name: str) -> None:
        """kill -9 the service and everything in its process group (the JVM too)."""
        child = self.procs[name]
        assert child.process is not None
        os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait(10)

    def stop(self, name: str, timeout: float = 20) -> int:
        """SIGTERM the service's process group and wait for it to exit; its exit code."""
        child = self.procs.pop(name)
        assert child.process is not None
        os.killpg(child.process.pid, signal.SIGTERM)
        return child.process.wait(timeout)

    def assert_running(self) -> None:
        for name, child in self.procs.items():
            assert child.process is not None
            code = child.process.poll()
            if code is not None:
                raise AssertionError(f"{name} exited with {code}:\n{self.log_tail(name)}")

    def exit_code(self, name: str, timeout: float) -> int:
        """Wait for a service to exit on its own; it is no longer expected to run."""
        child = self.procs.pop(name)
        assert child.process is not None
        return child.process.wait(timeout)

    def rss_mb(self, name: str) -> float:
        """Resident memory of a service's process and every process below it (delivery:
        Spark's JVM and Python workers), in MB."""
        total = 0
        for pid in self.tree_pids(name):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in status.splitlines()
                           if line.startswith("VmRSS:")), 0)
        return total / 1024

    def tree_pids(self, name: str) -> list[int]:
        """A service's process and every process below it (delivery: Spark's JVM and its
        Python workers)."""
        root = self.procs[name].process
        assert root is not None
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(stat.parent.name)] = int(fields[1])
        tree, todo = [], [root.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(child for child, parent in parents.items() if parent == pid)
        return tree

    def log_count(self, name: str, text: str) -> int:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace").count(text) if path.exists() else 0

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) \
            if path.exists() else ""

    def http_health(self, name: str) -> tuple[int, dict[str, Any]]:
        """(status, JSON body or {}) of `/health` of a service started with `--http-port`."""
        return self.http_side(name, "/health")

    def side_url(self, name: str) -> str:
        """The HTTP side port's URL of a service started with `--http-port` (the last
        one it logged: a restarted service logs its new one)."""
        marker = '"event": "http side port"'
        self.wait_for(lambda: self.log_count(name, marker) > 0, 60, f"{name}'s http side port")
        return [json.loads(line)["url"] for line in
                (self.dir / f"{name}.log").read_text(errors="replace").splitlines()
                if marker in line][-1]

    def metric(self, name: str, metric: str) -> float:
        """The sum of a Prometheus metric's samples on a service's `/metrics`."""
        with urllib.request.urlopen(f"{self.side_url(name)}/metrics", timeout=10) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((f"{metric} ", f"{metric}{{")))

    def http_side(self, name: str, path: str) -> tuple[int, dict[str, Any]]:
        """(status, JSON body or {}) of `path` (`/health`, `/ready`) of a service started
        with `--http-port`."""
        url = self.side_url(name)
        try:
            with urllib.request.urlopen(f"{url}{path}", timeout=10) as r:
                return r.status, {}
        except urllib.error.HTTPError as e:
            body = e.read()
            return e.code, json.loads(body) if body.startswith(b"{") else {}

    def stream_entries(self, stream: str) -> list[dict[str, Any]]:
        client = redis.Redis.from_url(self.redis_url)
        return [json.loads(fields[b"event"]) for _, fields in client.xrange(stream)]

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.assert_running()
            if predicate():
                return
            time.sleep(0.5)
        logs = "\n".join(f"--- {n} ---\n{self.log_tail(n)}" for n in self.procs)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{logs}")


@pytest.fixture
def pg_redis_pipeline(tmp_path: Path, pg_db: str, kafka_broker: Any, redis_server: Any,
                      request: pytest.FixtureRequest) -> Iterator[Callable[..., RunningPipeline]]:
    """Factory: write a postgres -> redis spec for `pg_db` and return the (unstarted) pipeline."""
    made: list[RunningPipeline] = []

    def make(tables: str = "[public.*]", stream: str = "tr.{database}.{table}",
             sink: str | None = None, extra: str = "", batch: str = "{max_ms: 200}",
             partitions: int = 1, control: str = "", control_args: tuple[str, ...] = (),
             source: str = "", brokers: str = "", source_type: str = "postgres",
             dsn: str = "") -> RunningPipeline:
        """`sink`: a YAML flow mapping replacing the default Redis sink (`@SERVICE_TOKEN_FILE@`
        in it: the path of the service token); `control`: more
        fields of spec.control (`tls: {...}`), `control_args`: more arguments for control;
        `source`: more fields of spec.source, one YAML line each (`snapshot: {...}`);
        `brokers`: another bus than the session's broker (one the test restarts);
        `source_type`/`dsn`: another source than `pg_db` (mysql and a MariaDB DSN)."""
        name = f"t{len(made)}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
        control_port = free_port()
        spec_path = tmp_path / f"{name}.yaml"
        service_token = write_secret(tmp_path / f"{name}.service.token", new_token())
        admin_token = write_secret(tmp_path / f"{name}.admin.token", new_token())
        spec_path.write_text(SPEC_TEMPLATE.format(
            name=name, tenant="acme", source_id=f"src-{name}", dsn=dsn or pg_db,
            source_type=source_type, tables=tables,
            sink=(sink or f'{{id: redis1, type: redis, url: "{redis_server.url}", '
                          f'stream: "{stream}"}}').replace("@SERVICE_TOKEN_FILE@",
                                                            str(service_token)),
            brokers=brokers or kafka_broker.bootstrap, control_port=control_port, batch=batch,
            partitions=partitions, token_file=service_token,
            control_extra=f", {control}" if control else "",
            source_extra="".join(f"\n    {line}" for line in source.splitlines())) + extra)
        p = RunningPipeline(dir=tmp_path, spec_path=spec_path,
                            control_address=f"127.0.0.1:{control_port}",
                            redis_url=redis_server.url, stream=stream,
                            service_token_file=service_token, admin_token_file=admin_token,
                            control_args=control_args)
        made.append(p)
        return p

    yield make
    for p in made:
        p.sup.stop(timeout=10)
