"""A failed preparation command's error quotes the log's error lines, not only its tail; a
killed server's processes are all gone before `kill_process` returns."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tailrace.devservers._process import (
    DevServerError,
    _group_alive,
    _wait_group_gone,
    kill_process,
    run_checked,
    start_process,
)


def test_an_early_error_line_is_quoted_past_a_long_closing_advice(tmp_path: Path) -> None:
    script = (
        "print('starting'); print('2026-11-29 1 [ERROR] Aborting: table gone');"
        "[print(f'advice line {i}') for i in range(40)]; raise SystemExit(1)"
    )
    with pytest.raises(DevServerError) as failure:
        run_checked([sys.executable, "-c", script], log_path=tmp_path / "x.log", what="prep")
    message = str(failure.value)
    assert "prep failed with exit code 1" in message
    assert "[ERROR] Aborting: table gone" in message
    assert "advice line 39" in message


def test_a_log_without_errors_quotes_only_its_tail(tmp_path: Path) -> None:
    with pytest.raises(DevServerError) as failure:
        run_checked(
            [sys.executable, "-c", "print('quiet'); raise SystemExit(3)"],
            log_path=tmp_path / "x.log",
            what="prep",
        )
    assert "errors in the log" not in str(failure.value)
    assert "quiet" in str(failure.value)


def test_only_the_failed_commands_own_error_lines_are_quoted(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("2026-11-28 [ERROR] an earlier run's error\n")  # the log is appended to
    with pytest.raises(DevServerError) as failure:
        run_checked([sys.executable, "-c", "print('[ERROR] this one'); raise SystemExit(1)"],
                    log_path=log, what="prep")
    errors = str(failure.value).split("last lines of")[0]
    assert "[ERROR] this one" in errors
    assert "an earlier run's error" not in errors


def test_the_wait_for_a_killed_group_ends_when_its_last_live_process_is_gone() -> None:
    """A restarted PostgreSQL refused to start while a backend of the killed one lived
    ("pre-existing shared memory block is still in use"): the wait sees a live member, and
    not a zombie (it holds nothing; an orphan's reaper may be slow to take it)."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with pytest.raises(DevServerError, match="still alive"):
            _wait_group_gone(proc.pid, timeout=0.2)
        proc.send_signal(signal.SIGKILL)  # a zombie until waited for
        _wait_group_gone(proc.pid, timeout=5)
    finally:
        proc.kill()
        proc.wait()


def test_kill_process_returns_once_the_whole_group_is_gone(tmp_path: Path) -> None:
    """The leader and its children (started before the kill: the log says so)."""
    log = tmp_path / "x.log"
    proc = start_process(["sh", "-c", "sleep 30 & sleep 30 & echo started; wait"], log_path=log)
    deadline = time.monotonic() + 10
    while "started" not in log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert _group_alive(proc.pid)
    kill_process(proc)
    assert not _group_alive(proc.pid)
