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


DSN_SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: orders}}
spec:
  source: {{type: {type}, id: src1, dsn: "{dsn}", tables: [shop.orders]}}
  sinks:
    - {{id: r1, type: redis, url: "redis://127.0.0.1:1"}}
  bus: {{brokers: "{brokers}"}}
  control: {{address: "{control}"}}
"""


@pytest.mark.parametrize(("kind", "dsn", "problem"), [
    ("postgres", "host=127.0.0.1 port=notaport dbname=shop password=s3cret-pw",
     "spec.source.dsn: port 'notaport' is not a port number"),
    ("postgres", "postgresql://app:s3cret-pw@127.0.0.1/shop?sslmode=bogus",
     "spec.source.dsn: sslmode 'bogus' is not one of disable, allow, prefer"),
    ("mysql", "mysql://app:s3cret-pw@127.0.0.1:notaport/shop",
     "spec.source.dsn: not a valid MySQL URL: the port is not a number"),
], ids=["pg-port", "pg-sslmode", "mysql-port"])
def test_a_malformed_dsn_makes_capture_exit_2_naming_the_field(tmp_path, kind, dsn, problem):
    spec = tmp_path / "dsn.yaml"
    spec.write_text(DSN_SPEC.format(type=kind, dsn=dsn, brokers="127.0.0.1:1",
                                    control=f"127.0.0.1:{free_port()}"))
    result = subprocess.run([sys.executable, "-m", "tailrace_services.capture", str(spec)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"{spec}: {problem}" in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_a_dsn_libpq_refuses_at_connect_is_a_config_error_too(tmp_path, pg_server, kafka_broker):
    """What only libpq checks (here `sslcertmode`) is refused when capture connects: exit 2
    naming spec.source.dsn, not "reconnecting" forever."""
    from tests.fix_control import ControlProcess

    dsn = pg_server.dsn("postgres").replace("postgres@", "postgres:s3cret-pw@") + \
        "?sslcertmode=bogus"
    with ControlProcess(tmp_path / "control", "memory://", auth=False) as control:
        spec = tmp_path / "dsn.yaml"
        spec.write_text(DSN_SPEC.format(type="postgres", dsn=dsn, brokers=kafka_broker.bootstrap,
                                        control=control.address))
        result = subprocess.run([sys.executable, "-m", "tailrace_services.capture", str(spec)],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert 'spec.source.dsn: invalid sslcertmode value: \\"bogus\\"' in result.stderr, \
        result.stderr
    assert "reconnecting" not in result.stderr and "s3cret-pw" not in result.stderr


PROCESSORS_SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: orders}}
spec:
  source: {{type: postgres, id: pg1, dsn: "postgresql://127.0.0.1:1/shop", tables: [public.orders]}}
  sinks:
    - {{id: r1, type: redis, url: "redis://127.0.0.1:1"}}
  processors:
    - {{type: filter, where: "op != 'delete'"}}
    - {{type: filter, where: "amount >>> AND"}}
    - {{type: transform, set: {{day: "date_format(created, 'yyyy-MM-dd')"}}}}
  bus: {{brokers: "127.0.0.1:1"}}
  control: {{address: "127.0.0.1:{port}"}}
  journal: {{enabled: true, ttl: 7 days}}
"""


@pytest.mark.parametrize("command", [
    ["-m", "tailrace_services.delivery.main"],
    ["-m", "tailrace_services.cli.main", "up"],
])
def test_a_bad_processor_expression_and_a_bad_ttl_stop_delivery_before_it_starts(tmp_path,
                                                                                command):
    """Found when the spec loads (not on a Spark executor at the first batch): exit 2, one
    line per problem naming the file and the field, and nothing started."""
    port = free_port()
    spec = tmp_path / "processors.yaml"
    spec.write_text(PROCESSORS_SPEC.format(port=port))
    result = subprocess.run([sys.executable, *command, str(spec)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith(f"{spec}: ")]
    assert len(problems) == 3, result.stderr
    assert problems[0].startswith(f"{spec}: spec.processors[1].where: not a valid Spark SQL "
                                  "expression 'amount >>> AND'")
    assert problems[1].startswith(f"{spec}: spec.processors[2].set.day: not supported by the "
                                  "processor evaluator")
    assert problems[2].startswith(f"{spec}: spec.journal.ttl: '7 days' is not a duration")
    assert "Spark" not in result.stderr.replace("Spark SQL", "")  # nothing of Spark started
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
