"""`tailrace-delivery PIPELINE.yaml`: the PySpark job that delivers the bus to the sinks.
`tailrace-delivery --managed NAME`: the spec the control service keeps for NAME, each new
version loaded as it is applied, in the same Spark session (`tailrace.managed`).

`/health` is 200 only while the pipeline moves. A non-retryable error of a sink the
commit policy waits for (a wrong password, a missing privilege, a message too large)
makes it 503 `failed` at once, with the sink and the error; the process keeps retrying
the batch with backoff (1 s doubling to 30 s) and is healthy again after the first batch
that moves a checkpoint, so fixing the sink is enough. Restarts in a row without a
checkpoint advancing (5) make it 503 `degraded`, with the last error. The control
service gets the same state (`tailrace pipelines`).

On a fatal error the query stops, the reason goes to the control service, and the
process keeps serving `/health` (503, with the reason) until it is stopped, so an
operator or orchestrator can see why; the exit code is then 1. A configuration error
found while the pipeline runs (on the driver or on an executor: a librdkafka setting the
client refuses, a sink's TLS file that cannot be read) is fatal the same way, never
restarted, with exit code 2. One found before the pipeline starts (the spec itself, an
unreadable control.token_file, TLS that does not fit the control service's) exits at
once with code 2. One instance delivers a pipeline at a time: others wait as standbys
(`/ready` 503 naming the active one) until its lease lapses (`--lease-ttl-s`), or at once
when its process is gone from this host. An instance that lost its lease, or that another
fenced (`--take-over`), exits at once with code 1 and says who took over.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any

from tailrace.config import PipelineSpec, load_pipeline
from tailrace.errors import ConfigError, FatalError, FencedError, NonRetryableError
from tailrace.lease import DEFAULT_TTL_S
from tailrace.logs import add_log_options, get_logger, setup_logging
from tailrace.managed import (
    ManagedSpec,
    add_managed_options,
    managed_spec,
    run_versions,
    wait_until_stopped_or_changed,
)
from tailrace.stopping import call_on_stop_signals

if TYPE_CHECKING:
    from tailrace_services.delivery.health import PipelineHealth


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailrace-delivery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", nargs="?", help="pipeline spec (YAML); or --managed NAME")
    parser.add_argument("--master", default="local[*]",
                        help="Spark master (default %(default)s); the package must be importable "
                             "on executors")
    parser.add_argument("--driver-host", default=None, metavar="HOST",
                        help="where executors reach this process, the Spark driver, as the "
                             "workers resolve it (default: 127.0.0.1 with a local[...] master, "
                             "else this host's name)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session, as spark-submit's --conf "
                             "(spark.cores.max=2, spark.executor.memory=1g); repeatable")
    parser.add_argument("--http-port", type=int, default=None,
                        help="serve /health, /ready, /metrics on this port (0 = any free port)")
    parser.add_argument("--exit-on-fatal", action="store_true",
                        help="exit at once on a fatal error instead of serving 503 on /health")
    parser.add_argument("--lease-ttl-s", type=float, default=DEFAULT_TTL_S,
                        help="one active delivery per pipeline: hold its lease in the control "
                             "service this long between renewals; other instances wait as "
                             "standbys and take over when it lapses (0: no lease, the newest "
                             "instance fences the older at once). Default %(default)s")
    parser.add_argument("--take-over", action="store_true",
                        help="take the pipeline from the instance that delivers it now, without "
                             "waiting for its lease to lapse (it is fenced and stops)")
    add_managed_options(parser)
    add_log_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging("delivery", args.log_level, fmt=args.log_format)
    if args.lease_ttl_s < 0:
        print("tailrace-delivery: --lease-ttl-s must be 0 (no lease) or more", file=sys.stderr)
        return 2
    bad = [item for item in args.conf if "=" not in item or not item.startswith("spark.")]
    if bad:
        print(f"tailrace-delivery: --conf {bad[0]!r} is not spark.KEY=VALUE", file=sys.stderr)
        return 2
    spark_conf = dict(item.split("=", 1) for item in args.conf)
    log = get_logger()
    try:
        managed = managed_spec(args, "tailrace-delivery")
        spec = load_pipeline(args.pipeline) if managed is None else None
    except ConfigError as e:
        print(f"tailrace-delivery: invalid pipeline spec:\n{e}", file=sys.stderr)
        return 2
    from tailrace_services.delivery.health import PipelineHealth
    from tailrace_services.delivery.job import stop_spark
    from tailrace_services.delivery.sparklog import route_stderr

    health = PipelineHealth()
    ready = threading.Event()
    stopped = threading.Event()
    side = None
    if args.http_port is not None:
        from tailrace.httpside import start_http_side

        side = start_http_side(args.http_port, health.http, lambda: (
            health.readiness() if ready.is_set() else (False, "starting")))
        log.info("http side port", url=side.url)
    run_args = {"master": args.master, "health": health, "lease_ttl_s": args.lease_ttl_s,
                "take_over": args.take_over, "spark_conf": spark_conf,
                "driver_host": args.driver_host or (
                    "127.0.0.1" if args.master.startswith("local") else socket.gethostname())}
    call_on_stop_signals(stopped.set, [signal.SIGTERM])  # the query stops within 0.5 s
    restore_stderr = route_stderr()  # the JVM's own lines in our format too
    serve_failure = side is not None and not args.exit_on_fatal
    try:
        ready.set()
        if managed is None:
            assert spec is not None
            return _deliver(spec, run_args, stopped, health, serve_failure, None)
        return run_versions(
            managed, stopped, lambda spec: _deliver(spec, run_args, stopped, health,
                                                    serve_failure, managed),
            lambda: None, "delivery")  # the query stops when it sees managed.changed
    finally:
        if side is not None:
            side.stop()
        stop_spark()
        restore_stderr()


def _deliver(spec: PipelineSpec, run_args: dict[str, Any], stopped: threading.Event,
             health: PipelineHealth, serve_failure: bool, managed: ManagedSpec | None) -> int:
    """Deliver `spec` until stopped (or, managed, until a new version is there); the exit
    code."""
    from tailrace.events._codec import JSON_ACCELERATED
    from tailrace_services.delivery.job import run

    log = get_logger()

    def stop_when() -> bool:
        return stopped.is_set() or (managed is not None and managed.changed.is_set())

    def failed(reason: str, code: int) -> int:
        """The pipeline stopped for good: say why on /health until stopped (or exit now)."""
        health.fatal(reason)
        log.error("delivery stopped", reason=reason, exit_code=code)
        if serve_failure:
            with contextlib.suppress(KeyboardInterrupt):
                wait_until_stopped_or_changed(stopped, managed)
        return code

    log.info("delivery starting", pipeline=spec.name,
             json_encoder="C" if JSON_ACCELERATED else "pure Python (slower: run `make setup`)")
    try:
        run(spec, stop_when=stop_when, **run_args)
    except FencedError as e:  # the new owner carries on; serving 503 would only mislead
        log.error("delivery fenced; stopping", reason=str(e))
        return 1
    except FatalError as e:
        return failed(str(e), 1)
    except ConfigError as e:
        if health.current.state == "failed":  # found while running: the job said so already
            return failed(health.current.reason, 2)
        # before the pipeline ran: an unreadable control.token_file, TLS not fitting control's
        log.error("delivery cannot start", reason=str(e))
        return 2
    except NonRetryableError as e:  # e.g. the control service refused the token
        log.error("delivery stopped", reason=str(e))
        return 1
    except KeyboardInterrupt:
        log.info("delivery stopped by signal")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
