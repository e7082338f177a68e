"""`tailrace up PIPELINE.yaml`: control + capture + delivery as three processes, for a local run."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

from tailrace.config import PipelineSpec, load_pipeline
from tailrace_services.cli.supervisor import Supervisor, service_argv


def wait_for_port(address: str, timeout: float = 30.0) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {address} after {timeout:.0f} s")


def start_pipeline(sup: Supervisor, spec_path: Path, spec: PipelineSpec, state_dir: Path,
                   log_dir: Path | None) -> None:
    address = spec.spec.control.address

    def log(name: str) -> Path | None:
        return None if log_dir is None else log_dir / f"{name}.log"

    sup.start("control", service_argv("tailrace-control", "--listen", address, "--storage",
                                      f"sqlite:///{state_dir / 'control.db'}"), log("control"))
    wait_for_port(address)
    sup.start("capture", service_argv("tailrace-capture", str(spec_path)), log("capture"))
    sup.start("delivery", service_argv("tailrace-delivery", str(spec_path)), log("delivery"))


def run_up(spec_path: str, state_dir: str, log_dir: str | None) -> int:
    spec = load_pipeline(spec_path)
    sup = Supervisor()
    stopping = False

    def on_signal(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        start_pipeline(sup, Path(spec_path), spec, Path(state_dir),
                       Path(log_dir) if log_dir else None)
        print(f"tailrace: pipeline {spec.name} running (control {spec.spec.control.address}); "
              "Ctrl-C stops it", file=sys.stderr)
        while not stopping:
            dead = sup.failed()
            if dead is not None:
                where = f"; see {dead.log_path}" if dead.log_path else ""
                print(f"tailrace: {dead.name} exited with code {dead.process.returncode}{where}",
                      file=sys.stderr)  # type: ignore[union-attr]
                return 1
            time.sleep(0.2)
        return 0
    finally:
        print("tailrace: stopping delivery, capture and control", file=sys.stderr)
        sup.stop()
