"""Control-service rigs for tests and local tools.

- `ControlProcess`: `tailrace-control` as a real subprocess: start, kill -9, restart. It
  runs with a service and an admin token (generated unless given, in 0600 files beside
  its log); `client()` is a client with one of them:

      with ControlProcess(tmp_path, "sqlite:///…/state.db") as control:
          with control.client() as admin, control.client("service") as service:
              ...

- `published`: for tests that commit checkpoints without a running capture. Control
  refuses a checkpoint past the latest epoch capture recorded for its source (it would
  let the source discard changes never published); `published` records one far ahead.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from tailrace.control_client import ControlClient
from tailrace.control_tls import ClientTls
from tailrace.devservers import free_port
from tailrace.proto import control_pb2 as pb
from tailrace_services.cli.supervisor import service_argv
from tailrace_services.cli.up import wait_for_port

FAR = 10**9


def published(client: ControlClient, source_id: str, tx_seq: int = FAR,
              partitions: int = 4) -> pb.Epoch:
    """Record that capture published `source_id` up to `tx_seq` (bus offsets far ahead)."""
    epoch = pb.Epoch(source_id=source_id, epoch_id=tx_seq)
    epoch.position.tx_seq = tx_seq
    for p in range(partitions):
        epoch.end_offsets[p] = FAR * 10
    client.record_epoch(epoch)
    return epoch


TOKEN_ENVS = ("TAILRACE_SERVICE_TOKEN", "TAILRACE_ADMIN_TOKEN", "TAILRACE_CONTROL_TOKEN",
              "TAILRACE_CONTROL_TOKEN_FILE")


def new_token() -> str:
    return secrets.token_hex(24)


def write_secret(path: Path, text: str) -> Path:
    """`text` in a file only its owner can read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text + "\n")
    return path


class ControlProcess:
    """`tls`: (certificate, key) files to serve TLS; `client_ca`: require client certificates
    signed by it. `auth=False` runs it with --insecure-no-auth. `token`: the admin token
    (an older name for `admin_token`). `args`: more command-line arguments."""

    def __init__(self, directory: Path, storage: str, token: str | None = None,
                 tls: tuple[Path, Path] | None = None, http_port: int | None = None, *,
                 service_token: str | None = None, admin_token: str | None = None,
                 auth: bool = True, client_ca: Path | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.directory = directory
        self.storage = storage
        self.auth = auth
        self.service_token = service_token or new_token()
        self.admin_token = admin_token or token or new_token()
        self.tls = tls
        self.client_ca = client_ca
        self.http_port = http_port
        self.args = args
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = directory / "control.log"
        self.service_token_file = directory / "control-service.token"
        self.admin_token_file = directory / "control-admin.token"
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        argv = service_argv("tailrace-control", "--listen", self.address, *self.args)
        if self.http_port is not None:
            argv += ["--http-port", str(self.http_port)]
        if self.tls is not None:
            argv += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        if self.client_ca is not None:
            argv += ["--tls-client-ca", str(self.client_ca)]
        if not self.auth:
            return [*argv, "--insecure-no-auth"]
        write_secret(self.service_token_file, self.service_token)
        write_secret(self.admin_token_file, self.admin_token)
        return [*argv, "--service-token-file", str(self.service_token_file),
                "--admin-token-file", str(self.admin_token_file)]

    def start(self) -> ControlProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = self.argv()
        env = {k: v for k, v in os.environ.items() if k not in TOKEN_ENVS}
        env["TAILRACE_CONTROL_STORAGE"] = self.storage
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

    def client(self, role: str | None = "admin", tls: ClientTls | None = None,
               **options: Any) -> ControlClient:
        """A client sending the `role` token (admin, service; None = no token)."""
        token = {"admin": self.admin_token, "service": self.service_token, None: None}[role]
        return ControlClient(self.address, token=token, tls=tls, **options)

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


def cli_in_process(control: ControlProcess, capsys: Any, monkeypatch: Any
                   ) -> Callable[..., tuple[int, str, str]]:
    """`run(*argv, token=False)` -> (exit code, stdout, stderr): the `tailrace` CLI run in this
    process against `control`, with its service token ($TAILRACE_ADMIN_TOKEN: a token that may
    read, not change), or with `token=True` its admin token (--token-file)."""
    from tailrace_services.cli.main import main

    monkeypatch.setenv("TAILRACE_CONTROL", control.address)
    monkeypatch.delenv("TAILRACE_TOKEN", raising=False)
    monkeypatch.setenv("TAILRACE_ADMIN_TOKEN", control.service_token)

    def run(*argv: str, token: bool = False) -> tuple[int, str, str]:
        code = main([*argv, *(["--token-file", str(control.admin_token_file)] if token else [])])
        out, err = capsys.readouterr()
        return code, out, err

    return run
