"""Tokens for a local run (`tailrace up`, `tailrace demo`): made once, kept in the state dir.

The service token is the spec's `control.token_file` when it names one, else
`STATE/service.token`; the admin token is `STATE/admin.token`. Missing files are created
with a random token, readable by their owner only. Control reads both files; capture and
delivery get the service token from the spec's file or from $TAILRACE_SERVICE_TOKEN, which
`env` sets for them.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from tailrace.config import PipelineSpec
from tailrace.control_access import SERVICE_TOKEN_ENV, read_token_file
from tailrace.errors import ConfigError


@dataclass(frozen=True)
class LocalTokens:
    service_file: Path
    admin_file: Path
    env: dict[str, str]  # for the supervised processes

    def control_args(self) -> list[str]:
        return ["--service-token-file", str(self.service_file),
                "--admin-token-file", str(self.admin_file)]


def _ensure(path: Path) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(secrets.token_hex(32) + "\n")
    return path


def local_tokens(spec: PipelineSpec, state_dir: Path) -> LocalTokens:
    """Raises `ConfigError` for a spec a local run cannot serve (control.tls: the local control
    service speaks plaintext) or an unreadable `control.token_file`."""
    control = spec.spec.control
    if control.tls is not None:
        raise ConfigError("spec.control.tls: a local run starts the control service without "
                          "TLS; remove control.tls, or start tailrace-control yourself with "
                          "--tls-cert and --tls-key and run capture and delivery alone")
    admin_file = _ensure(state_dir / "admin.token")
    if control.token_file:
        service_file = Path(control.token_file)
        read_token_file(control.token_file, "spec.control.token_file")  # fail early, clearly
        return LocalTokens(service_file, admin_file, {})
    service_file = _ensure(state_dir / "service.token")
    token = read_token_file(str(service_file), str(service_file))
    return LocalTokens(service_file, admin_file, {SERVICE_TOKEN_ENV: token})
