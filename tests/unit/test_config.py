"""The spec loader: every problem reported at once, naming the file and the field."""

from __future__ import annotations

import pytest

from tailrace.config import load_pipeline, parse_pipeline
from tailrace.errors import ConfigError

GOOD = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders, tenant: acme}
spec:
  source: {type: postgres, id: pg1, dsn: "${PG_DSN}", tables: [public.orders, shop.order_%]}
  sinks:
    - {id: r1, type: redis, url: "redis://:secret@127.0.0.1:6379/0"}
  bus: {brokers: "${KAFKA:-127.0.0.1:9092}"}
  batch: {max_bytes: 4MiB}
"""


def test_valid_spec_expands_env_and_fills_defaults():
    spec = parse_pipeline(GOOD, env={"PG_DSN": "postgresql://u:pw@h/db"})
    assert spec.spec.source.dsn.get_secret_value() == "postgresql://u:pw@h/db"
    assert spec.spec.bus.brokers == "127.0.0.1:9092"
    assert spec.spec.batch.max_bytes == 4 * 1024 * 1024
    assert spec.spec.commit_policy == "required"
    assert spec.bus_topic == "tailrace.orders"
    assert "pw" not in repr(spec) and "secret" not in repr(spec)


def test_bad_spec_reports_every_problem_with_its_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("""
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders}
spec:
  source: {type: postgres, id: pg1, dsn: "${UNSET_DSN_FOR_TEST}", tables: [public.orders]}
  sinks:
    - {id: r1, type: redis, url: "redis://127.0.0.1", streem: "x"}
  bus: {brokers: "127.0.0.1:9092", partitions: many}
""")
    with pytest.raises(ConfigError) as exc:
        load_pipeline(path, env={})
    problems = exc.value.problems
    assert len(problems) == 3, problems
    assert all(p.startswith(f"{path}: ") for p in problems)
    assert any("spec.source.dsn: environment variable UNSET_DSN_FOR_TEST is not set" in p
               for p in problems)
    assert any("spec.sinks[0].streem: unknown field (did you mean 'stream'?)" in p
               for p in problems)
    assert any("spec.bus.partitions:" in p and "'many'" in p for p in problems)


def test_unknown_sink_type_and_template_dollar():
    text = GOOD.replace("type: redis", "type: rabbit")
    with pytest.raises(ConfigError, match=r"spec\.sinks\[0\]"):
        parse_pipeline(text, env={"PG_DSN": "x"})
    text = GOOD.replace('url: "redis://:secret@127.0.0.1:6379/0"',
                        'url: "redis://h", stream: "cdc.$table"')
    with pytest.raises(ConfigError, match="without '\\$'"):
        parse_pipeline(text, env={"PG_DSN": "x"})


def test_missing_required_field_and_bad_table_pattern():
    text = GOOD.replace("tables: [public.orders, shop.order_%]", "tables: [orders]")
    with pytest.raises(ConfigError, match=r"spec\.source\.tables.*db\.table"):
        parse_pipeline(text, env={"PG_DSN": "x"})
    text = GOOD.replace('  bus: {brokers: "${KAFKA:-127.0.0.1:9092}"}\n', "")
    with pytest.raises(ConfigError, match=r"spec\.bus: required field is missing"):
        parse_pipeline(text, env={"PG_DSN": "x"})
