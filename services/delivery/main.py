"""`tailrace-delivery PIPELINE.yaml`: the PySpark job that delivers the bus to the sinks."""

from __future__ import annotations

import argparse
import sys

from tailrace.config import load_pipeline
from tailrace.errors import ConfigError, FatalError
from tailrace.logs import get_logger, setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tailrace-delivery", description=__doc__)
    parser.add_argument("pipeline", help="pipeline spec (YAML)")
    parser.add_argument("--master", default="local[*]",
                        help="Spark master (default %(default)s); the package must be importable "
                             "on executors")
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

    try:
        run(spec, master=args.master)
    except FatalError as e:
        log.error("delivery stopped", reason=str(e))
        return 1
    except KeyboardInterrupt:
        log.info("delivery stopped by signal")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
