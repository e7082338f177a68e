"""`tailrace-capture PIPELINE.yaml`: runs the capture service for the spec's source type.
`tailrace-capture --managed NAME`: the spec the control service keeps for NAME, each new
version loaded as it is applied (`tailrace apply`; `tailrace.managed`).

Exit codes: 0 stopped by a signal, 1 a fatal error (a lost source position, halted
schema drift, ...), 2 an invalid spec or source configuration. With `--http-port`
a fatal error keeps the side port up with `/health` answering 503 and the reason,
until SIGTERM (or exit at once with `--exit-on-fatal`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from typing import TYPE_CHECKING, Any

from tailrace.config import PipelineSpec, load_pipeline
from tailrace.control_access import service_client
from tailrace.errors import ConfigError, FatalError
from tailrace.events._wire import ACCELERATED
from tailrace.lease import DEFAULT_TTL_S, Lease
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
    from tailrace_services.capture.lifecycle import CaptureService


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailrace-capture", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", nargs="?", help="pipeline spec (YAML); or --managed NAME")
    parser.add_argument("--http-port", type=int, default=None,
                        help="serve /health, /ready, /metrics on this port (0 = any free port)")
    parser.add_argument("--exit-on-fatal", action="store_true",
                        help="exit at once on a fatal error instead of serving 503 on /health")
    parser.add_argument("--lease-ttl-s", type=float, default=DEFAULT_TTL_S,
                        help="one active capture per source: hold its lease in the control "
                             "service this long between renewals; other instances wait as "
                             "standbys and take over when it lapses (0: no lease, for a "
                             "single instance). Default %(default)s")
    add_managed_options(parser)
    add_log_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging("capture", args.log_level, fmt=args.log_format)
    log = get_logger()
    if args.lease_ttl_s < 0:
        print("tailrace-capture: --lease-ttl-s must be 0 (no lease) or more", file=sys.stderr)
        return 2
    try:
        managed = managed_spec(args, "tailrace-capture")
        spec = load_pipeline(args.pipeline) if managed is None else None
    except ConfigError as e:
        print(f"tailrace-capture: invalid pipeline spec:\n{e}", file=sys.stderr)
        return 2
    stopped = threading.Event()
    running: list[CaptureService[Any]] = []  # the run under way (managed: one per version)

    def on_signal() -> None:
        stopped.set()
        _stop_all(running)

    call_on_stop_signals(on_signal)
    side = None
    if args.http_port is not None:
        from tailrace.httpside import Health, start_http_side

        side = start_http_side(
            args.http_port,
            lambda: running[-1].health if running else Health(True, ""),
            lambda: running[-1].readiness() if running else (False, "loading the spec"))
        log.info("http side port", url=side.url)
    serving = side is not None
    try:
        if managed is None:
            assert spec is not None
            return _run(spec, args, stopped, running, serving, None)
        return run_versions(
            managed, stopped, lambda spec: _run(spec, args, stopped, running, serving, managed),
            lambda: _stop_all(running), "capture")
    finally:
        if side is not None:
            side.stop()


def _stop_all(running: list[CaptureService[Any]]) -> None:
    for capture in running:
        capture.stop()


def _run(spec: PipelineSpec, args: argparse.Namespace, stopped: threading.Event,
         running: list[CaptureService[Any]], serving: bool, managed: ManagedSpec | None) -> int:
    """Capture `spec` until it stops; the exit code."""
    log = get_logger()
    try:
        control = service_client(spec.spec.control)
    except ConfigError as e:
        print(f"tailrace-capture: {e}", file=sys.stderr)
        return 2
    capture: CaptureService[Any]
    if spec.spec.source.type == "postgres":
        from tailrace_services.capture_postgres.service import PostgresCapture

        capture = PostgresCapture(spec, control)
    elif spec.spec.source.type == "mysql":
        from tailrace_services.capture_mysql.service import MysqlCapture

        capture = MysqlCapture(spec, control)
    else:
        print(f"tailrace-capture: source type {spec.spec.source.type!r} is not available yet",
              file=sys.stderr)
        return 2
    if args.lease_ttl_s:
        capture.lease = Lease(control, "capture", spec.spec.source.id, args.lease_ttl_s)
    if serving:  # a lost position keeps the process up to say why: it waits for resnapshot
        capture.lifecycle.wait_for_resnapshot = not args.exit_on_fatal
    running[:] = [capture]
    if stopped.is_set():
        return 0
    log.info("capture starting", pipeline=spec.name, source=spec.spec.source.id,
             type=spec.spec.source.type,
             wire_encoder="C" if ACCELERATED else "pure Python (slower: run `make setup`)")
    try:
        capture.run()
    except FatalError as e:
        log.error("capture stopped", reason=str(e))
        if serving and not args.exit_on_fatal:
            with contextlib.suppress(KeyboardInterrupt):
                wait_until_stopped_or_changed(stopped, managed)
        return 1
    except ConfigError as e:
        log.error("capture cannot start", reason=str(e))
        return 2
    finally:
        control.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
