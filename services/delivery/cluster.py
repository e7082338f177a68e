"""`tailrace-spark master|worker|archive`: Spark from the pyspark that pip installed.

Delivery submits to a Spark cluster with `--master spark://HOST:7077`. Where there is none
(docker compose, a few hosts), this starts a master or a worker, each in its own JVM, from
pyspark's own jars, as Spark's `sbin/start-master.sh` and `start-worker.sh` would. The pip
distribution lacks two things a worker needs to launch executors: a `RELEASE` file beside
`jars/` in SPARK_HOME (else the launcher looks for a source build), and SPARK_SCALA_VERSION.
So SPARK_HOME becomes a dir of links to the package plus that file, and the version is read
off the scala-library jar. Executors run this interpreter (PYSPARK_PYTHON), so they import
Tailrace as the driver does.

`archive` writes a class-data archive of the driver's JVM (AppCDS): the classes a Spark
session loads, mapped from one file instead of read from ~250 jars at every start. Delivery
uses it when it exists (`class_archive()`): a session starts in ~5.5 s instead of ~8 s here,
and its first job takes ~1.4 s instead of ~2.5 s — paid again by every delivery start,
failover and restart. A JVM other than the one it was made by ignores it with a warning.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

__all__ = ["class_archive", "command", "main", "spark_home", "write_class_archive"]

ARCHIVE_ENV = "TAILRACE_SPARK_CDS"  # the archive's path, or "off"


def default_archive() -> Path:
    """Beside this installation (a venv's own dir, an image's /usr/local)."""
    return Path(sys.prefix) / "share" / "tailrace" / "spark-driver.jsa"


def class_archive() -> Path | None:
    """The driver's class-data archive, if one was written (`tailrace-spark archive`)."""
    setting = os.environ.get(ARCHIVE_ENV, "")
    if setting == "off":
        return None
    path = Path(setting) if setting else default_archive()
    return path if path.is_file() else None


def write_class_archive(path: Path) -> None:
    """Start a local session as delivery does, run a small streaming query, and let the
    JVM dump the classes it loaded when it exits; then move the archive into place."""
    import subprocess

    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f"{path.name}.*.partial"):  # of a run that was stopped
        if not pid_alive(stale.name.removeprefix(f"{path.name}.").removesuffix(".partial")):
            stale.unlink(missing_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    script = (
        "import sys, time\n"
        "from tailrace_services.delivery.job import spark_session\n"
        "spark = spark_session('tailrace-class-archive', 'local[2]',"
        f" conf={{'spark.driver.extraJavaOptions': '-XX:ArchiveClassesAtExit={partial}'}})\n"
        "batches = []\n"
        "query = (spark.readStream.format('rate').option('rowsPerSecond', 100).load()"
        ".writeStream.foreachBatch(lambda df, i: batches.append(df.count()))"
        ".trigger(processingTime='200 milliseconds').start())\n"
        "deadline = time.monotonic() + 60\n"
        "while len(batches) < 3 and time.monotonic() < deadline: time.sleep(0.1)\n"
        "query.stop()\n"
        "from pyspark import SparkContext\n"
        "gateway = SparkContext._gateway\n"
        "spark.stop()\n"
        "gateway.proc.stdin.close()  # the JVM exits, and dumps the archive on its way out\n"
        "gateway.proc.wait(600)\n"
    )
    env = {**os.environ, ARCHIVE_ENV: "off"}
    run = subprocess.run([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, timeout=600)
    if run.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join(run.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"tailrace-spark archive: the JVM wrote no archive at {partial} "
                         f"(exit {run.returncode}); delivery starts without one, ~4 s slower."
                         f"\n{tail}")
    partial.replace(path)


def pid_alive(pid: str) -> bool:
    """Whether the process a file is named after still runs, and so may still use the file
    (another user's process counts as running)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, OverflowError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True

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
    parser.add_argument("role", choices=[*sorted(ROLES), "archive"],
                        help="master or worker: start one; archive: write the driver's "
                             "class-data archive (faster delivery starts)")
    parser.add_argument("--path", help="archive: where to write it (default: "
                                       f"{default_archive()}, or ${ARCHIVE_ENV})")
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
    if args.role == "archive":
        path = Path(args.path) if args.path else default_archive()
        write_class_archive(path)
        print(f"tailrace-spark: wrote {path} ({path.stat().st_size // 2**20} MiB); delivery "
              f"uses it from now on (${ARCHIVE_ENV}=off does without)", file=sys.stderr)
        return 0
    home, jars, scala = spark_home(Path(args.dir))
    os.environ.update({"SPARK_HOME": str(home), "SPARK_SCALA_VERSION": scala,
                       "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)})
    argv_ = command(args, jars)
    print(f"tailrace-spark: {args.role}: {' '.join(argv_)}", file=sys.stderr, flush=True)
    os.execvp(argv_[0], argv_)  # the JVM takes this process: signals reach it directly
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
