"""The lifecycle every throwaway server shares: prepare once, start, stop, kill, restart.

A server owns one short temp dir holding its data and its log. The port is chosen once,
so a restart (also after `kill()`) comes back on the same address, with the same data.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from tailrace.devservers._process import (
    LOOPBACK,
    free_port,
    kill_process,
    remove_dir,
    short_tempdir,
    start_process,
    stop_process,
)

__all__ = ["DevServer"]


class DevServer:
    """Base of the throwaway servers; subclasses fill in `_prepare`, `_command`, `_wait_ready`.

    `stop()` ends the server and deletes its dir; `stop(keep_data=True)` and `kill()` keep
    the dir so that `start()` brings the same server back (crash recovery after a kill).
    """

    name: ClassVar[str] = "server"
    stop_signal: ClassVar[int] = signal.SIGTERM
    stop_timeout: ClassVar[float] = 15.0

    def __init__(self, *, port: int | None = None, startup_timeout: float = 60.0) -> None:
        self.host = LOOPBACK
        self.port = port if port is not None else free_port()
        self.startup_timeout = startup_timeout
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- to be provided by each server -------------------------------------------------

    def _prepare(self, directory: Path) -> None:
        """Create the data dir (initdb, install-db); runs once per temp dir."""

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        raise NotImplementedError

    def _run_as(self) -> str | None:
        """OS user to run the server as; None keeps the current one."""
        return None

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        if self.dir is None:
            raise RuntimeError(f"{self.name} has no dir yet: call start() first")
        return self.dir / f"{self.name}.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Pid of the server's main process (the postmaster for PostgreSQL)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> Self:
        """Start the server (preparing its dir the first time) and wait until it serves."""
        if self.running:
            return self
        fresh = self.dir is None
        try:
            if self.dir is None:
                self.dir = short_tempdir()
                self._prepare(self.dir)
            self._proc = start_process(
                self._command(), log_path=self.log_path, cwd=self.dir, user=self._run_as()
            )
            self._wait_ready(self._proc)
        except BaseException:
            # The error quotes the log. A first start leaves nothing behind; a failed
            # restart keeps the data, as the caller may want to look or retry.
            self.stop(keep_data=not fresh)
            raise
        return self

    def stop(self, *, keep_data: bool = False) -> None:
        """Shut down gracefully (SIGKILL after a timeout); delete the dir unless `keep_data`."""
        stop_process(self._proc, sig=self.stop_signal, timeout=self.stop_timeout)
        self._proc = None
        if not keep_data:
            remove_dir(self.dir)
            self.dir = None

    def kill(self) -> None:
        """SIGKILL the server and all its children; the data stays for `start()`."""
        kill_process(self._proc)
        self._proc = None

    def restart(self) -> None:
        """Graceful stop and start again with the same data and port."""
        self.stop(keep_data=True)
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.host}:{self.port} {state} dir={self.dir}>"
