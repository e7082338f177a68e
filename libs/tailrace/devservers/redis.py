"""A throwaway Redis, without persistence unless asked, for tests and `make run`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import ClassVar

from tailrace.devservers._base import DevServer
from tailrace.devservers._process import find_binary, wait_until

__all__ = ["RedisServer"]


class RedisServer(DevServer):
    """redis-server on 127.0.0.1:`port`; nothing is saved, so a restart starts empty —
    unless `appendonly`: every write goes to the append-only file and is fsynced before
    Redis answers (`appendfsync always`), so a kill -9 and a start bring back every write
    it acknowledged."""

    name: ClassVar[str] = "redis"

    def __init__(self, *, port: int | None = None, startup_timeout: float = 30.0,
                 appendonly: bool = False) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.appendonly = appendonly
        self.binary = find_binary(
            "redis-server", package="redis-server", search_dirs=[Path("/usr/bin")]
        )

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def _command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            *(["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly
              else ["--appendonly", "no"]),
            "--dir", str(self.dir),
            "--daemonize", "no",
        ]  # fmt: skip

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        no_retry = Retry(NoBackoff(), retries=0)  # we poll ourselves; its backoff adds ~1 s

        def ping() -> None:
            with redis.Redis(self.host, self.port, socket_timeout=2, retry=no_retry) as client:
                client.ping()

        wait_until(
            ping, proc=proc, log_path=self.log_path, what="redis", timeout=self.startup_timeout
        )
