"""`tailrace-control`: the control service — checkpoints, commit policy, epochs, schema registry,
server identities, dead-letter queue and the admin API — over gRPC, with an HTTP side port."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from tailrace.httpside import start_http_side
from tailrace.logs import get_logger, redact, setup_logging
from tailrace_services.control.auth import load_token
from tailrace_services.control.server import serve
from tailrace_services.control.storage import StorageUnavailable, open_storage


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="tailrace-control", description=__doc__)
    parser.add_argument("--listen", default=env("TAILRACE_CONTROL_LISTEN", "127.0.0.1:50051"),
                        help="gRPC address (default %(default)s)")
    parser.add_argument("--storage", default=env("TAILRACE_CONTROL_STORAGE",
                                                 "sqlite:///.tailrace/control.db"),
                        help="sqlite:///path/state.db (default %(default)s), "
                             "postgresql://user@host/db (replicas may share it) or memory://; "
                             "also TAILRACE_CONTROL_STORAGE, which keeps a password out of `ps`")
    parser.add_argument("--token-file", default=env("TAILRACE_CONTROL_TOKEN_FILE"),
                        help="admin token (first line); admin mutations then need "
                             "'authorization: Bearer <token>'. Or set TAILRACE_CONTROL_TOKEN")
    parser.add_argument("--tls-cert", default=env("TAILRACE_CONTROL_TLS_CERT"),
                        help="PEM certificate chain: serve gRPC over TLS (with --tls-key)")
    parser.add_argument("--tls-key", default=env("TAILRACE_CONTROL_TLS_KEY"),
                        help="PEM private key for --tls-cert")
    parser.add_argument("--http-port", type=int, default=env("TAILRACE_CONTROL_HTTP_PORT"),
                        help="serve /health, /ready and /metrics on this port (0 = a free one), "
                             "on the --listen host")
    parser.add_argument("--log-level", default="info")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging("control", args.log_level)
    log = get_logger()
    try:
        token = load_token(args.token_file)
        tls = None
        if bool(args.tls_cert) != bool(args.tls_key):
            raise ValueError("--tls-cert and --tls-key go together; give both or neither")
        if args.tls_cert:
            tls = (Path(args.tls_cert).read_bytes(), Path(args.tls_key).read_bytes())
        storage = open_storage(args.storage)
        server = serve(storage, args.listen, token=token, tls=tls)
    except (ValueError, OSError, StorageUnavailable) as e:
        print(f"tailrace-control: cannot start: {redact(str(e))}", file=sys.stderr)
        return 2
    host = args.listen.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
    side = None
    if args.http_port is not None:
        side = start_http_side(int(args.http_port), server.check, server.ready, host=host)
    log.info("control service listening", address=args.listen, port=server.port,
             storage=args.storage.split("://")[0], tls=tls is not None, auth=token is not None,
             http_port=side.port if side else None)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("control service stopping")
    if side is not None:
        side.stop()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
