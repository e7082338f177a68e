"""How capture and delivery reach the control service: address, service token and TLS.

The token comes from the spec's `control.token_file` (first line of the file) or, when
that is not set, from `TAILRACE_SERVICE_TOKEN`; the spec never holds a token itself.
`control.tls` names PEM files: `ca` (trust), `cert` and `key` (mutual TLS).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tailrace.config import ControlSpec
from tailrace.control_client import ControlClient
from tailrace.control_tls import ClientTls
from tailrace.errors import ConfigError

SERVICE_TOKEN_ENV = "TAILRACE_SERVICE_TOKEN"
ADMIN_TOKEN_ENV = "TAILRACE_ADMIN_TOKEN"


def read_token_file(path: str, setting: str) -> str:
    """The first line of `path`, stripped; errors name `setting` and never show the token."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{setting}: cannot read {path}: {e.strerror}") from None
    token = lines[0].strip() if lines else ""
    if not token:
        raise ConfigError(f"{setting}: {path} is empty; put the token on its first line")
    return token


def service_token(control: ControlSpec, env: Mapping[str, str] | None = None) -> str | None:
    """`control.token_file`'s token, else $TAILRACE_SERVICE_TOKEN, else None."""
    env = os.environ if env is None else env
    if control.token_file:
        return read_token_file(control.token_file, "spec.control.token_file")
    return env.get(SERVICE_TOKEN_ENV) or None


def client_tls(control: ControlSpec) -> ClientTls | None:
    tls = control.tls
    if tls is None:
        return None
    return ClientTls.from_files(tls.ca, tls.cert, tls.key, names=(
        "spec.control.tls.ca", "spec.control.tls.cert", "spec.control.tls.key"))


def service_client(control: ControlSpec, **options: Any) -> ControlClient:
    """A client with the service token and TLS of `control`; `options` go to `ControlClient`
    (timeout, retry_for). Raises `ConfigError` for an unreadable token or certificate file."""
    return ControlClient(control.address, token=service_token(control), tls=client_tls(control),
                         **options)
