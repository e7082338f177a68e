"""`tailrace-capture PIPELINE.yaml`: runs the capture service for the spec's source type."""

from __future__ import annotations

import argparse
import signal
import sys

from tailrace.config import load_pipeline
from tailrace.control_client import ControlClient
from tailrace.errors import ConfigError, FatalError
from tailrace.logs import get_logger, setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tailrace-capture", description=__doc__)
    parser.add_argument("pipeline", help="pipeline spec (YAML)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    setup_logging("capture", args.log_level)
    log = get_logger()
    try:
        spec = load_pipeline(args.pipeline)
    except ConfigError as e:
        print(f"tailrace-capture: invalid pipeline spec:\n{e}", file=sys.stderr)
        return 2

    control = ControlClient(spec.spec.control.address)
    if spec.spec.source.type == "postgres":
        from tailrace_services.capture_postgres.service import PostgresCapture

        capture = PostgresCapture(spec, control)
    else:
        print(f"tailrace-capture: source type {spec.spec.source.type!r} is not available yet",
              file=sys.stderr)
        return 2

    def on_signal(*_: object) -> None:
        capture.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("capture starting", pipeline=spec.name, source=spec.spec.source.id,
             type=spec.spec.source.type)
    try:
        capture.run()
    except FatalError as e:
        log.error("capture stopped", reason=str(e))
        return 1
    except ConfigError as e:
        log.error("capture cannot start", reason=str(e))
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
