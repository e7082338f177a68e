"""A standalone Spark cluster on loopback (issue 17 item 5): a master and a worker, each in
its own JVM, started by `tailrace-spark` (services/delivery/cluster.py) from the pyspark
distribution's own launcher classes, as docker-compose.yml starts them (the launcher makes
up for what the pip distribution lacks: a SPARK_HOME with a `RELEASE` file, the Scala
version).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tailrace.devservers import free_port
from tailrace_services.cli.supervisor import service_argv


@dataclass
class SparkCluster:
    master_url: str
    dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def executors(self) -> list[int]:
        """The pids of the worker's executor JVMs now."""
        worker = self.procs["worker"].pid
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (stat.parent / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if parent == worker and b"CoarseGrainedExecutorBackend" in cmdline:
                found.append(int(stat.parent.name))
        return found

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def wait_log(self, name: str, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log(name):
            process = self.procs[name]
            assert process.poll() is None, f"spark {name} exited:\n{self.log(name)[-3000:]}"
            assert time.monotonic() < deadline, f"spark {name}: no {text!r}:\n" \
                                                f"{self.log(name)[-3000:]}"
            time.sleep(0.2)


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[SparkCluster]:
    """A master and one worker with 2 cores; executors run this interpreter (PYSPARK_PYTHON),
    so they import Tailrace as the driver does."""
    port = free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", tmp_path)
    common = ["--host", "127.0.0.1", "--webui-port", "0", "--dir", str(tmp_path)]
    commands = {  # the product's launcher, as docker-compose.yml runs it
        "master": service_argv("tailrace-spark", "master", "--port", str(port), *common),
        "worker": service_argv("tailrace-spark", "worker", cluster.master_url, "--cores", "2",
                               "--memory", "2g", *common),
    }
    try:
        for name, argv in commands.items():
            with open(tmp_path / f"{name}.log", "wb") as out:
                cluster.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                       env=env, start_new_session=True)
            cluster.wait_log(name, "I have been elected leader" if name == "master" else
                             "Successfully registered with master")
        yield cluster
    finally:
        for process in reversed(list(cluster.procs.values())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)  # (the executors are in the worker's process group)
