"""`make run` does what the README says: changes arrive, it says where to look, it stops cleanly."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def test_make_run_shows_changes_arriving_and_stops_cleanly(tmp_path):
    demo_dir = tmp_path / "demo"
    result = subprocess.run(["make", "-s", "run", "DURATION=50", f"DEMO_DIR={demo_dir}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=400)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "pipeline running" in out and "logs" in out and "psql" in out and "XRANGE" in out
    arrived = [line for line in out.splitlines() if line.startswith("  redis tailrace.shop.")]
    assert any(" insert " in line for line in arrived)
    assert any("customer 1," in line for line in arrived), "the first change was captured"
    assert "all services and throwaway servers are gone" in out
    # nothing left running that belongs to this demo
    leftovers = subprocess.run(["pgrep", "-f", str(demo_dir)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
