"""A bad spec is refused before anything starts, one message per problem naming the field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tailrace.devservers import free_port

BAD = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: orders}}
spec:
  source: {{type: postgres, id: pg1, dsn: "${{TAILRACE_TEST_UNSET_DSN}}", tables: [public.orders]}}
  sinks:
    - {{id: r1, type: redis, url: "redis://127.0.0.1:1", stream: "s", maxlenn: 5}}
  bus: {{brokers: "127.0.0.1:1", partitions: "two"}}
  control: {{address: "127.0.0.1:{port}"}}
"""


@pytest.mark.parametrize("command", [
    ["-m", "tailrace_services.cli.main", "up"],
    ["-m", "tailrace_services.capture"],
    ["-m", "tailrace_services.delivery.main"],
])
def test_bad_spec_is_refused_with_one_line_per_problem(tmp_path, command):
    port = free_port()
    spec = tmp_path / "bad.yaml"
    spec.write_text(BAD.format(port=port))
    result = subprocess.run([sys.executable, *command, str(spec)], capture_output=True, text=True,
                            timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith(f"{spec}: ")]
    assert len(problems) == 3, result.stderr
    assert "spec.source.dsn: environment variable TAILRACE_TEST_UNSET_DSN is not set" in problems[0]
    assert "spec.sinks[0].maxlenn: unknown field (did you mean 'maxlen'?)" in result.stderr
    assert "spec.bus.partitions:" in result.stderr and "'two'" in result.stderr
    # nothing started: the control port stays free
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
