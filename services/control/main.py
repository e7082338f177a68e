"""`tailrace-control`: the control service — checkpoints, commit policy, epochs, schema registry,
server identities, dead-letter queue and the admin API — over gRPC, with an HTTP side port.

Every call needs a token: the service token (capture, delivery) or the admin token
(operators); see README "Security". Without tokens it refuses to start unless given
--insecure-no-auth."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

from tailrace.httpside import start_http_side
from tailrace.logs import add_log_options, get_logger, redact, setup_logging
from tailrace.stopping import call_on_stop_signals
from tailrace_services.control.audit import DEFAULT_KEEP
from tailrace_services.control.auth import AuthPolicy
from tailrace_services.control.metrics import register_pipeline_metrics
from tailrace_services.control.registry_http import registry_routes
from tailrace_services.control.roles import RoleTableError
from tailrace_services.control.server import ServerTls, serve
from tailrace_services.control.storage import StorageUnavailable, open_storage
from tailrace_services.control.subjects import Subjects
from tailrace_services.control.tokens import load_tokens


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
    parser.add_argument("--service-token-file", metavar="FILE",
                        help="the service token (first line), used by capture and delivery; "
                             "or set TAILRACE_SERVICE_TOKEN")
    parser.add_argument("--admin-token-file", metavar="FILE",
                        help="the admin token (first line), used by operators (tailrace CLI); "
                             "or set TAILRACE_ADMIN_TOKEN")
    parser.add_argument("--token-file", default=env("TAILRACE_CONTROL_TOKEN_FILE"),
                        help="deprecated: the admin token; use --admin-token-file")
    parser.add_argument("--open-reads", action="store_true",
                        help="let calls without a token list and get (pipelines, checkpoints, "
                             "schemas, health, DLQ entries, reflection); changes still need one")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="serve without tokens: anyone who reaches the port may change "
                             "checkpoints and stop delivery. For a throwaway local run only")
    parser.add_argument("--audit-keep", type=int, default=DEFAULT_KEEP, metavar="N",
                        help="keep the newest N audit records per role (default %(default)s)")
    parser.add_argument("--tls-cert", default=env("TAILRACE_CONTROL_TLS_CERT"),
                        help="PEM certificate chain: serve gRPC over TLS (with --tls-key)")
    parser.add_argument("--tls-key", default=env("TAILRACE_CONTROL_TLS_KEY"),
                        help="PEM private key for --tls-cert")
    parser.add_argument("--tls-client-ca", default=env("TAILRACE_CONTROL_TLS_CLIENT_CA"),
                        help="PEM CA certificate(s): require every client to present a "
                             "certificate signed by it (mutual TLS; needs --tls-cert)")
    parser.add_argument("--http-port", type=int, default=env("TAILRACE_CONTROL_HTTP_PORT"),
                        help="serve /health, /ready and /metrics on this port (0 = a free one), "
                             "on the --listen host")
    add_log_options(parser)
    return parser


def _auth(args: argparse.Namespace) -> AuthPolicy:
    tokens = load_tokens(args.service_token_file, args.admin_token_file, args.token_file)
    if tokens is not None and args.insecure_no_auth:
        raise ValueError("--insecure-no-auth and tokens were both given; drop one (the tokens "
                         "come from --*-token-file or TAILRACE_SERVICE_TOKEN/TAILRACE_ADMIN_TOKEN)")
    if tokens is None and not args.insecure_no_auth:
        raise ValueError("no tokens: every call needs one. Give --service-token-file FILE and "
                         "--admin-token-file FILE (or set TAILRACE_SERVICE_TOKEN and "
                         "TAILRACE_ADMIN_TOKEN); `openssl rand -hex 32` makes one. To serve "
                         "without authentication on a throwaway setup, pass --insecure-no-auth")
    return AuthPolicy(tokens=tokens, open_reads=args.open_reads)


def _tls(args: argparse.Namespace) -> ServerTls | None:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together; give both or neither")
    if args.tls_client_ca and not args.tls_cert:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key: mutual TLS is TLS first")
    if not args.tls_cert:
        return None
    return ServerTls(_read_pem(args.tls_cert, "--tls-cert"), _read_pem(args.tls_key, "--tls-key"),
                     _read_pem(args.tls_client_ca, "--tls-client-ca") if args.tls_client_ca
                     else None)


def _read_pem(path: str, flag: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read {flag} {path}: {e.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{flag} {path} is not PEM (no '-----BEGIN' line)")
    return data


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging("control", args.log_level, fmt=args.log_format)
    log = get_logger()
    try:
        auth = _auth(args)
        tls = _tls(args)
        storage = open_storage(args.storage)
        server = serve(storage, args.listen, auth=auth, tls=tls, audit_keep=args.audit_keep)
    except (ValueError, OSError, StorageUnavailable, RoleTableError) as e:
        print(f"tailrace-control: cannot start: {redact(str(e))}", file=sys.stderr)
        return 2
    host = args.listen.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
    side = None
    if args.http_port is not None:
        side = start_http_side(int(args.http_port), server.check, server.ready, host=host,
                               routes=registry_routes(Subjects(server.storage), auth))
        register_pipeline_metrics(server.storage, server.health)  # state gauge, sink lag
    log.info("control service listening", address=args.listen, port=server.port,
             storage=args.storage.split("://")[0], tls=tls is not None,
             mutual_tls=tls is not None and tls.client_ca is not None,
             auth=auth.tokens is not None, open_reads=auth.open_reads,
             http_port=side.port if side else None)

    stop = threading.Event()
    call_on_stop_signals(stop.set)
    stop.wait()
    log.info("control service stopping")
    if side is not None:
        side.stop()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
