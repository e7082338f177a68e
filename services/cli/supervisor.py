"""Start services as separate processes and stop them together.

Each child gets its own process group, so stopping it also stops what it
started (the delivery job's JVM). Its output (stdout and stderr together) is
copied line by line to its log file, or to our stderr without one; on the way
the supervisor keeps the child's last error line (`Child.last_error`), so when
a child dies the cause can be shown on the terminal, not only where its log is.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tailrace.logs import redact

_CONSOLE_ERROR = re.compile(r"\[(error|critical)\s*\]\s+(?P<text>.*)", re.I)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b: .+")
_SUMMARY_MAX = 600


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path | None
    process: subprocess.Popen[bytes] | None = None
    last_error: str = ""  # the last error line it printed, summarised
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=5), repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)
    _pump: threading.Thread | None = field(default=None, repr=False)

    def cause(self) -> str:
        """Why it stopped, as far as its output says: the last error line, else its last
        lines; "" if it printed nothing."""
        return self.last_error or " | ".join(self.tail)


class Supervisor:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.children: list[Child] = []
        self.env = {**os.environ, **(env or {})}

    def start(self, name: str, argv: list[str], log_path: Path | None = None) -> Child:
        child = Child(name, argv, log_path)
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            child._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        child.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)
        child._pump = threading.Thread(target=_pump, args=(child,), name=f"log-{name}",
                                       daemon=True)
        child._pump.start()
        self.children.append(child)
        return child

    def failed(self) -> Child | None:
        """The first child that has exited on its own, if any (its output read to the end)."""
        for child in self.children:
            if child.process is not None and child.process.poll() is not None:
                if child._pump is not None:
                    child._pump.join(2.0)  # the last lines, with the cause
                return child
        return None

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every child group (last started first), then SIGKILL what is left."""
        for child in reversed(self.children):
            _signal_group(child, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while child.process is not None and child.process.poll() is None:
                if time.monotonic() > deadline:
                    _signal_group(child, signal.SIGKILL)
                    child.process.wait(5)
                    break
                time.sleep(0.1)
            _signal_group(child, signal.SIGKILL)  # stragglers in the group (e.g. a JVM)
            if child._pump is not None:
                child._pump.join(5.0)
            if child._log is not None:
                child._log.close()


def _pump(child: Child) -> None:
    """Copy the child's output to its log (or our stderr), noting its error lines."""
    assert child.process is not None and child.process.stdout is not None
    out = child._log if child._log is not None else sys.stderr.buffer
    for raw in iter(child.process.stdout.readline, b""):
        with contextlib.suppress(ValueError, OSError):  # closed at stop: the rest is dropped
            out.write(raw)
            out.flush()
        line = raw.decode(errors="replace").strip()
        if not line:
            continue
        child.tail.append(redact(line)[:_SUMMARY_MAX])
        summary = error_summary(line)
        if summary:
            child.last_error = summary
    child.process.stdout.close()


def error_summary(line: str) -> str | None:
    """The gist of a log line at error level (JSON or console), or of the last line of a
    Python traceback; None for anything else. Never shows a password."""
    text: str | None = None
    if line.startswith("{"):
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and str(event.get("level", "")).lower() in (
                    "error", "critical", "fatal"):
                text = str(event.get("event", "error"))
                detail = str(event.get("reason") or event.get("error")
                             or event.get("exception") or "").strip()
                if detail:  # a traceback's last line says what was raised
                    lines = detail.splitlines()
                    text += ": " + (lines[-1] if "Traceback" in detail else " ".join(lines))
    else:
        found = _CONSOLE_ERROR.search(line)
        if found:
            text = found.group("text")
        elif _EXCEPTION_LINE.match(line):
            text = line
    return redact(text)[:_SUMMARY_MAX] if text else None


def _signal_group(child: Child, sig: int) -> None:
    if child.process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, sig)


def service_argv(script: str, *args: str) -> list[str]:
    """Run a console script of this installation with the same interpreter."""
    module = {
        "tailrace-control": "tailrace_services.control.main",
        "tailrace-capture": "tailrace_services.capture",
        "tailrace-delivery": "tailrace_services.delivery.main",
        "tailrace-spark": "tailrace_services.delivery.cluster",
    }[script]
    return [sys.executable, "-m", module, *args]
