"""DSN checks that need no server: a malformed DSN is a configuration error, found when the
spec is loaded (and, for what only libpq notices, when a connection is refused for it).

Messages name the problem and the fix, never the password: they show a parameter's name
and, for non-secret parameters, its value.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

from tailrace.errors import ConfigError
from tailrace.logs import redact

__all__ = ["check_mysql_dsn", "check_postgres_dsn", "config_error_of"]

# libpq's enumerated connection parameters and what they accept.
_PG_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby",
                             "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
    "replication": ("true", "on", "yes", "1", "false", "off", "no", "0", "database"),
}
_PG_INTEGERS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
                "keepalives_count", "tcp_user_timeout", "sslcompression")
_MYSQL_SCHEMES = ("mysql", "mariadb")

# What libpq says when it refuses a DSN before connecting (not the server's answers).
_LIBPQ_CONFIG_ERRORS = re.compile(
    r'invalid integer value "[^"]*" for connection option "[^"]*"'
    r'|invalid \w+ value: "[^"]*"'
    r'|invalid connection option "[^"]*"'
    r'|invalid port number: "[^"]*"'
    r'|missing "=" after "[^"]*" in connection info string'
    r'|unterminated quoted string in connection info string'
    r'|invalid URI query parameter: "[^"]*"')


def check_postgres_dsn(dsn: str) -> None:
    """Raise ValueError (what is wrong and the fix) unless `dsn` is a usable libpq DSN."""
    # imported here: psycopg takes ~0.2 s to import, in every process that imports the
    # config (each of delivery's Spark Python workers), most of which never check a DSN
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except Exception as e:  # psycopg.ProgrammingError: libpq could not parse it
        text = redact(str(e)).strip()
        if "@" in dsn or "password" in dsn.lower():  # libpq quotes what it could not parse
            text = re.sub(r'"[^"]*"', '"…"', text)
        raise ValueError(f"not a valid PostgreSQL DSN: {text}; use "
                         "postgresql://user:password@host:5432/db or "
                         "'host=... port=5432 dbname=...'") from None
    problems = []
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            problems.append(f"port {port!r} is not a port number; use 1..65535, e.g. 5432")
    for name, allowed in _PG_CHOICES.items():
        value = params.get(name)
        if value is not None and str(value).lower() not in allowed:
            problems.append(f"{name} {str(value)!r} is not one of {', '.join(allowed)}")
    for name in _PG_INTEGERS:
        value = params.get(name)
        if value is not None and not re.fullmatch(r"-?\d+", str(value).strip()):
            problems.append(f"{name} {str(value)!r} is not a whole number")
    if problems:
        raise ValueError("; ".join(problems))


def check_mysql_dsn(dsn: str) -> None:
    """Raise ValueError unless `dsn` is `mysql://user:password@host:port/db` (or mariadb://)."""
    try:
        url: SplitResult = urlsplit(dsn)
        port = url.port
    except ValueError as e:
        raise ValueError(f"not a valid MySQL URL: {_url_problem(e)}; use "
                         "mysql://user:password@host:3306/") from None
    if url.scheme not in _MYSQL_SCHEMES:
        shown = f"scheme {url.scheme!r}" if url.scheme else "no scheme"
        raise ValueError(f"not a MySQL URL ({shown}); use mysql://user:password@host:3306/ "
                         "(or mariadb://)")
    if not url.hostname:
        raise ValueError("the URL has no host; use mysql://user:password@host:3306/")
    if port == 0:
        raise ValueError("port 0 is not a port number; use 1..65535, e.g. 3306")


def _url_problem(error: ValueError) -> str:
    text = str(error)
    if "Port" in text or "port" in text:  # urllib: "Port could not be cast ..." / "out of range"
        return "the port is not a number in 1..65535"
    return redact(text)


def config_error_of(error: BaseException, field: str = "spec.source.dsn") -> ConfigError | None:
    """A connection error that is really a malformed DSN (libpq: invalid port, invalid
    sslmode value, an unknown option) as a ConfigError naming `field`; else None."""
    found = _LIBPQ_CONFIG_ERRORS.search(str(error))
    if found is None:
        return None
    return ConfigError(f"{field}: {redact(found.group(0)).strip()}; fix the DSN "
                       "(the connection was not attempted)")
