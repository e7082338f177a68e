"""Delivery's socket directory (`job._socket_dir`): a killed delivery process leaves its
own behind, and the next start on the host removes it; a live process's stays."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tailrace_services.delivery import job


def test_a_start_removes_the_socket_dirs_of_killed_processes_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    killed = tmp_path / f"tailrace-uds-{gone}-abcd1234"
    killed.mkdir()
    (killed / ".stale.sock").touch()
    running = tmp_path / f"tailrace-uds-{os.getppid()}-efgh5678"  # this test's parent
    running.mkdir()
    older = tmp_path / "tailrace-uds-ijkl9012"  # named before the pid was in the name
    older.mkdir()
    not_ours = tmp_path / "tailrace-uds-not-ours"  # no pid in the name
    not_ours.mkdir()
    impossible = tmp_path / f"tailrace-uds-{'9' * 30}-mnop"  # no process has that pid
    impossible.mkdir()

    made = Path(job._socket_dir())

    assert not killed.exists(), "the killed process's directory is removed"
    assert running.is_dir() and older.is_dir(), "a live process's directory stays"
    assert not_ours.is_dir(), "a name without a pid is not ours"
    assert not impossible.exists(), "a pid no process can have is a gone one (and no crash)"
    assert made.parent == tmp_path and made.name.startswith(f"tailrace-uds-{os.getpid()}-")
    assert made.stat().st_mode & 0o777 == 0o700
