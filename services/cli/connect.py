"""How the `tailrace` admin commands reach the control service: the admin token and TLS.

The token: `--token` (shows in `ps`; prefer the others), `--token-file FILE`, else
$TAILRACE_ADMIN_TOKEN; the old $TAILRACE_TOKEN is still read, with a warning. It is sent on
every call: reads need a token too unless the control service runs with --open-reads.
TLS: `--tls-ca` (trust), `--tls-cert` and `--tls-key` (mutual TLS).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from tailrace.control_access import ADMIN_TOKEN_ENV, read_token_file
from tailrace.control_client import ControlClient
from tailrace.control_tls import CLI_SETTINGS, ClientTls

LEGACY_TOKEN_ENV = "TAILRACE_TOKEN"


def add_credential_options(parser: argparse.ArgumentParser, default: Callable[[Any], Any]) -> None:
    env = os.environ.get
    parser.add_argument("--token", default=default(None),
                        help="the admin token (visible in the process list: prefer --token-file "
                             f"or ${ADMIN_TOKEN_ENV})")
    parser.add_argument("--token-file", metavar="FILE", default=default(None),
                        help=f"read the admin token from FILE's first line (default "
                             f"${ADMIN_TOKEN_ENV})")
    parser.add_argument("--tls-ca", metavar="PEM", default=default(env("TAILRACE_CONTROL_CA")),
                        help="talk TLS, trusting this CA certificate (default $TAILRACE_CONTROL_CA)")
    parser.add_argument("--tls-cert", metavar="PEM",
                        default=default(env("TAILRACE_CONTROL_CLIENT_CERT")),
                        help="client certificate for mutual TLS, with --tls-key (default "
                             "$TAILRACE_CONTROL_CLIENT_CERT)")
    parser.add_argument("--tls-key", metavar="PEM",
                        default=default(env("TAILRACE_CONTROL_CLIENT_KEY")),
                        help="its private key (default $TAILRACE_CONTROL_CLIENT_KEY)")


def admin_token(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    if getattr(args, "token", None):
        return str(args.token)
    if getattr(args, "token_file", None):
        return read_token_file(args.token_file, "--token-file")
    if env.get(ADMIN_TOKEN_ENV):
        return env[ADMIN_TOKEN_ENV]
    if env.get(LEGACY_TOKEN_ENV):
        print(f"tailrace: warning: ${LEGACY_TOKEN_ENV} is deprecated; set ${ADMIN_TOKEN_ENV} "
              "instead", file=sys.stderr)
        return env[LEGACY_TOKEN_ENV]
    return None


def admin_client(args: argparse.Namespace) -> ControlClient:
    """A client for one command: short retries, the admin token, TLS from the flags. Raises
    `ConfigError` for an unreadable token or certificate file."""
    tls = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        tls = ClientTls.from_files(args.tls_ca, args.tls_cert, args.tls_key,
                                   names=("--tls-ca", "--tls-cert", "--tls-key"))
    return ControlClient(args.control, timeout=10, retry_for=2, token=admin_token(args), tls=tls,
                         tls_settings=CLI_SETTINGS)
