"""`tailrace-spark master|worker`: a standalone Spark cluster from the pyspark that pip installed.

Delivery submits to a Spark cluster with `--master spark://HOST:7077`. Where there is none
(docker compose, a few hosts), this starts a master or a worker, each in its own JVM, from
pyspark's own jars, as Spark's `sbin/start-master.sh` and `start-worker.sh` would. The pip
distribution lacks two things a worker needs to launch executors: a `RELEASE` file beside
`jars/` in SPARK_HOME (else the launcher looks for a source build), and SPARK_SCALA_VERSION.
So SPARK_HOME becomes a dir of links to the package plus that file, and the version is read
off the scala-library jar. Executors run this interpreter (PYSPARK_PYTHON), so they import
Tailrace as the driver does.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

__all__ = ["command", "main", "spark_home"]

ROLES = {"master": "org.apache.spark.deploy.master.Master",
         "worker": "org.apache.spark.deploy.worker.Worker"}


def spark_home(directory: Path) -> tuple[Path, Path, str]:
    """(a SPARK_HOME of links to the pip package, its jars dir, the Scala version)."""
    import pyspark

    package = Path(pyspark.__file__).parent
    home = directory / "spark-home"
    home.mkdir(parents=True, exist_ok=True)
    for part in ("jars", "bin", "python"):
        link = home / part
        if (package / part).exists() and not link.exists():
            link.symlink_to(package / part)
    (home / "RELEASE").write_text(f"Spark {pyspark.__version__} (pip)\n")
    found = [re.search(r"scala-library-(\d+\.\d+)", p.name)
             for p in (package / "jars").glob("scala-library-*.jar")]
    versions = [m.group(1) for m in found if m]
    if not versions:
        raise SystemExit(f"tailrace-spark: no scala-library jar in {package / 'jars'}: is "
                         "pyspark installed whole? (pip install --force-reinstall pyspark)")
    return home, package / "jars", versions[0]


def command(args: argparse.Namespace, jars: Path) -> list[str]:
    """The JVM's command line for `args.role`."""
    java = [os.environ.get("JAVA", "java"), "-cp", f"{jars}/*", f"-Xmx{args.daemon_memory}",
            ROLES[args.role]]
    if args.role == "master":
        return [*java, "--host", args.host, "--port", str(args.port),
                "--webui-port", str(args.webui_port)]
    if not args.master:
        raise SystemExit("tailrace-spark worker: give the master, e.g. spark://spark-master:7077")
    return [*java, args.master, "--host", args.host, "--cores", str(args.cores),
            "--memory", args.memory, "--webui-port", str(args.webui_port),
            "--work-dir", str(Path(args.dir) / "work")]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailrace-spark", description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("master", nargs="?", help="worker: the master's spark://HOST:PORT")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind and advertise (default %(default)s)")
    parser.add_argument("--port", type=int, default=7077, help="master: its port (%(default)s)")
    parser.add_argument("--webui-port", type=int, default=8081,
                        help="the web UI's port, 0 = a free one (default %(default)s)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                        help="worker: cores for executors (default: this host's, %(default)s)")
    parser.add_argument("--memory", default="2g", help="worker: memory for executors (%(default)s)")
    parser.add_argument("--daemon-memory", default="512m",
                        help="the master's or worker's own JVM heap (default %(default)s)")
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "tailrace-spark"),
                        help="SPARK_HOME's links and the worker's work dir (default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    home, jars, scala = spark_home(Path(args.dir))
    os.environ.update({"SPARK_HOME": str(home), "SPARK_SCALA_VERSION": scala,
                       "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)})
    argv_ = command(args, jars)
    print(f"tailrace-spark: {args.role}: {' '.join(argv_)}", file=sys.stderr, flush=True)
    os.execvp(argv_[0], argv_)  # the JVM takes this process: signals reach it directly
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
