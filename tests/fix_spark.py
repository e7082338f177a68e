"""A standalone Spark cluster on loopback (issue 17 item 5): a master and a worker, each in
its own JVM, started from the pyspark distribution's own launcher classes (the jars pip
installed), as `sbin/start-master.sh` and `start-worker.sh` would start them.

Two things the pip distribution lacks for a worker that launches executors: a `RELEASE`
file beside `jars/` in SPARK_HOME (so the launcher takes `jars/` as the distribution's), and
SPARK_SCALA_VERSION (it would look for build directories otherwise). The fixture makes a
SPARK_HOME of links to the pip package with that file, and sets the version from the
scala-library jar.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tailrace.devservers import free_port


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


def _spark_home(directory: Path) -> tuple[Path, Path, str]:
    """(SPARK_HOME made of links to the pip package, its jars, the Scala version)."""
    import pyspark

    package = Path(pyspark.__file__).parent
    home = directory / "spark-home"
    home.mkdir()
    for part in ("jars", "bin", "python"):
        if (package / part).exists():
            (home / part).symlink_to(package / part)
    (home / "RELEASE").write_text(f"Spark {pyspark.__version__} (pip)\n")
    scala = next(re.search(r"scala-library-(\d+\.\d+)", p.name)
                 for p in (package / "jars").glob("scala-library-*.jar"))
    assert scala is not None
    return home, package / "jars", scala.group(1)


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[SparkCluster]:
    """A master and one worker with 2 cores; executors run this interpreter (PYSPARK_PYTHON),
    so they import Tailrace as the driver does."""
    home, jars, scala = _spark_home(tmp_path)
    port = free_port()
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_SCALA_VERSION": scala,
           "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", tmp_path)
    java = ["java", "-cp", f"{jars}/*", "-Xmx512m"]
    commands = {
        "master": [*java, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                   "--port", str(port), "--webui-port", "0"],
        "worker": [*java, "org.apache.spark.deploy.worker.Worker", cluster.master_url,
                   "--host", "127.0.0.1", "--cores", "2", "--memory", "2g", "--webui-port", "0",
                   "--work-dir", str(tmp_path / "work")],
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
