"""Pipeline specs kept by the control service (issue 18 item 3): `tailrace apply|get|diff|
delete` against a `tailrace-control` process — every version kept, unchanged applies store
nothing, bad input refused with nothing stored, mutations only with the admin token, and
each one in the audit log."""

from __future__ import annotations

import pytest

from tests.fix_control import ControlProcess, cli_in_process

pytestmark = pytest.mark.integration

SPEC = """\
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders}
spec:
  source: {type: postgres, id: pg1, dsn: "${PG_DSN}", tables: [public.orders]}
  sinks:
    - {id: r1, type: redis, url: "${REDIS_URL}"}
  bus: {brokers: "kafka:9092"}
"""


@pytest.fixture
def cli(tmp_path, capsys, monkeypatch):
    with ControlProcess(tmp_path / "control", f"sqlite:///{tmp_path / 'state.db'}") as control:
        yield control, cli_in_process(control, capsys, monkeypatch)


def test_apply_get_diff_and_delete_keep_every_version(cli, tmp_path) -> None:
    control, run = cli
    spec = tmp_path / "orders.yaml"
    spec.write_text(SPEC)
    code, out, _ = run("apply", "-f", str(spec), token=True)
    assert code == 0 and "pipeline orders created: version 1" in out
    assert "+++ orders (applied)" in out and "+  bus:" in out
    code, out, _ = run("apply", "-f", str(spec), token=True)
    assert (code, out.strip()) == (0, "pipeline orders unchanged (version 1)")
    assert run("diff", "-f", str(spec), token=True)[:2] == (0, "")

    spec.write_text(SPEC.replace("{brokers: \"kafka:9092\"}", "{brokers: \"kafka:9092\", "
                                 "partitions: 2}"))
    code, out, _ = run("diff", "-f", str(spec), token=True)
    assert code == 1 and "-  bus: {brokers: \"kafka:9092\"}" in out and "partitions: 2" in out
    code, out, _ = run("apply", "-f", str(spec), "--dry-run", token=True)
    assert code == 0 and "would change (dry run: nothing stored)" in out
    code, out, _ = run("apply", "-f", str(spec), token=True)
    assert code == 0 and "pipeline orders configured: version 2" in out
    assert run("get", "orders")[1] == spec.read_text()
    assert run("get", "orders", "--version", "1")[1] == SPEC, "every version kept"
    code, out, _ = run("get")
    assert code == 0 and "orders" in out and " 2 " in out

    code, _, err = run("delete", "orders", token=True)
    assert code == 1 and "--confirm orders" in err
    assert run("get", "orders")[0] == 0, "nothing deleted without --confirm"
    code, out, _ = run("delete", "orders", "--confirm", "orders", token=True)
    assert code == 0 and "pipeline orders deleted (version 3)" in out
    code, _, err = run("get", "orders")
    assert code == 1 and "was deleted (version 3)" in err
    code, out, _ = run("get", "orders", "--history")
    assert [line.split()[1] for line in out.splitlines()[1:]] == ["1", "2", "3"]
    code, out, _ = run("apply", "-f", str(spec), token=True)
    assert code == 0 and "pipeline orders created: version 4" in out, "applied again"

    records = [r for r in control.client().list_audit(pipeline="orders")
               if r.method.startswith("Specs/")]
    assert [r.method for r in records] == ["Specs/Apply"] * 6 + ["Specs/Delete"] * 2 + \
        ["Specs/Apply"], "each apply (dry runs and diffs too) and delete, by whom and when"
    assert all(r.role == "admin" and r.agent and r.ts_unix_ms for r in records)
    assert not any("kafka:9092" in r.summary for r in records), "no spec text in the audit log"


def test_bad_input_and_missing_tokens_change_nothing(cli, tmp_path) -> None:
    control, run = cli
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.replace("tables: [public.orders]", "tables: []").replace(
        "type: redis", "type: rediss"))
    code, _, err = run("apply", "-f", str(bad), token=True)
    assert code == 1 and "does not validate, nothing was stored" in err
    assert "spec.source" in err and "tables" in err and "spec.sinks[0]" in err
    good = tmp_path / "orders.yaml"
    good.write_text(SPEC)
    code, _, err = run("apply", "-f", str(good))  # the service token: it may read, not change
    assert code == 1 and "needs the admin token" in err
    assert run("get")[1].startswith("no pipeline specs")
    code, _, err = run("get", "nobody")
    assert code == 1 and "no spec of pipeline 'nobody'" in err
