"""`tailrace-control`: the control service (checkpoints, epochs, ...) over gRPC."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from tailrace.logs import get_logger, setup_logging
from tailrace_services.control.server import serve
from tailrace_services.control.storage import open_storage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tailrace-control", description=__doc__)
    parser.add_argument("--listen", default=os.environ.get("TAILRACE_CONTROL_LISTEN",
                                                           "127.0.0.1:50051"),
                        help="gRPC address (default %(default)s)")
    parser.add_argument("--storage", default=os.environ.get(
        "TAILRACE_CONTROL_STORAGE", "sqlite:///.tailrace/control.db"),
        help="sqlite:///path/state.db (default %(default)s) or memory://")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)

    setup_logging("control", args.log_level)
    log = get_logger()
    storage = open_storage(args.storage)
    server = serve(storage, args.listen)
    log.info("control service listening", address=args.listen, port=server.port,
             storage=args.storage.split("://")[0])

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("control service stopping")
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
