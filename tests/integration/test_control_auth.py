"""Roles and audit against a real `tailrace-control` process, every RPC of the proto walked.

Without a token every control-plane RPC is UNAUTHENTICATED; with the service token the admin
RPCs are PERMISSION_DENIED and the rest pass the check; the admin token passes everywhere.
Each accepted change of state leaves an audit record; refusals leave none. Reads need a
token unless control runs with --open-reads; the standard health service stays open.
"""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tailrace.control_client import ControlClient, ControlRefused
from tailrace.devservers import free_port
from tailrace.proto import control_pb2 as pb
from tailrace_services.cli.main import main
from tailrace_services.cli.supervisor import service_argv
from tailrace_services.cli.up import wait_for_port
from tailrace_services.control.roles import ACCESS, Access, audited
from tests.fix_control import ControlProcess

pytestmark = pytest.mark.integration

REFUSALS = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
RPCS = [(f"/{s.full_name}/{m.name}", m) for s in pb.DESCRIPTOR.services_by_name.values()
        for m in s.methods]
CHANGES = {path for path, _ in RPCS if audited(path)}


def short(path: str) -> str:
    return path.rsplit(".", 1)[1]  # Admin/Pause


def call(address: str, path: str, method: object, token: str | None) -> grpc.StatusCode:
    """One call of `path` with an empty request; the status it ends with."""
    request, response = (GetMessageClass(method.input_type),  # type: ignore[attr-defined]
                         GetMessageClass(method.output_type))  # type: ignore[attr-defined]
    assert not (method.client_streaming or method.server_streaming)  # type: ignore[attr-defined]
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(address) as channel:
        stub = channel.unary_unary(path, request_serializer=request.SerializeToString,
                                   response_deserializer=response.FromString)
        try:
            stub(request(), timeout=10, metadata=metadata)
        except grpc.RpcError as e:
            return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("auth")
    with ControlProcess(directory, "memory://") as proc:
        yield proc


def audit_log(control: ControlProcess) -> list[pb.AuditRecord]:
    with control.client(retry_for=10) as admin:
        return admin.list_audit(limit=10_000)


def test_every_rpc_refuses_a_call_without_the_right_token(control):
    before = len(audit_log(control))
    wrong = {}
    for path, method in RPCS:
        needs = ACCESS[path]
        for who, token in (("none", None), ("unknown", "not-a-token-of-this-service"),
                           ("service", control.service_token)):
            code = call(control.address, path, method, token)
            expected = (grpc.StatusCode.UNAUTHENTICATED if who != "service" else
                        grpc.StatusCode.PERMISSION_DENIED if needs == Access.ADMIN else None)
            if (expected is None and code in REFUSALS) or (expected and code != expected):
                wrong[(path, who)] = code
    assert not wrong, f"refused wrongly or not at all: {wrong}"
    records = audit_log(control)
    assert {(r.role, r.method) for r in records[before:]} == {
        ("service", short(p)) for p in CHANGES if ACCESS[p] == Access.SERVICE}, \
        "refused calls leave no record; each accepted change does"


def test_the_admin_token_passes_everywhere_and_every_change_is_audited(control):
    before = len(audit_log(control))
    refused = {path: code for path, method in RPCS
               if (code := call(control.address, path, method, control.admin_token)) in REFUSALS}
    assert not refused
    mine = [r for r in audit_log(control)[before:] if r.role == "admin"]
    assert {r.method for r in mine} == {short(p) for p in CHANGES}
    assert all(r.peer.startswith("ipv4:127.0.0.1:") and r.outcome for r in mine)


def test_an_audit_record_says_who_when_and_what(control):
    with control.client("service", retry_for=10, agent="capture test-host:1") as service, \
            control.client(retry_for=10, agent="tailrace ops-host:2") as admin:
        service.register_pipeline("orders", tenant="acme", source_id="pg1",
                                  source_type="postgres", sinks=[("main", "redis", True)])
        admin.pause("orders", reason="maintenance window")
        with pytest.raises(ControlRefused, match="needs the admin role"):
            service.resume("orders")
        admin.resume("orders")
        records = admin.list_audit(pipeline="orders")
    assert [(r.role, r.method, r.outcome) for r in records] == [
        ("service", "Admin/RegisterPipeline", "ok"), ("admin", "Admin/Pause", "ok"),
        ("admin", "Admin/Resume", "ok")]
    register, pause, _ = records
    assert register.agent == "capture test-host:1" and pause.agent == "tailrace ops-host:2"
    assert pause.summary == "name=orders reason='maintenance window'"
    assert "sinks=[main]" in register.summary
    assert pause.ts_unix_ms >= register.ts_unix_ms > 0
    log = control.log()
    assert control.admin_token not in log and control.service_token not in log
    assert '"event": "audit"' in log and "Admin/Pause" in log, "admin changes are logged"
    assert '"event": "call refused"' in log


def test_the_audit_command(control, capsys):
    with control.client(retry_for=10) as admin:
        admin.register_pipeline("audited", source_id="pg2", sinks=[("s", "redis", True)])
        admin.pause("audited", reason="cli")
    code = main(["audit", "--pipeline", "audited", "--control", control.address,
                 "--token-file", str(control.admin_token_file)])
    out = capsys.readouterr().out
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["TIME", "ROLE", "METHOD", "OUTCOME", "PIPELINE", "WHO", "PEER",
                              "WHAT"]
    assert [row.split()[2:6] for row in rows] == [
        ["admin", "Admin/RegisterPipeline", "ok", "audited"],
        ["admin", "Admin/Pause", "ok", "audited"]]
    code = main(["audit", "--control", control.address, "--token", control.service_token])
    assert code == 1
    assert "audit refused: Audit/List needs the admin role" in capsys.readouterr().err


def test_reads_need_a_token_and_health_is_open(control):
    with control.client(None, retry_for=10) as anonymous, \
            pytest.raises(ControlRefused, match="needs a token, service or admin") as e:
        anonymous.list_pipelines()
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(control.address) as channel:
        with pytest.raises(grpc.RpcError) as e:
            ProtoReflectionDescriptorDatabase(channel).get_services()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                            timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_open_reads(tmp_path):
    with ControlProcess(tmp_path, "memory://", args=("--open-reads",)) as control, \
            control.client(None, retry_for=10) as anonymous:
        assert anonymous.list_pipelines() == []
        with pytest.raises(ControlRefused, match="needs the service token") as e:
            anonymous.register_pipeline("x", source_id="pg", sinks=[("s", "redis", True)])
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(control.address) as channel:
            assert "tailrace.v1.Admin" in ProtoReflectionDescriptorDatabase(channel).get_services()


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tailrace_services.control.main",
                           "--listen", "127.0.0.1:0", "--storage", "memory://", *args],
                          capture_output=True, text=True, timeout=60, env=env or {"PATH": "/bin"})


def test_no_tokens_no_start(tmp_path):
    r = start()
    assert r.returncode == 2
    assert "no tokens: every call needs one" in r.stderr and "--insecure-no-auth" in r.stderr
    (tmp_path / "s").write_text("same-token-for-both-roles\n")
    r = start("--service-token-file", str(tmp_path / "s"), "--admin-token-file",
              str(tmp_path / "s"))
    assert r.returncode == 2 and "the service and admin tokens are the same" in r.stderr
    assert "same-token-for-both-roles" not in r.stderr
    r = start(env={"PATH": "/bin", "TAILRACE_SERVICE_TOKEN": "short",
                   "TAILRACE_ADMIN_TOKEN": "an-admin-token-long-enough"})
    assert r.returncode == 2 and "the service token has 5 characters" in r.stderr
    r = start("--insecure-no-auth", env={"PATH": "/bin", "TAILRACE_SERVICE_TOKEN": "x" * 20,
                                         "TAILRACE_ADMIN_TOKEN": "y" * 20})
    assert r.returncode == 2 and "--insecure-no-auth and tokens were both given" in r.stderr


def test_insecure_no_auth_is_explicit_and_still_audited(tmp_path):
    with ControlProcess(tmp_path, "memory://", auth=False) as control, \
            control.client(None, retry_for=10) as anyone:
        anyone.register_pipeline("open", source_id="pg", sinks=[("s", "redis", True)])
        anyone.pause("open")
        assert [(r.role, r.method) for r in anyone.list_audit()] == [
            ("none", "Admin/RegisterPipeline"), ("none", "Admin/Pause")]
    assert "control serves without authentication" in control.log()


def test_the_old_token_file_is_the_admin_token(tmp_path):
    old, service = tmp_path / "old.token", tmp_path / "service.token"
    old.write_text("legacy-admin-token-0123\n")
    service.write_text("service-token-0123456\n")
    address = f"127.0.0.1:{free_port()}"
    log = tmp_path / "control.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(service_argv(
            "tailrace-control", "--listen", address, "--storage", "memory://",
            "--service-token-file", str(service), "--token-file", str(old)),
            stdout=out, stderr=subprocess.STDOUT, env={"PATH": "/bin"})
    try:
        wait_for_port(address)
        with ControlClient(address, token="legacy-admin-token-0123", retry_for=10) as c:
            c.register_pipeline("legacy", source_id="pg", sinks=[("s", "redis", True)])
            assert c.pause("legacy").state == pb.PIPELINE_PAUSED
    finally:
        proc.terminate()
        proc.wait(20)
    assert "--token-file is deprecated; use --admin-token-file" in log.read_text()
