"""`source.max_retained` in the control service (issue 17 item 1, DESIGN guarantee 13), through
a real `tailrace-control` process and the `tailrace` CLI: a capture's report of the source
log kept past the limit detaches the laggiest optional sink, one per report; minimum
checkpoints leave it out (the slot may advance), commits no longer move it, the pipeline is
degraded saying why; a required sink is never detached; `tailrace attach` brings one back.
The same with a real PostgreSQL slot and delivery: tests/chaos/test_retention.py."""

from __future__ import annotations

import json

import pytest

from tailrace.control_client import SinkOutcome
from tailrace.proto import control_pb2 as pb
from tests.fix_control import ControlProcess, cli_in_process

pytestmark = pytest.mark.integration

SOURCE = "shop-pg"
MIB = 1 << 20


@pytest.fixture
def control(tmp_path):
    """A control process holding pipeline `orders`: sink main (required) at tx 30, archive
    (optional) at tx 20, cache (optional) at tx 10."""
    with ControlProcess(tmp_path, f"sqlite:///{tmp_path / 'state.db'}") as proc, \
            proc.client("service", retry_for=10) as c:
        c.register_pipeline("orders", tenant="acme", source_id=SOURCE, source_type="postgres",
                            sinks=[("main", "redis", True), ("archive", "redis", False),
                                   ("cache", "redis", False)])
        for i, seq in enumerate((10, 20, 30), start=1):
            e = pb.Epoch(source_id=SOURCE, epoch_id=i, ts_unix_ms=1_700_000_000_000 + i)
            e.position.tx_seq = seq
            e.end_offsets[0] = seq * 10
            c.record_epoch(e)
        for sink, seq in (("main", 30), ("archive", 20), ("cache", 10)):
            cp = pb.Checkpoint(pipeline="orders", source_id=SOURCE, sink_id=sink)
            cp.position.tx_seq = seq
            cp.bus_offsets[0] = seq * 10
            assert c.commit_checkpoint(cp, 0)[0]
        yield proc


@pytest.fixture
def tailrace(control, capsys, monkeypatch):
    """`tailrace(*argv, token=False)` -> (exit code, stdout, stderr) (`cli_in_process`)."""
    return cli_in_process(control, capsys, monkeypatch)


def minimum(c) -> int:
    cp = c.minimum_checkpoint(SOURCE, ["main", "archive", "cache"])
    return cp.position.tx_seq


def test_past_the_limit_optional_sinks_are_detached_laggiest_first_never_a_required_one(
        control, tailrace) -> None:
    with control.client("service", retry_for=10) as c:
        assert minimum(c) == 10
        answer = c.report_retained(SOURCE, 3 * MIB, "slot tailrace_orders", MIB // 2)
        assert [d.sink_id for d in answer.detached] == ["cache"], "the laggiest first, one"
        assert answer.detached[0].checkpoint.position.tx_seq == 10
        assert "3.0 MiB" in answer.detached[0].reason and "512.0 KiB" in answer.detached[0].reason
        assert minimum(c) == 20, "a detached sink no longer holds the log back"

        # a batch that cache acknowledged (delivery had not seen the detach yet) leaves it put
        cp = pb.Checkpoint(pipeline="orders", source_id=SOURCE, sink_id="cache")
        cp.position.tx_seq = 30
        cp.bus_offsets[0] = 300
        r = c.report_batch("orders", SOURCE, "required", [
            SinkOutcome("cache", False, True, cp, c.get_checkpoint(SOURCE, "cache").version)])
        assert r.committed is False or all(s.sink_id != "cache" for s in r.checkpoints)
        assert c.get_checkpoint(SOURCE, "cache").position.tx_seq == 10

        info = c.get_pipeline("orders")
        assert info.state == pb.PIPELINE_DEGRADED
        assert "sink cache detached" in info.reason and "tailrace attach orders cache" in \
            info.reason, info.reason
        (record,) = [r for r in c.list_reconcile_records(SOURCE) if r.decision == "detach sink cache"]
        assert "optional sink cache detached" in record.drift[0]

        answer = c.report_retained(SOURCE, 2 * MIB, "slot tailrace_orders", MIB // 2)
        assert [d.sink_id for d in answer.detached] == ["archive"]
        assert minimum(c) == 30

        answer = c.report_retained(SOURCE, 2 * MIB, "slot tailrace_orders", MIB // 2)
        assert not answer.detached, "main is required: never detached"
        assert "required sink main holds it back at tx 30" in answer.over_limit
        assert "required sink main" in c.get_pipeline("orders").reason

        answer = c.report_retained(SOURCE, 1000, "slot tailrace_orders", MIB // 2)
        assert not answer.detached and not answer.over_limit
        reason = c.get_pipeline("orders").reason
        assert "source log kept" not in reason and "sink archive detached" in reason

    code, out, _ = tailrace("checkpoints", "orders")
    assert code == 0
    rows = {line.split()[1]: line for line in out.splitlines()[1:]}
    assert "since " in rows["cache"] and "past source.max_retained" in rows["cache"]
    assert "since " not in rows["main"]
    assert json.loads(tailrace("checkpoints", "orders", "--json")[1])[0]["sinks"][2][
        "detached"]["sink_id"] == "cache"
    assert "degraded" in tailrace("pipelines")[1]

    code, out, err = tailrace("attach", "orders", "cache", "--confirm", "cache", token=True)
    assert code == 1 and "pause it first" in err, (out, err)
    assert tailrace("pause", "orders", token=True)[0] == 0
    code, _, err = tailrace("attach", "orders", "cache", token=True)
    assert code == 1 and "--confirm cache" in err
    code, _, err = tailrace("attach", "orders", "main", "--confirm", "main", token=True)
    assert code == 1 and "is not detached" in err
    code, out, _ = tailrace("attach", "orders", "cache", "--confirm", "cache", token=True)
    assert code == 0 and "attached again at tx 30" in out and "tailrace snapshot" in out, out
    with control.client("service", retry_for=10) as c:
        assert c.get_checkpoint(SOURCE, "cache").position.tx_seq == 30, "from where main is"
        assert minimum(c) == 30
    assert tailrace("resume", "orders", token=True)[0] == 0
    with control.client("service", retry_for=10) as c:
        reason = c.get_pipeline("orders").reason
        assert "sink cache" not in reason and "sink archive detached" in reason


def test_without_a_limit_or_under_it_nothing_is_detached(control) -> None:
    with control.client("service", retry_for=10) as c:
        assert not c.report_retained(SOURCE, 50 * MIB, "slot tailrace_orders").detached
        assert not c.report_retained(SOURCE, MIB, "slot tailrace_orders", 2 * MIB).detached
        assert c.get_pipeline("orders").state == pb.PIPELINE_RUNNING
        assert minimum(c) == 10
