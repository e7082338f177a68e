"""A throwaway NATS server with JetStream, for tests and `make run`."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import ClassVar

from tailrace.devservers._base import DevServer
from tailrace.devservers._process import DevServerError, find_binary, wait_until

__all__ = ["NatsServer"]


class NatsServer(DevServer):
    """nats-server -js on 127.0.0.1:`port`; JetStream files live in the temp dir."""

    name: ClassVar[str] = "nats"

    def __init__(self, *, port: int | None = None, startup_timeout: float = 30.0) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.binary = find_binary(
            "nats-server", package="nats-server", search_dirs=[Path("/usr/sbin"), Path("/usr/bin")]
        )

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def _command(self) -> list[str]:
        assert self.dir is not None
        return [
            self.binary,
            "-a", self.host,
            "-p", str(self.port),
            "-js",
            "-sd", str(self.dir / "jetstream"),
        ]  # fmt: skip

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        # The server greets every client with an INFO line that says whether JetStream is on.
        def hello() -> None:
            with socket.create_connection((self.host, self.port), timeout=2) as sock:
                line = sock.makefile("rb").readline()
            if not line.startswith(b"INFO "):
                raise DevServerError(f"unexpected greeting from nats-server: {line!r}")
            if not json.loads(line[5:]).get("jetstream"):
                raise DevServerError("nats-server is up but JetStream is not enabled")

        wait_until(
            hello, proc=proc, log_path=self.log_path, what="nats", timeout=self.startup_timeout
        )
