"""`tailrace-control` as a real subprocess, for tests and local tools: start, kill -9, restart.

    with ControlProcess(tmp_path, "sqlite:///…/state.db", token="t") as control:
        client = ControlClient(control.address, token="t")
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from types import TracebackType

from tailrace.devservers import free_port
from tailrace_services.cli.supervisor import service_argv
from tailrace_services.cli.up import wait_for_port


class ControlProcess:
    def __init__(self, directory: Path, storage: str, token: str | None = None,
                 tls: tuple[Path, Path] | None = None, http_port: int | None = None) -> None:
        self.directory = directory
        self.storage = storage
        self.token = token
        self.tls = tls
        self.http_port = http_port
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = directory / "control.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ControlProcess:
        argv = service_argv("tailrace-control", "--listen", self.address)
        if self.http_port is not None:
            argv += ["--http-port", str(self.http_port)]
        if self.tls is not None:
            argv += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        env = {**os.environ, "TAILRACE_CONTROL_STORAGE": self.storage}
        env.pop("TAILRACE_CONTROL_TOKEN", None)
        if self.token is not None:
            token_file = self.directory / "control.token"
            token_file.write_text(self.token + "\n")
            token_file.chmod(0o600)
            argv += ["--token-file", str(token_file)]
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)
        try:
            wait_for_port(self.address, timeout=30)
            if self.http_port is not None:  # served after gRPC: wait for it too
                wait_for_port(f"127.0.0.1:{self.http_port}", timeout=30)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"tailrace-control did not start; its log:\n{self.log()}") from None
        return self

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def kill(self) -> None:
        """kill -9: no shutdown, no flush."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> ControlProcess:
        self.stop()
        return self.start()

    def __enter__(self) -> ControlProcess:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill() if t is not None else self.stop()
