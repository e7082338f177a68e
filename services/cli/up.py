"""`tailrace up PIPELINE.yaml`: control + capture + delivery as three processes, for a local run.

Each service serves `/health`, `/ready` and `/metrics` on its own HTTP port: `--http-port
BASE` gives control BASE, capture BASE+1 and delivery BASE+2 (default: three free ports);
they are printed at start. Control's `/metrics` carries every pipeline's state
(`tailrace_pipeline_state`) and each sink's lag. The run logs in one format (`--log-format`,
$TAILRACE_LOG_FORMAT) in every service. If a service exits, the others are stopped and its
last error line is printed (a wrong password, a missing database), with where its log is.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tailrace.config import PipelineSpec, load_pipeline
from tailrace.devservers import free_port
from tailrace.errors import ConfigError
from tailrace.logs import ENV_FORMAT, ENV_LEVEL
from tailrace_services.cli.localauth import local_tokens
from tailrace_services.cli.supervisor import Child, Supervisor, service_argv


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


SERVICES = ("control", "capture", "delivery")


@dataclass(frozen=True)
class HttpPorts:
    """The HTTP side port of each service (`/health`, `/ready`, `/metrics`)."""

    control: int
    capture: int
    delivery: int

    @classmethod
    def from_base(cls, base: int) -> HttpPorts:
        """BASE, BASE+1, BASE+2; 0 picks three free ports."""
        if base == 0:
            return cls(free_port(), free_port(), free_port())
        if not 0 < base <= 65533:
            raise ValueError(f"--http-port {base}: use 1..65533 (three ports from it) or 0")
        return cls(base, base + 1, base + 2)

    def url(self, service: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{getattr(self, service)}"

    def describe(self, control_host: str) -> str:
        """One line per service, for the terminal."""
        lines = []
        for name in SERVICES:
            base = self.url(name, control_host if name == "control" else "127.0.0.1")
            lines.append(f"  {name:<9} {base}/health  {base}/ready  {base}/metrics")
        return "\n".join(lines + [f"  pipeline state: tailrace_pipeline_state{{pipeline, state}} "
                                  f"on {self.url('control', control_host)}/metrics"])


def start_pipeline(sup: Supervisor, spec_path: Path, spec: PipelineSpec, state_dir: Path,
                   log_dir: Path | None, ports: HttpPorts | None = None) -> None:
    """Start the three services; with `ports`, each serves its HTTP side port, and capture
    and delivery exit on a fatal error (the supervisor then stops the run and says why)."""
    if len(spec.spec.control.addresses) > 1:
        raise ConfigError(f"control.address names {len(spec.spec.control.addresses)} control "
                          "replicas; tailrace up starts one control service on one address: "
                          "start the replicas yourself (tailrace-control --storage "
                          "postgresql://...), then tailrace-capture and tailrace-delivery")
    address = spec.spec.control.address

    def http(name: str) -> list[str]:
        if ports is None:
            return []
        return ["--http-port", str(getattr(ports, name)),
                *(["--exit-on-fatal"] if name != "control" else [])]

    def log(name: str) -> Path | None:
        return None if log_dir is None else log_dir / f"{name}.log"

    tokens = local_tokens(spec, state_dir)
    sup.env.update(tokens.env)
    sup.start("control", service_argv("tailrace-control", "--listen", address, "--storage",
                                      f"sqlite:///{state_dir / 'control.db'}",
                                      *tokens.control_args(), *http("control")), log("control"))
    print(f"tailrace: admin token in {tokens.admin_file} (tailrace --token-file "
          f"{tokens.admin_file} pipelines)", file=sys.stderr)
    wait_for_port(address)
    sup.start("capture", service_argv("tailrace-capture", str(spec_path), *http("capture")),
              log("capture"))
    sup.start("delivery", service_argv("tailrace-delivery", str(spec_path), *http("delivery")),
              log("delivery"))


def exit_message(child: Child, prog: str = "tailrace") -> str:
    """`capture exited with code 1: <its last error line>; full log: <path>`."""
    code = child.process.returncode if child.process is not None else None
    cause = child.cause()
    where = f"; full log: {child.log_path}" if child.log_path else ""
    return f"{prog}: {child.name} exited with code {code}{': ' + cause if cause else ''}{where}"


def run_up(spec_path: str, state_dir: str, log_dir: str | None, http_port: int = 0,
           log_format: str = "json", log_level: str = "info") -> int:
    spec = load_pipeline(spec_path)
    ports = HttpPorts.from_base(http_port)
    sup = Supervisor({ENV_FORMAT: log_format, ENV_LEVEL: log_level})  # one format per run
    stopping = False

    def on_signal(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        start_pipeline(sup, Path(spec_path), spec, Path(state_dir),
                       Path(log_dir) if log_dir else None, ports)
        control_host = spec.spec.control.address.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
        print(f"tailrace: pipeline {spec.name} running (control {spec.spec.control.address}); "
              f"Ctrl-C stops it\n{ports.describe(control_host)}", file=sys.stderr, flush=True)
        while not stopping:
            dead = sup.failed()
            if dead is not None:
                print(exit_message(dead), file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    finally:
        print("tailrace: stopping delivery, capture and control", file=sys.stderr)
        sup.stop()
