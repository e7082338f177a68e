"""Start services as separate processes and stop them together.

Each child gets its own process group, so stopping it also stops what it
started (the delivery job's JVM). If one child dies, the others are stopped
and the supervisor reports which one and where its log is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path | None
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)


class Supervisor:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.children: list[Child] = []
        self.env = {**os.environ, **(env or {})}

    def start(self, name: str, argv: list[str], log_path: Path | None = None) -> Child:
        child = Child(name, argv, log_path)
        out: IO[bytes] | int | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            child._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = child._log
        child.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT if out else None,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)
        self.children.append(child)
        return child

    def failed(self) -> Child | None:
        """The first child that has exited on its own, if any."""
        for child in self.children:
            if child.process is not None and child.process.poll() is not None:
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
            if child._log is not None:
                child._log.close()


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
    }[script]
    return [sys.executable, "-m", module, *args]
