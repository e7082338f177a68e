"""Spark's own lines in the delivery service's log format, one format per run.

Spark logs through log4j2, outside Python's logging. The job passes a log4j2 configuration
to the driver and executor JVMs (`-Dlog4j2.configurationFile`, `spark_log4j_config`):
warnings and above only, on stderr, each line shaped like the service's own — a JSON
object with `event`, `level`, `timestamp`, `logger`, `service` (and `exception`), or the
console layout — according to the format this run logs in (`tailrace.logs.log_format()`).
What the JVM prints outside log4j2 goes through `route_stderr`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from tailrace.logs import log_format, redact

__all__ = ["route_stderr", "spark_log4j_config"]

_TIME = "%d{yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'}{UTC}"
# Python's level names, so every line of a run reads alike
_LEVEL = "%level{WARN=warning,ERROR=error,FATAL=critical,INFO=info,DEBUG=debug,TRACE=debug}"
_PATTERNS = {
    "json": ('{"event": "%enc{%m}{JSON}", "service": "delivery", "logger": "%c", '
             '"level": "' + _LEVEL + '", "timestamp": "' + _TIME + '"'
             '%notEmpty{, "exception": "%enc{%ex}{JSON}"}}%n'),
    "console": _TIME + " [%-9" + _LEVEL[1:] + "] %m [%c] service=delivery%n%ex",
}
_CONFIG = """\
status = error
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = {pattern}
# chatty at WARN on a single machine, and nothing an operator can act on
logger.nativeloader.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeloader.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
"""


def spark_log4j_config(fmt: str | None = None) -> Path:
    """Write the log4j2 configuration for `fmt` (default: this run's format) and return its
    path; the same content for the same format, so concurrent jobs may share it."""
    chosen = fmt or log_format()
    path = Path(tempfile.gettempdir()) / f"tailrace-log4j2-{os.getuid()}-{chosen}.properties"
    text = _CONFIG.format(pattern=_PATTERNS[chosen])
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def route_stderr(service: str = "delivery") -> Callable[[], None]:
    """From now on every line written to this process's stderr (fd 2) leaves in this run's
    log format: lines already in it unchanged, any other — what the JVM itself prints before
    log4j2 starts ("WARNING: Using incubator modules"), a stray print of a Spark Python
    worker — as a warning event of logger `stderr`. Child processes (the JVM, the workers)
    inherit the redirection. Returns `restore`, which puts stderr back and flushes what is
    left (call it before exiting)."""
    fmt = log_format()
    sys.stderr.flush()
    keep = os.dup(2)  # the real stderr, for restore()
    out = os.fdopen(os.dup(2), "wb", buffering=0)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def pump() -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                line = raw.decode(errors="replace").replace("\r", "").rstrip("\n")
                if not line.strip():
                    continue  # blank lines, Spark's progress bar redraws
                with contextlib.suppress(OSError):
                    out.write((line if _formatted(line, fmt) else _event(line, fmt, service))
                              .encode() + b"\n")

    thread = threading.Thread(target=pump, name="stderr-format", daemon=True)
    thread.start()

    def restore() -> None:
        # Spark's Python threads (py4j's callback server, the accumulator server) may still
        # print while the interpreter exits: in this run's format too
        sys.stderr.flush()
        sys.stderr = _LineFormatter(sys.stderr, fmt, service)
        # the interpreter's finalization sets sys.stderr back to sys.__stderr__, and a
        # daemon thread that fails then (the accumulator server's handler, its socket closed
        # by the stopped JVM) would print its traceback raw
        setattr(sys, "__stderr__", sys.stderr)  # noqa: B010 - typeshed calls it final
        os.dup2(keep, 2)  # the pipe ends once no process writes to it any more
        os.close(keep)
        thread.join(2.0)

    return restore


class _LineFormatter(io.TextIOBase):
    """A text stream that writes each whole line to `target` in the run's format."""

    def __init__(self, target: TextIO, fmt: str, service: str) -> None:
        self._target, self._fmt, self._service = target, fmt, service
        self._pending = ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            if line.strip():
                self._target.write((line if _formatted(line, self._fmt)
                                    else _event(line, self._fmt, self._service)) + "\n")
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def isatty(self) -> bool:
        return self._target.isatty()


_CONSOLE_LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[")


def _formatted(line: str, fmt: str) -> bool:
    if fmt == "console":  # indented lines continue a traceback the console layout printed
        return bool(_CONSOLE_LINE.match(line)) or line[:1] in (" ", "\t")
    if not line.startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _event(line: str, fmt: str, service: str) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    text = redact(line.strip())
    if fmt == "console":
        return f"{now} [warning  ] {text} [stderr] service={service}"
    return json.dumps({"event": text, "service": service, "logger": "stderr",
                       "level": "warning", "timestamp": now})
