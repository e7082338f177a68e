"""The control service's tokens: one per role, read from a file or the environment.

- service token: `--service-token-file FILE`, else `TAILRACE_SERVICE_TOKEN`;
- admin token: `--admin-token-file FILE`, else `TAILRACE_ADMIN_TOKEN`; the old
  `--token-file` / `TAILRACE_CONTROL_TOKEN_FILE` / `TAILRACE_CONTROL_TOKEN` still work as the
  admin token, with a deprecation warning.

A file holds the token on its first line. Both tokens are needed (unless the service runs
with `--insecure-no-auth`), they must differ, and each must be at least `MIN_LENGTH`
characters. A token is never logged; it is compared as a SHA-256 digest in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tailrace.logs import get_logger
from tailrace_services.control.roles import Role

log = get_logger(__name__)

SERVICE_ENV = "TAILRACE_SERVICE_TOKEN"
ADMIN_ENV = "TAILRACE_ADMIN_TOKEN"
LEGACY_ENV = "TAILRACE_CONTROL_TOKEN"
MIN_LENGTH = 16


class TokenError(ValueError):
    """The tokens given to the control service cannot be used; the message says the fix."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class Tokens:
    """The service and admin tokens, kept as digests only."""

    service: bytes = field(repr=False)
    admin: bytes = field(repr=False)

    @classmethod
    def of(cls, service: str, admin: str) -> Tokens:
        for role, token in (("service", service), ("admin", admin)):
            if len(token) < MIN_LENGTH:
                raise TokenError(f"the {role} token has {len(token)} characters; use at least "
                                 f"{MIN_LENGTH} (e.g. `openssl rand -hex 32`)")
        if hmac.compare_digest(_digest(service), _digest(admin)):
            raise TokenError("the service and admin tokens are the same, which would make every "
                             "capture and delivery process an admin; use two different tokens")
        return cls(_digest(service), _digest(admin))

    def role_of(self, token: str | None) -> Role | None:
        """The role `token` grants, or None; both digests are always compared."""
        if not token:
            return None
        given = _digest(token)
        is_service = hmac.compare_digest(given, self.service)
        is_admin = hmac.compare_digest(given, self.admin)
        return Role.ADMIN if is_admin else Role.SERVICE if is_service else None


def read_token_file(path: str, flag: str) -> str:
    """The first line of `path`, stripped; `flag` names the setting in errors."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise TokenError(f"cannot read {flag} {path}: {e.strerror}") from None
    token = lines[0].strip() if lines else ""
    if not token:
        raise TokenError(f"{flag} {path} is empty; put the token on its first line")
    return token


def load_tokens(service_file: str | None, admin_file: str | None, legacy_file: str | None,
                env: Mapping[str, str] | None = None) -> Tokens | None:
    """Both tokens, or None when none is configured at all (the caller decides whether that is
    allowed). Raises `TokenError` for one without the other, an unreadable file, or two
    sources for the same token."""
    env = os.environ if env is None else env
    service = (read_token_file(service_file, "--service-token-file") if service_file
               else env.get(SERVICE_ENV) or None)
    admin = _admin_token(admin_file, legacy_file, env)
    if service is None and admin is None:
        return None
    if service is None:
        raise TokenError("an admin token is set but no service token: capture and delivery "
                         f"need one; pass --service-token-file FILE or set {SERVICE_ENV}")
    if admin is None:
        raise TokenError("a service token is set but no admin token: operators need one; "
                         f"pass --admin-token-file FILE or set {ADMIN_ENV}")
    return Tokens.of(service, admin)


def _admin_token(admin_file: str | None, legacy_file: str | None, env: Mapping[str, str]
                 ) -> str | None:
    if admin_file and legacy_file:
        raise TokenError("--admin-token-file and --token-file both name the admin token; "
                         "keep --admin-token-file")
    if admin_file:
        return read_token_file(admin_file, "--admin-token-file")
    if legacy_file:
        log.warning("--token-file is deprecated; use --admin-token-file (and "
                     "--service-token-file for capture and delivery)")
        return read_token_file(legacy_file, "--token-file")
    if env.get(ADMIN_ENV):
        return env[ADMIN_ENV]
    if env.get(LEGACY_ENV):
        log.warning(f"{LEGACY_ENV} is deprecated; set {ADMIN_ENV} instead")
        return env[LEGACY_ENV]
    return None
