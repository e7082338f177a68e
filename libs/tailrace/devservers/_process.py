"""Process plumbing shared by the throwaway servers: ports, temp dirs, start, wait, stop.

Every server runs in its own session (process group), so stopping or killing it takes
its children along, and its output goes to a log file whose tail is quoted when it fails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "LOOPBACK",
    "DevServerError",
    "find_binary",
    "free_port",
    "kill_process",
    "log_tail",
    "remove_dir",
    "run_checked",
    "short_tempdir",
    "start_process",
    "stop_process",
    "wait_for_port",
    "wait_until",
]

LOOPBACK = "127.0.0.1"

# Process groups and dirs still alive; swept at interpreter exit so that a crashed
# test run or an interrupted `make run` does not leave servers behind.
_live_groups: set[int] = set()
_live_dirs: set[Path] = set()


class DevServerError(RuntimeError):
    """A throwaway server could not be found, prepared or started."""


_LOWEST_PORT = 10_000
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now, below the ephemeral range.

    A port the OS picks for `bind(0)` comes from the ephemeral range, which outgoing
    connections draw from too: between this call and the server binding it, a client
    socket of any process may take it ("Address already in use", seen in CI). A port
    below that range is never taken that way. Not handed out twice by this process.
    """
    high = _ephemeral_low()
    for _ in range(200) if high - _LOWEST_PORT >= 1_000 else ():
        port = random.randrange(_LOWEST_PORT, high)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def short_tempdir(prefix: str = "tr") -> Path:
    """Make a private temp dir with a short path (unix socket paths max out at ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    _live_dirs.add(path)
    return path


def remove_dir(path: Path | None) -> None:
    """Delete a dir made by `short_tempdir`, ignoring what is already gone."""
    if path is None:
        return
    shutil.rmtree(path, ignore_errors=True)
    _live_dirs.discard(path)


def find_binary(name: str, *, package: str, search_dirs: Iterable[Path] = ()) -> str:
    """Return the path of `name`, looking in `search_dirs` first and then on PATH.

    Raises DevServerError naming the Debian package that provides it: a test that
    needs a real server must fail loudly, never skip.
    """
    for directory in search_dirs:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise DevServerError(
        f"{name} not found (searched {_describe(search_dirs)}PATH): "
        f"run `make setup`, which installs the Debian package {package}"
    )


def _describe(dirs: Iterable[Path]) -> str:
    listed = ", ".join(str(d) for d in dirs)
    return f"{listed} and " if listed else ""


def log_tail(path: Path, lines: int = 25) -> str:
    """Return the last `lines` lines of a log file, or a note if there is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else f"(log {path} is empty)"


def _failure(what: str, log_path: Path, errors_since: int | None = None) -> DevServerError:
    """`errors_since`: where a command's own output starts in the log; its error lines are
    quoted too, as a tool's closing advice can push them out of the tail."""
    errors = _error_lines(log_path, errors_since) if errors_since is not None else ""
    return DevServerError(f"{what}; {errors}last lines of {log_path}:\n{log_tail(log_path)}")


def _error_lines(log_path: Path, since: int, limit: int = 10) -> str:
    """The first error lines the log got from byte `since` on."""
    try:
        with open(log_path, "rb") as log:
            log.seek(since)
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in lines if "ERROR" in line or "FATAL" in line][:limit]
    return "errors in the log:\n" + "\n".join(errors) + "\n" if errors else ""


def run_checked(
    args: Sequence[str],
    *,
    log_path: Path,
    what: str,
    cwd: Path | None = None,
    user: str | None = None,
    timeout: float = 120.0,
) -> None:
    """Run a preparation command (initdb, install-db) to completion, output to the log."""
    with open(log_path, "ab") as log:
        start = log.tell()
        try:
            result = subprocess.run(
                [*_as_user(user), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise _failure(f"{what} did not finish within {timeout:.0f}s", log_path,
                           start) from None
    if result.returncode != 0:
        raise _failure(f"{what} failed with exit code {result.returncode}", log_path, start)


def start_process(
    args: Sequence[str],
    *,
    log_path: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start a server in a new session, appending its stdout and stderr to `log_path`."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [*_as_user(user), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    _live_groups.add(proc.pid)
    return proc


def _as_user(user: str | None) -> list[str]:
    """A command prefix that drops root to `user` (PostgreSQL refuses to run as root).

    `setpriv` in the child rather than Popen's `user=`: with `user=` CPython forks instead of
    vforking, and a fork of a process whose gRPC threads run (a test's control client) runs
    gRPC's fork handlers in the child, which crashed it with SIGSEGV before it could exec."""
    if user is None:
        return []
    import pwd

    entry = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups",
            "--"]


def stop_process(
    proc: subprocess.Popen[bytes] | None,
    *,
    sig: int = signal.SIGTERM,
    timeout: float = 15.0,
) -> None:
    """Ask the server to shut down with `sig`; SIGKILL its whole group after `timeout`."""
    if proc is None:
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    kill_process(proc, strict=False)


def kill_process(proc: subprocess.Popen[bytes] | None, *, strict: bool = True) -> None:
    """SIGKILL the server's whole process group, as a crash or the OOM killer would, and
    wait until every process of it is gone: PostgreSQL's backends outlive a killed
    postmaster for a moment, and a postmaster started meanwhile refuses to run ("pre-existing
    shared memory block is still in use"). `strict=False` (a stop, a clean-up): a process
    that outlives the wait is left, not raised about (the error would hide the caller's)."""
    if proc is None:
        return
    _killpg(proc.pid)
    proc.wait()
    try:
        _wait_group_gone(proc.pid)
    except DevServerError:
        if strict:
            raise
        return  # (still swept at exit)
    _live_groups.discard(proc.pid)


def _wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
    """Until no process of the group is alive (zombies excepted: they hold nothing, and
    the reaper of orphans may be slow to take them)."""
    deadline = time.monotonic() + timeout
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            raise DevServerError(f"processes of group {pgid} still alive {timeout:.0f} s "
                                 "after SIGKILL")
        time.sleep(0.01)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group is alive, from /proc (no /proc: none is known)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after it
            state, _ppid, pgrp = stat.read_text().rpartition(")")[2].split()[:3]
            if int(pgrp) == pgid and state not in ("Z", "X"):
                return True
    return False


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def wait_until(
    check: Callable[[], object],
    *,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    what: str,
    timeout: float,
    interval: float = 0.05,
) -> None:
    """Call `check` until it returns without raising, the process dies, or time runs out."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        code = proc.poll()
        if code is not None:
            raise _failure(f"{what}: the server exited with code {code}", log_path)
        try:
            check()
            return
        except Exception as exc:  # readiness probes fail in many ways until they don't
            last_error = exc
        if time.monotonic() >= deadline:
            raise _failure(
                f"{what}: not ready after {timeout:.0f}s (last error: {last_error!r})", log_path
            )
        time.sleep(interval)


def wait_for_port(
    port: int,
    *,
    proc: subprocess.Popen[bytes],
    log_path: Path,
    what: str,
    timeout: float,
    host: str = LOOPBACK,
) -> None:
    """Wait until `host:port` accepts a TCP connection."""

    def connect() -> None:
        with socket.create_connection((host, port), timeout=1.0):
            pass

    wait_until(connect, proc=proc, log_path=log_path, what=what, timeout=timeout)


@atexit.register
def _sweep() -> None:
    for pgid in list(_live_groups):
        _killpg(pgid)
    for path in list(_live_dirs):
        shutil.rmtree(path, ignore_errors=True)
