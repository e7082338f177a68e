"""structlog setup: one log format per run, JSON or console; secrets never printed.

The format is `--log-format json|console`, else `$TAILRACE_LOG_FORMAT`, else JSON unless
stderr is a terminal. `setup_logging` exports its choice (and the level) to the
environment, so what the process starts — Spark's Python workers, the services `tailrace
up` supervises — logs the same way (`setup_from_env`).

Other libraries' lines take the same form: the standard `logging` module (py4j, grpc, ...)
through structlog's `ProcessorFormatter`, and librdkafka's own lines by passing
`kafka_logger()` as confluent-kafka's `logger` setting (at warning and above). Spark's JVM
lines (log4j2) are shaped alike by the delivery service's log4j2 configuration
(`tailrace_services.delivery.sparklog`).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from tailrace.errors import ConfigError

__all__ = ["ENV_FORMAT", "ENV_LEVEL", "FORMATS", "add_log_options", "get_logger", "is_secret_key",
           "kafka_logger", "log_format", "redact", "redact_mapping", "resolve_format",
           "setup_from_env", "setup_logging"]

FORMATS = ("json", "console")
ENV_FORMAT = "TAILRACE_LOG_FORMAT"
ENV_LEVEL = "TAILRACE_LOG_LEVEL"

_SECRET_KEYS = re.compile(
    r"(password|passwd|secret|token|dsn|authorization|api_key|private_key|ssl\.key\.pem)", re.I)
# user:password@ inside URLs / DSNs; password=... in libpq key/value strings and any
# *password*/*secret*=... setting (sasl.password=, ssl.key.password=, client.secret=); and
# the same keys quoted in a printed mapping ('sasl.password': '...', "ssl.key.password": "...")
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://[^:/@\s]*):[^@\s]*@", re.I)
_KV_PASSWORD = re.compile(r"([\w.-]*(?:password|passwd|secret)[\w.-]*\s*=\s*)('[^']*'|\S+)",
                          re.I)
_QUOTED_SECRET = re.compile(
    r"""(['"][\w.-]*(?:password|passwd|secret)[\w.-]*['"]\s*:\s*)('[^']*'|"[^"]*")""", re.I)
_QUIET = ("py4j", "kafka", "grpc", "librdkafka")  # warnings and above only
_configured: dict[str, str] = {}  # what setup_logging chose in this process


def redact(text: str) -> str:
    """Remove passwords from DSNs/URLs and secret settings inside free text (error messages
    included)."""
    text = _URL_PASSWORD.sub(r"\g<scheme>:***@", text)
    text = _QUOTED_SECRET.sub(r"\1'***'", text)
    return _KV_PASSWORD.sub(r"\1***", text)


def is_secret_key(key: str) -> bool:
    """A setting whose value is a secret: `sasl.password`, `ssl.key.password`, a token, ..."""
    return bool(_SECRET_KEYS.search(key))


def redact_mapping(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy to show: values of secret keys replaced, the rest redacted as text."""
    return {k: "***" if is_secret_key(str(k)) else redact(v) if isinstance(v, str) else v
            for k, v in settings.items()}


def _redact_processor(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event.items()):
        if _SECRET_KEYS.search(key) and key != "event":
            event[key] = "***"
        elif isinstance(value, str):
            event[key] = redact(value)
        elif isinstance(value, BaseException):
            event[key] = redact(f"{type(value).__name__}: {value}")
        elif isinstance(value, Mapping):
            event[key] = redact_mapping(value)
    return event


def resolve_format(fmt: str | None = None) -> str:
    """`fmt`, else $TAILRACE_LOG_FORMAT, else `json` unless stderr is a terminal."""
    value = (fmt or os.environ.get(ENV_FORMAT) or "").strip().lower()
    if value in ("", "auto"):
        return "console" if sys.stderr.isatty() else "json"
    if value not in FORMATS:
        source = "--log-format" if fmt else ENV_FORMAT
        raise ConfigError(f"{source} is {value!r}; use json or console")
    return value


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """`--log-level` and `--log-format` for a service's command line; a bad value (also from
    $TAILRACE_LOG_LEVEL or $TAILRACE_LOG_FORMAT) is a usage error (exit 2)."""
    parser.add_argument("--log-level", type=_level_arg, default=os.environ.get(ENV_LEVEL, "info"),
                        help="debug, info, warning or error (default $TAILRACE_LOG_LEVEL or info)")
    parser.add_argument("--log-format", type=_format_arg,
                        default=os.environ.get(ENV_FORMAT) or "auto",
                        help="json or console, one format for the whole run (default "
                             "$TAILRACE_LOG_FORMAT, else json unless stderr is a terminal)")


def _format_arg(value: str) -> str:
    try:
        return resolve_format(value)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a log format; use json or "
                                         f"console (also for ${ENV_FORMAT})") from None


def _level_arg(value: str) -> str:
    if not isinstance(logging.getLevelName(value.upper()), int):
        raise argparse.ArgumentTypeError(f"{value!r} is not a log level; use debug, info, "
                                         f"warning or error (also for ${ENV_LEVEL})")
    return value.lower()


def setup_logging(service: str, level: str = "info", json: bool | None = None,
                  fmt: str | None = None) -> str:
    """Configure structlog and the standard `logging` module for this process and return
    the format chosen (`fmt`, or `json` True/False, or `resolve_format()`). The choice and
    the level are exported to the environment for child processes."""
    chosen = resolve_format(fmt if fmt else None if json is None else
                            ("json" if json else "console"))
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ConfigError(f"--log-level is {level!r}; use debug, info, warning or error")
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact_processor,
    ]
    renderer: Any
    if chosen == "json":
        renderer = structlog.processors.JSONRenderer()
        tail: list[Any] = [structlog.processors.format_exc_info, renderer]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
        tail = [renderer]  # renders exc_info itself
    structlog.configure(
        processors=[*shared, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared[:1], structlog.stdlib.add_logger_name, *shared[1:]],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for noisy in _QUIET:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, numeric))
    structlog.contextvars.bind_contextvars(service=service)
    os.environ[ENV_FORMAT] = chosen
    os.environ[ENV_LEVEL] = level.lower()
    _configured["format"] = chosen
    return chosen


def setup_from_env(service: str) -> None:
    """In a process started by a service (a Spark Python worker): log as it does, once."""
    if _configured:
        return
    setup_logging(service, os.environ.get(ENV_LEVEL, "info"), fmt=os.environ.get(ENV_FORMAT))


def log_format() -> str:
    """The format this process logs in (after `setup_logging`; else what it would choose)."""
    return _configured.get("format") or resolve_format()


def kafka_logger() -> logging.Logger:
    """For confluent-kafka's `logger` setting: librdkafka's lines through our logging."""
    return logging.getLogger("librdkafka")


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)
