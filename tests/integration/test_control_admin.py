"""The admin API over real gRPC: pipelines and state, pause/resume behind the admin token,
checkpoints with lag, rewind/reset with confirmation; TLS; reflection; the HTTP side port of a
real `tailrace-control` process; no secrets in answers or logs. (Every RPC against every role:
test_control_auth.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tailrace.config import parse_pipeline
from tailrace.control_client import ControlClient, ControlRefused
from tailrace.control_tls import ControlTlsError
from tailrace.devservers import free_port
from tailrace.proto import control_pb2 as pb
from tailrace_services.control.auth import AuthPolicy
from tailrace_services.control.server import ServerTls, serve
from tailrace_services.control.storage import MemoryStorage
from tailrace_services.control.tokens import Tokens
from tests.fix_control import ControlProcess

pytestmark = pytest.mark.integration

TOKEN = "admin-t0ken-for-tests"
SERVICE_TOKEN = "service-t0ken-for-tests"
SPEC = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {name: orders, tenant: acme}
spec:
  source: {type: postgres, id: shop-pg, dsn: "postgresql://app:pg-secret@db/shop", tables: [shop.*]}
  sinks:
    - {id: kafka-main, type: kafka, brokers: "k:9092"}
    - {id: redis-cache, type: redis, required: false, url: "redis://:redis-secret@r:6379/0"}
  bus: {brokers: "k:9092"}
  commit_policy: required   # (quorum and all count every sink: no required: false there)
"""


@pytest.fixture
def server():
    s = serve(MemoryStorage(), "127.0.0.1:0",
              auth=AuthPolicy(Tokens.of(SERVICE_TOKEN, TOKEN), open_reads=True))
    yield s
    s.stop()


@pytest.fixture
def admin(server):
    with ControlClient(f"127.0.0.1:{server.port}", retry_for=5, token=TOKEN) as c:
        c.register_pipeline(parse_pipeline(SPEC))
        yield c


@pytest.fixture
def anonymous(server):
    with ControlClient(f"127.0.0.1:{server.port}", retry_for=5) as c:
        yield c


def test_pipeline_registers_ids_and_types_only(admin):
    (info,) = admin.list_pipelines()
    assert (info.name, info.tenant, info.source_id, info.source_type) == (
        "orders", "acme", "shop-pg", "postgres")
    assert [(s.id, s.type, s.required) for s in info.sinks] == [
        ("kafka-main", "kafka", True), ("redis-cache", "redis", False)]
    assert info.commit_policy.kind == pb.POLICY_REQUIRED
    assert "secret" not in str(info)
    with pytest.raises(ControlRefused, match="looks like a DSN"):
        admin.register_pipeline("x", source_id="postgresql://u:pw@h/db", sinks=[("a", "redis", 1)])


def test_state_follows_health_reports_and_pause(admin, anonymous):
    assert admin.pipeline_state("orders") == ("running", "")
    assert anonymous.pipeline_state("nope")[0] == "unknown"
    admin.report_health("shop-pg", "position_lost",
                        "position lost: slot gone. Re-snapshot required.")
    state, reason = admin.pipeline_state("orders")
    assert (state, reason) == ("failed",
                               "shop-pg: position lost: slot gone. Re-snapshot required.")
    admin.report_health("orders", "degraded", "5 restarts in a row without a checkpoint "
                                              "advancing: sink kafka-main: broker down")
    assert admin.pipeline_state("orders")[0] == "failed", "a failure outranks degraded"
    admin.report_health("shop-pg", "running")
    assert admin.pipeline_state("orders") == (
        "degraded", "orders: degraded: 5 restarts in a row without a checkpoint advancing: "
                    "sink kafka-main: broker down")
    admin.report_health("orders", "running")
    assert admin.pause("orders", reason="maintenance").state == pb.PIPELINE_PAUSED
    assert anonymous.pipeline_state("orders") == ("paused", "maintenance")
    assert admin.resume("orders").state == pb.PIPELINE_RUNNING


@pytest.mark.parametrize("call", ["pause", "resume", "rewind", "dlq_purge", "dlq_ack",
                                  "dlq_replay"])
def test_admin_mutations_need_the_token(admin, anonymous, server, call):
    args = {"pause": ("orders",), "resume": ("orders",), "dlq_purge": ("orders",),
            "rewind": ("orders", "kafka-main", "kafka-main", None, True),
            "dlq_ack": ("orders", 5), "dlq_replay": ("orders",)}[call]
    with pytest.raises(ControlRefused, match="needs the admin token") as e:
        getattr(anonymous, call)(*args)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with ControlClient(f"127.0.0.1:{server.port}", token="wrong") as wrong, \
            pytest.raises(ControlRefused, match="needs the admin token"):
        getattr(wrong, call)(*args)
    with ControlClient(f"127.0.0.1:{server.port}", token=SERVICE_TOKEN) as service, \
            pytest.raises(ControlRefused, match="needs the admin role") as e:
        getattr(service, call)(*args)
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert admin.pipeline_state("orders")[0] == "running", "nothing changed"
    assert anonymous.list_pipelines(), "reads are open: this server runs with open_reads"


def epoch(epoch_id: int, seq: int, offset: int, ts_s: int) -> pb.Epoch:
    e = pb.Epoch(source_id="shop-pg", epoch_id=epoch_id, ts_unix_ms=ts_s * 1000)
    e.position.tx_seq = seq
    e.end_offsets[0] = offset
    return e


def commit(client: ControlClient, sink: str, seq: int, offset: int) -> None:
    cp = client.get_checkpoint("shop-pg", sink)
    new = pb.Checkpoint(pipeline="orders", source_id="shop-pg", sink_id=sink)
    new.position.tx_seq = seq
    new.bus_offsets[0] = offset
    new.sink_stored[0].tx_seq = seq
    assert client.commit_checkpoint(new, cp.version if cp else 0)[0]


def test_checkpoints_with_lag(admin):
    for i, (seq, offset, ts) in enumerate([(10, 100, 1000), (20, 200, 1030), (30, 300, 1090)]):
        admin.record_epoch(epoch(i + 1, seq, offset, ts))
    assert [e.epoch_id for e in admin.epoch_range("shop-pg", after_epoch_id=1)] == [2, 3]
    commit(admin, "kafka-main", 30, 300)
    commit(admin, "redis-cache", 20, 200)
    r = admin.sink_checkpoints("orders")
    assert r.latest_epoch.epoch_id == 3
    lag = {s.sink_id: (s.found, s.lag_offsets, s.lag_seconds) for s in r.sinks}
    assert lag == {"kafka-main": (True, 0, 0.0), "redis-cache": (True, 100, 60.0)}


def test_rewind_needs_confirmation_and_a_paused_pipeline(admin):
    for i, (seq, offset, ts) in enumerate([(10, 100, 1000), (20, 200, 1030), (30, 300, 1090)]):
        admin.record_epoch(epoch(i + 1, seq, offset, ts))
    commit(admin, "kafka-main", 30, 300)
    with pytest.raises(ControlRefused, match="--confirm kafka-main"):
        admin.rewind("orders", "kafka-main", confirm="", to_sequence=25)
    with pytest.raises(ControlRefused, match="pause it first"):
        admin.rewind("orders", "kafka-main", confirm="kafka-main", to_sequence=25)
    admin.pause("orders")
    with pytest.raises(ControlRefused, match="no sink 'nope'"):
        admin.rewind("orders", "nope", confirm="nope", to_sequence=25)
    with pytest.raises(ControlRefused, match="backwards only"):
        admin.rewind("orders", "kafka-main", confirm="kafka-main", to_sequence=40)
    r = admin.rewind("orders", "kafka-main", confirm="kafka-main", to_sequence=25)
    assert (r.before.position.tx_seq, r.after.position.tx_seq) == (30, 20)
    assert dict(r.after.bus_offsets) == {0: 200}, "back to the epoch's bus offsets"
    assert dict(r.before.sink_stored) and not dict(r.after.sink_stored), \
        "a rewound sink is not held to what it stored before"
    r = admin.rewind("orders", "kafka-main", confirm="kafka-main", reset=True)
    cp = admin.get_checkpoint("shop-pg", "kafka-main")
    assert (cp.position.tx_seq, dict(cp.bus_offsets), cp.version) == (0, {}, 3)
    # the delivery process that read version 1 before the rewind is fenced off
    stale = pb.Checkpoint(source_id="shop-pg", sink_id="kafka-main")
    stale.position.tx_seq = 30
    assert not admin.commit_checkpoint(stale, 1)[0]


def _self_signed(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_tls(tmp_path):
    cert, key = _self_signed(tmp_path)
    server = serve(MemoryStorage(), "127.0.0.1:0", tls=ServerTls(cert.read_bytes(),
                                                                 key.read_bytes()))
    try:
        address = f"127.0.0.1:{server.port}"
        with ControlClient(address, root_cert=str(cert), retry_for=5) as c:
            assert c.list_pipelines() == []
        with ControlClient(address, retry_for=30) as plain, \
                pytest.raises(ControlTlsError, match="serves TLS and this client speaks plaintext"):
            plain.list_pipelines()
    finally:
        server.stop()


def test_reflection_lists_the_services(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert {f"tailrace.v1.{n}" for n in ("Checkpoints", "Epochs", "Commits", "Schemas",
                                         "Identities", "DeadLetters", "Admin", "Audit")} <= services
    assert {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_http_side_port_of_the_real_process(tmp_path):
    http_port = free_port()
    with ControlProcess(tmp_path, f"sqlite:///{tmp_path / 's.db'}", token=TOKEN,
                        http_port=http_port) as control:
        base = f"http://127.0.0.1:{http_port}"
        assert _get(f"{base}/health") == (200, "ok\n")
        assert _get(f"{base}/ready") == (200, "ready\n")
        with control.client("service", retry_for=5) as c:
            c.report_batch("orders", "shop-pg", "required",
                           [pb.SinkOutcome(sink_id="k", required=True, acknowledged=False)])
            c.report_health("shop-pg", "position_lost",
                            "position lost: wal removed. Re-snapshot required.")
            status, body = _get(f"{base}/health")
            assert status == 503
            assert json.loads(body)["reason"] == ("shop-pg: position lost: wal removed. "
                                                  "Re-snapshot required.")
            c.report_health("shop-pg", "running")
            assert _get(f"{base}/health")[0] == 200
            c.report_health("orders", "failed", "producer fenced")
            assert "orders: failed: producer fenced" in _get(f"{base}/health")[1]
            with pytest.raises(ControlRefused):
                c.pause("orders")
        status, metrics = _get(f"{base}/metrics")
        assert status == 200
        assert 'tailrace_control_batches_total{outcome="unsatisfied",pipeline="orders"} 1.0' in metrics
        assert TOKEN not in control.log()


def test_storage_password_never_printed(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tailrace_services.control.main", "--listen", "127.0.0.1:0",
         "--storage", "postgresql://tailrace:s3cr3t-pw@127.0.0.1:1/state"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "cannot start" in result.stderr and "s3cr3t-pw" not in result.stderr + result.stdout
