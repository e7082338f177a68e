"""`make run` does what the README says: changes arrive, it says where to look, it stops cleanly."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def test_make_run_shows_changes_arriving_and_stops_cleanly(tmp_path):
    demo_dir = tmp_path / "demo"
    result = subprocess.run(["make", "-s", "run", "DURATION=20", f"DEMO_DIR={demo_dir}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=500)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "pipeline running" in out and "logs" in out and "psql" in out and "XRANGE" in out
    for service in ("control", "capture", "delivery"):  # each one's side port, stated
        assert re.search(rf"^  {service} +http://127\.0\.0\.1:\d+/health  \S+/ready  \S+/metrics$",
                         out, re.M), service
    assert "tailrace_pipeline_state{pipeline, state} on http://127.0.0.1:" in out
    arrived = [line for line in out.splitlines() if line.startswith("  redis tailrace.shop.")]
    assert any(" insert " in line for line in arrived)
    assert any("name=customer 1," in line for line in arrived), "the first change was captured"
    # The snapshot reads each seeded row once. The demo's writer starts with the snapshot, so a
    # row it committed before a chunk was read is rightly read too (and also arrives as an insert).
    reads = [re.match(r"  redis tailrace\.shop\.(\w+) +read +id=(\d+),", line) for line in arrived
             if " read " in line]
    keys = [(m.group(1), int(m.group(2))) for m in reads if m]
    assert len(keys) == len(set(keys)), f"a row read twice: {sorted(keys)}"
    seeded = {("customers", n) for n in range(1, 21)} | {("orders", n) for n in range(1, 51)}
    assert seeded <= set(keys), f"seeded rows not read: {sorted(seeded - set(keys))}"
    written_later = set(keys) - seeded
    assert all(n > (20 if table == "customers" else 50) for table, n in written_later), written_later
    assert "all services and throwaway servers are gone" in out
    # nothing left running that belongs to this demo
    leftovers = subprocess.run(["pgrep", "-f", str(demo_dir)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
