"""structlog setup: JSON when not on a terminal, readable on one; secrets never printed."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_KEYS = re.compile(r"(password|passwd|secret|token|dsn|authorization|api_key)", re.I)
# user:password@ inside URLs / DSNs, and password=... in libpq key/value strings
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://[^:/@\s]*):[^@\s]*@", re.I)
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.I)


def redact(text: str) -> str:
    """Remove passwords from DSNs/URLs inside free text (error messages included)."""
    text = _URL_PASSWORD.sub(r"\g<scheme>:***@", text)
    return _KV_PASSWORD.sub(r"\1***", text)


def _redact_processor(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event.items()):
        if _SECRET_KEYS.search(key) and key != "event":
            event[key] = "***"
        elif isinstance(value, str):
            event[key] = redact(value)
        elif isinstance(value, BaseException):
            event[key] = redact(f"{type(value).__name__}: {value}")
    return event


def setup_logging(service: str, level: str = "info", json: bool | None = None) -> None:
    """Configure structlog once per process; `json=None` picks JSON unless stderr is a terminal."""
    use_json = (not sys.stderr.isatty()) if json is None else json
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s")
    for noisy in ("py4j", "kafka", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    renderer: Any = (structlog.processors.JSONRenderer() if use_json
                     else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact_processor,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)
