"""`tailrace-delivery PIPELINE.yaml`: the PySpark job that delivers the bus to the sinks.

On a fatal error the query stops, the reason goes to the control service, and the
process keeps serving `/health` (503, with the reason) until it is stopped, so an
operator or orchestrator can see why; the exit code is then 1. A newer delivery
instance for the same pipeline fences this one: it exits at once with code 1 and
says who took over.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading

from tailrace.config import load_pipeline
from tailrace.errors import ConfigError, FatalError, FencedError
from tailrace.logs import get_logger, setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tailrace-delivery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", help="pipeline spec (YAML)")
    parser.add_argument("--master", default="local[*]",
                        help="Spark master (default %(default)s); the package must be importable "
                             "on executors")
    parser.add_argument("--http-port", type=int, default=None,
                        help="serve /health, /ready, /metrics on this port (0 = any free port)")
    parser.add_argument("--exit-on-fatal", action="store_true",
                        help="exit at once on a fatal error instead of serving 503 on /health")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    setup_logging("delivery", args.log_level)
    log = get_logger()
    try:
        spec = load_pipeline(args.pipeline)
    except ConfigError as e:
        print(f"tailrace-delivery: invalid pipeline spec:\n{e}", file=sys.stderr)
        return 2
    from tailrace_services.delivery.job import run

    state = {"ok": True, "reason": "", "ready": False}
    stopped = threading.Event()
    side = None
    if args.http_port is not None:
        from tailrace.httpside import start_http_side

        side = start_http_side(args.http_port, lambda: (state["ok"], state["reason"]),
                               lambda: bool(state["ready"]))
        log.info("http side port", url=side.url)

    signal.signal(signal.SIGTERM, lambda *_: stopped.set())  # the query stops within 0.5 s
    try:
        state["ready"] = True
        run(spec, master=args.master, stop_when=stopped.is_set)
    except FencedError as e:  # the new owner carries on; serving 503 would only mislead
        log.error("delivery fenced; stopping", reason=str(e))
        return 1
    except FatalError as e:
        state.update(ok=False, reason=str(e))
        log.error("delivery stopped", reason=str(e))
        if side is not None and not args.exit_on_fatal:
            with contextlib.suppress(KeyboardInterrupt):
                stopped.wait()
        return 1
    except KeyboardInterrupt:
        log.info("delivery stopped by signal")
    finally:
        if side is not None:
            side.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
