"""The `tailrace` admin CLI, every command, against a real `tailrace-control` process with tokens:
reads with the service token, changes with the admin token."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys

import pytest
import redis

from tailrace.control_client import identity
from tailrace.events import ChangeEvent, Column, Op, Position, Row, value_of
from tailrace.proto import control_pb2 as pb
from tests.fix_control import ControlProcess, cli_in_process

pytestmark = pytest.mark.integration

TOKEN = "cli-admin-token-for-tests"


def event(i: int) -> bytes:
    return ChangeEvent(
        source_id="shop-pg", tenant="acme", database="shop", table="orders", op=Op.OP_INSERT,
        key_columns=["id"], tx_id=str(i), tx_index=0, tx_size=1, tx_end=True, id=f"ev-{i}",
        after=Row(columns=[Column(name="id", value=value_of(i))]),
        position=Position(tx_seq=i)).SerializeToString()


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    """A control process with a token, holding one pipeline with some of everything."""
    directory = tmp_path_factory.mktemp("cli")
    with ControlProcess(directory, f"sqlite:///{directory / 'state.db'}", token=TOKEN) as proc, \
            proc.client("service", retry_for=10) as c:
        c.register_pipeline("orders", tenant="acme", source_id="shop-pg", source_type="postgres",
                            sinks=[("cache", "redis", False), ("main", "redis", True)])
        for i, (seq, offset) in enumerate([(10, 100), (20, 200), (30, 300)], start=1):
            e = pb.Epoch(source_id="shop-pg", epoch_id=i, ts_unix_ms=1_700_000_000_000 + i * 30_000)
            e.position.tx_seq = seq
            e.end_offsets[0] = offset
            c.record_epoch(e)
        for sink, seq in (("main", 30), ("cache", 20)):
            cp = pb.Checkpoint(pipeline="orders", source_id="shop-pg", sink_id=sink)
            cp.position.tx_seq = seq
            cp.bus_offsets[0] = seq * 10
            assert c.commit_checkpoint(cp, 0)[0]
        for table in ("public.orders", "public.items"):
            c.register_schema("acme", "shop", table, hashlib.sha256(table.encode()).hexdigest(),
                              '{"columns": []}')
        c.add_reconcile_record("shop-pg", identity("postgres", {"timeline": "1"}, "aaaa1111"),
                               identity("postgres", {"timeline": "2"}, "bbbb2222"),
                               ["shop.public.orders: column note added"], "adapt")
        c.dlq_append("orders", [("cache", "too large", event(i)) for i in range(1, 6)],
                     "reject", 100, 0)
        yield proc


@pytest.fixture
def tailrace(control, capsys, monkeypatch):
    """`tailrace(*argv, token=False)` -> (exit code, stdout, stderr) (`cli_in_process`)."""
    return cli_in_process(control, capsys, monkeypatch)


def test_pipelines(tailrace):
    code, out, _ = tailrace("pipelines")
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["PIPELINE", "TENANT", "SOURCE", "STATE", "POLICY", "SINKS",
                              "DELIVERY", "RETAINED", "REASON"]
    assert row.split()[:6] == ["orders", "acme", "shop-pg", "(postgres)", "running", "required"]
    assert row.split()[8] == "-", "no delivery instance claimed it"
    assert row.split()[9] == "-", "no capture measured the source log it keeps yet"
    code, out, _ = tailrace("pipelines", "--json")
    (entry,) = json.loads(out)
    assert entry["sinks"][0] == {"id": "cache", "type": "redis", "required": False,
                                 "last_error": "", "failing_since_unix_ms": 0,
                                 "failed_batches": 0, "start": "earliest"}
    assert (entry["state"], entry["commit_policy"]["kind"]) == ("running", "required"), \
        "the words the table shows"
    assert isinstance(entry["registered_unix_ms"], int)


def test_checkpoints_with_lag(tailrace):
    code, out, _ = tailrace("checkpoints", "orders")
    assert code == 0
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:]}
    # REQUIRED POSITION TX_SEQ VERSION LAG_OFFSETS LAG_BYTES LAG_TX LAG_S UPDATED...
    # SOURCE_LOG_KEPT LAST_ERROR
    assert rows["main"][2:10] == ["yes", "-", "30.0", "1", "0", "0B", "-", "0.0"]
    assert rows["cache"][2:10] == ["no", "-", "20.0", "1", "100", "-", "-", "30.0"]
    assert rows["cache"][-1] == "-", "no error reported for it"
    code, out, _ = tailrace("--json", "checkpoints")
    (answer,) = json.loads(out)
    assert {s["sink_id"]: s["lag_offsets"] for s in answer["sinks"]} == {"cache": 100,
                                                                         "main": 0}
    main = next(s for s in answer["sinks"] if s["sink_id"] == "main")
    assert (main["lag_bytes"], main["checkpoint"]["position"]["tx_seq"]) == (0, 30)


def test_the_source_log_a_pipeline_keeps_is_shown_as_capture_last_measured_it(
        tailrace, control):
    """`report_retained` (what capture sends every 10 s) changes no state; `pipelines`,
    `checkpoints` and their JSON show the figure and what holds it."""
    with control.client("service", retry_for=10) as c:
        c.report_retained("shop-pg", 3_250_585, "slot tailrace_orders")
        assert c.get_pipeline("orders").state == pb.PIPELINE_RUNNING
    code, out, _ = tailrace("pipelines")
    assert code == 0 and "3.1MiB (slot tailrace_orders)" in out.splitlines()[1], out
    code, out, _ = tailrace("checkpoints", "orders")
    assert all("3.1MiB (slot tailrace_orders)" in line for line in out.splitlines()[1:]), out
    code, out, _ = tailrace("--json", "pipelines")
    (entry,) = json.loads(out)
    assert (entry["retained_bytes"], entry["retained_what"]) == (3_250_585,
                                                                 "slot tailrace_orders")
    assert entry["retained_unix_ms"] > 0


def test_schemas(tailrace):
    code, out, _ = tailrace("schemas")
    assert code == 0 and len(out.splitlines()) == 3
    code, out, _ = tailrace("schemas", "--table", "shop.orders")
    (row,) = out.splitlines()[1:]
    assert row.split()[:5] == ["acme", "shop", "public.orders", "1", "1"]
    code, out, _ = tailrace("schemas", "--table", "shop.public.items", "--json")
    assert [r["table"] for r in json.loads(out)] == ["public.items"]


def test_drift(tailrace):
    code, out, _ = tailrace("drift", "shop-pg")
    assert code == 0
    assert "adapt" in out and "aaaa1111 -> bbbb2222" in out and "column note added" in out
    assert tailrace("drift", "other")[1].strip() == "no reconcile records"


def test_dlq_list_replay_purge(tailrace, tmp_path, redis_server):
    code, out, _ = tailrace("dlq", "list", "orders")
    assert code == 0 and "5 dead letter(s)" in out and len(out.splitlines()) == 7

    code, _, err = tailrace("dlq", "replay", "orders", "--out", str(tmp_path / "x.jsonl"))
    assert code == 1 and "needs the admin role" in err, "replay is an admin mutation"

    exported = tmp_path / "dlq.jsonl"
    code, out, _ = tailrace("dlq", "replay", "orders", "--limit", "2", "--out", str(exported),
                            token=True)
    assert code == 0 and "acknowledged up to sequence 2" in out
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [(d["sequence"], base64.b64decode(d["event_b64"])) for d in lines] == [
        (1, event(1)), (2, event(2))]

    spec = tmp_path / "orders.yaml"
    spec.write_text(f"""
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: orders, tenant: acme}}
spec:
  source: {{type: postgres, id: shop-pg, dsn: "host=unused", tables: [public.orders]}}
  sinks:
    - {{id: cache, type: redis, required: false, url: "{redis_server.url}", stream: "dlq.{{table}}"}}
    - {{id: main, type: redis, url: "{redis_server.url}", stream: "main.{{table}}"}}
  bus: {{brokers: "unused:9092"}}
""")
    code, out, _ = tailrace("dlq", "replay", "orders", "--limit", "2", "--spec", str(spec),
                            token=True)
    assert code == 0 and "replayed 2 dead letter(s) to its sinks" in out
    stream = redis.Redis.from_url(redis_server.url).xrange("dlq.orders")
    assert [json.loads(f[b"event"])["after"]["id"] for _, f in stream] == [3, 4]

    code, out, _ = tailrace("dlq", "list", "orders", "--json")
    assert [e["sequence"] for e in json.loads(out)["entries"]] == [5]
    code, _, err = tailrace("dlq", "purge", "orders")
    assert code == 1 and err.startswith("tailrace: dlq refused: ") and len(err.splitlines()) == 1
    assert tailrace("dlq", "purge", "orders", token=True)[1].strip() == \
        "purged 1 dead letter(s) of pipeline orders"


def test_pause_rewind_resume(tailrace):
    code, _, err = tailrace("pause", "orders")
    assert code == 1 and "needs the admin role and the service token was sent" in err
    assert tailrace("pipelines")[1].split("\n")[1].split()[4] == "running"

    code, _, err = tailrace("rewind", "orders", "main", "--to-sequence", "25", "--confirm",
                            "main", token=True)
    assert code == 1 and "pause it first" in err

    assert tailrace("pause", "orders", "--reason", "rewinding main", token=True)[0] == 0
    assert "paused" in tailrace("pipelines")[1] and "rewinding main" in tailrace("pipelines")[1]

    code, _, err = tailrace("rewind", "orders", "main", "--to-sequence", "25", token=True)
    assert code == 1 and "--confirm main" in err
    code, out, _ = tailrace("rewind", "orders", "main", "--to-sequence", "25", "--confirm",
                            "main", token=True)
    assert code == 0 and "from tx 30.0 to tx 20.0" in out
    code, out, _ = tailrace("rewind", "orders", "main", "--reset", "--confirm", "main",
                            token=True)
    assert code == 0 and "to the earliest available position" in out
    assert "it receives again what it had" in out
    (answer,) = json.loads(tailrace("checkpoints", "orders", "--json")[1])
    main = next(s for s in answer["sinks"] if s["sink_id"] == "main")
    assert main["checkpoint"]["rewind"] == 2, "each rewind starts a generation the sink honours"

    assert tailrace("resume", "orders", token=True)[1].strip() == \
        "pipeline orders resumed (state running)"


def test_failures_are_one_line_and_non_zero(control):
    """The installed console script, as an operator runs it."""
    tailrace = [sys.executable, "-m", "tailrace_services.cli.main"]
    r = subprocess.run([*tailrace, "--control", "127.0.0.1:1", "pipelines"], capture_output=True,
                       text=True, timeout=60)
    assert (r.returncode, r.stderr) == (
        1, "tailrace: cannot reach control service at 127.0.0.1:1: connection refused\n")
    r = subprocess.run([*tailrace, "pause", "nope", "--control", control.address, "--token",
                        TOKEN], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr == ("tailrace: pause refused: pipeline 'nope' is not registered; "
                        "registered: orders\n")
    assert TOKEN not in control.log()
