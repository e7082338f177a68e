"""The role table covers every RPC; who may call what; tokens; what the audit log keeps."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from tailrace.proto import control_pb2 as pb
from tailrace_services.control.audit import AuditLog, pipeline_of, summarize
from tailrace_services.control.auth import AuthPolicy, bearer, decide
from tailrace_services.control.roles import (
    ACCESS,
    Access,
    Role,
    RoleTableError,
    audited,
    check_methods,
)
from tailrace_services.control.server import SERVICES
from tailrace_services.control.storage import MemoryStorage
from tailrace_services.control.tokens import MIN_LENGTH, TokenError, Tokens, load_tokens

SERVICE, ADMIN = "s" * 20 + "-service", "a" * 20 + "-admin"


def methods(*files: object) -> set[str]:
    return {f"/{service.full_name}/{m.name}" for f in files
            for service in f.DESCRIPTOR.services_by_name.values() for m in service.methods}


def test_every_rpc_of_the_proto_has_a_role_and_every_entry_an_rpc():
    declared = methods(pb, health_pb2, reflection_pb2)
    check_methods(declared)  # raises naming any RPC without a role
    stale = {m for m in ACCESS if m not in declared and "grpc.reflection.v1." not in m}
    assert not stale, f"roles for RPCs that do not exist: {stale}"
    assert set(SERVICES) == set(pb.DESCRIPTOR.services_by_name), "every service is served"


def test_a_new_rpc_without_a_role_stops_the_start():
    with pytest.raises(RoleTableError, match=r"/tailrace.v1.Admin/Drop.*services/control/roles"):
        check_methods([*ACCESS, "/tailrace.v1.Admin/Drop"])


def test_what_each_role_may_do():
    assert ACCESS["/tailrace.v1.Checkpoints/Commit"] == Access.SERVICE
    assert ACCESS["/tailrace.v1.Commits/ClaimDelivery"] == Access.SERVICE
    assert ACCESS["/tailrace.v1.Identities/Compare"] == Access.SERVICE, "it stores a first identity"
    assert {m.rsplit("/", 1)[1] for m, a in ACCESS.items() if a == Access.ADMIN} == {
        "Pause", "Resume", "Rewind", "Attach", "Replay", "Ack", "Purge", "List", "Request", "Cancel",
        "Resnapshot", "Apply", "Delete"}
    assert ACCESS["/tailrace.v1.Audit/List"] == Access.ADMIN
    assert not audited("/tailrace.v1.Audit/List"), "reading the audit log is not a change"
    assert audited("/tailrace.v1.DeadLetters/Replay") and audited("/tailrace.v1.Epochs/Record")
    assert not audited("/tailrace.v1.Admin/ListPipelines")
    assert {m for m, a in ACCESS.items() if a == Access.OPEN} == {
        "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}


@pytest.fixture
def policy() -> AuthPolicy:
    return AuthPolicy(Tokens.of(SERVICE, ADMIN))


@pytest.mark.parametrize(("method", "token", "code"), [
    ("/tailrace.v1.Admin/Pause", None, grpc.StatusCode.UNAUTHENTICATED),
    ("/tailrace.v1.Admin/Pause", "nope", grpc.StatusCode.UNAUTHENTICATED),
    ("/tailrace.v1.Admin/Pause", SERVICE, grpc.StatusCode.PERMISSION_DENIED),
    ("/tailrace.v1.Admin/Pause", ADMIN, None),
    ("/tailrace.v1.Checkpoints/Commit", None, grpc.StatusCode.UNAUTHENTICATED),
    ("/tailrace.v1.Checkpoints/Commit", SERVICE, None),
    ("/tailrace.v1.Checkpoints/Commit", ADMIN, None),
    ("/tailrace.v1.Admin/ListPipelines", None, grpc.StatusCode.UNAUTHENTICATED),
    ("/tailrace.v1.Admin/ListPipelines", SERVICE, None),
    ("/grpc.health.v1.Health/Check", None, None),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", None,
     grpc.StatusCode.UNAUTHENTICATED),
    ("/tailrace.v1.Admin/Unknown", ADMIN, grpc.StatusCode.PERMISSION_DENIED),
])
def test_decide(policy, method, token, code):
    role, refused = decide(policy, method, token)
    assert (refused.code if refused else None) == code
    if token == ADMIN and refused is None:
        assert role == Role.ADMIN


def test_messages_say_which_token_and_where_it_comes_from(policy):
    _, refused = decide(policy, "/tailrace.v1.Admin/Pause", None)
    assert "Admin/Pause needs the admin token" in refused.message
    assert "--token-file" in refused.message and "TAILRACE_ADMIN_TOKEN" in refused.message
    _, refused = decide(policy, "/tailrace.v1.Admin/Pause", SERVICE)
    assert "needs the admin role and the service token was sent" in refused.message
    _, refused = decide(policy, "/tailrace.v1.Epochs/Record", None)
    assert "control.token_file" in refused.message and "TAILRACE_SERVICE_TOKEN" in refused.message
    _, refused = decide(policy, "/tailrace.v1.Admin/GetPipeline", "wrong")
    assert "not valid for this control service" in refused.message
    assert "--open-reads" in refused.message
    assert SERVICE not in refused.message and ADMIN not in refused.message


def test_open_reads_and_no_auth():
    open_reads = AuthPolicy(Tokens.of(SERVICE, ADMIN), open_reads=True)
    assert decide(open_reads, "/tailrace.v1.Admin/ListPipelines", None)[1] is None
    assert decide(open_reads, "/tailrace.v1.Admin/Pause", None)[1].code == \
        grpc.StatusCode.UNAUTHENTICATED, "changes still need a token"
    assert decide(open_reads, "/tailrace.v1.Audit/List", SERVICE)[1].code == \
        grpc.StatusCode.PERMISSION_DENIED, "the audit log is for admins"
    insecure = AuthPolicy(tokens=None)
    assert decide(insecure, "/tailrace.v1.Admin/Rewind", None) == (None, None)


def test_bearer():
    assert bearer((("authorization", "Bearer abc"),)) == "abc"
    assert bearer((("authorization", "bearer  abc "),)) == "abc"
    assert bearer((("authorization", "Basic abc"),)) == ""
    assert bearer((("x", "y"),)) is None and bearer(None) is None


def test_tokens(tmp_path, monkeypatch):
    service, admin = tmp_path / "service", tmp_path / "admin"
    service.write_text(SERVICE + "\nignored\n")
    admin.write_text(ADMIN + "\n")
    tokens = load_tokens(str(service), str(admin), None, env={})
    assert tokens is not None
    assert (tokens.role_of(SERVICE), tokens.role_of(ADMIN), tokens.role_of("x"),
            tokens.role_of(None)) == (Role.SERVICE, Role.ADMIN, None, None)
    assert SERVICE not in repr(tokens)
    env = {"TAILRACE_SERVICE_TOKEN": SERVICE, "TAILRACE_ADMIN_TOKEN": ADMIN}
    assert load_tokens(None, None, None, env=env) == tokens
    assert load_tokens(None, None, None, env={}) is None, "none at all: the caller decides"
    legacy = load_tokens(None, None, str(admin), env={"TAILRACE_SERVICE_TOKEN": SERVICE})
    assert legacy == tokens, "--token-file is the admin token"
    assert load_tokens(None, None, None, env={"TAILRACE_SERVICE_TOKEN": SERVICE,
                                              "TAILRACE_CONTROL_TOKEN": ADMIN}) == tokens
    with pytest.raises(TokenError, match="no service token"):
        load_tokens(None, str(admin), None, env={})
    with pytest.raises(TokenError, match="no admin token"):
        load_tokens(str(service), None, None, env={})
    with pytest.raises(TokenError, match="are the same"):
        Tokens.of(SERVICE, SERVICE)
    with pytest.raises(TokenError, match=f"at least {MIN_LENGTH}"):
        Tokens.of("short", ADMIN)
    with pytest.raises(TokenError, match="cannot read --service-token-file .*/missing"):
        load_tokens(str(tmp_path / "missing"), str(admin), None, env={})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(TokenError, match="is empty"):
        load_tokens(str(tmp_path / "empty"), str(admin), None, env={})
    with pytest.raises(TokenError, match="keep --admin-token-file"):
        load_tokens(str(service), str(admin), str(admin), env={})


def test_summary_names_what_and_leaves_out_row_data_and_secrets():
    cp = pb.Checkpoint(pipeline="orders", source_id="pg1", sink_id="main")
    cp.position.tx_seq = 42
    cp.bus_offsets[0] = 300
    request = pb.CommitCheckpointRequest(checkpoint=cp, expected_version=3)
    assert summarize(request) == ("checkpoint={pipeline=orders source_id=pg1 sink_id=main "
                                  "position={tx_seq=42} bus_offsets={0:300}} expected_version=3")
    assert pipeline_of(request) == "orders"
    dlq = pb.AppendDeadLettersRequest(pipeline="orders", entries=[pb.DeadLetterInput(
        sink_id="s", reason="r", event=b"card 4111-1111")], overflow=pb.OVERFLOW_REJECT)
    assert summarize(dlq) == "pipeline=orders entries=1 overflow=OVERFLOW_REJECT"
    report = pb.HealthReport(subject_id="orders", state=pb.HEALTH_FAILED,
                             reason="cannot connect postgresql://u:hunter2@db/x")
    text = summarize(report)
    assert "hunter2" not in text and "state=HEALTH_FAILED" in text
    batch = pb.ReportBatchRequest(pipeline="orders", sinks=[
        pb.SinkOutcome(sink_id="a", acknowledged=True), pb.SinkOutcome(sink_id="b")])
    assert "sinks=[a,b]" in summarize(batch)
    assert pipeline_of(pb.PauseRequest(name="orders", reason="x")) == "orders"
    assert len(summarize(pb.PauseRequest(name="o", reason="x" * 5000))) <= 400


def test_audit_log_keeps_the_newest_per_role():
    log = AuditLog(MemoryStorage(), keep=20)
    log.append(pb.AuditRecord(method="Admin/Pause", role="admin", pipeline="orders"))
    for i in range(100):
        log.append(pb.AuditRecord(method="Epochs/Record", role="service", summary=f"epoch {i}",
                                  ts_unix_ms=10**13 + i))
    service = log.list(role="service", limit=1000)
    assert 20 <= len(service) <= 22
    assert service[-1].summary == "epoch 99", "the newest are kept"
    assert [r.method for r in log.list(role="admin")] == ["Admin/Pause"], \
        "service calls never push an operator's action out"
    assert [r.method for r in log.list(pipeline="orders")] == ["Admin/Pause"]
    assert len(log.list(limit=5)) == 5
    with pytest.raises(Exception, match="audit role 'root' is unknown"):
        log.list(role="root")
    with pytest.raises(ValueError, match="at least 1"):
        AuditLog(MemoryStorage(), keep=0)


def test_audit_records_of_two_roles_in_one_millisecond_list_in_the_order_accepted():
    """The roles' logs are merged for a listing: within one millisecond the nanoseconds
    (not the role's name) order them (`admin` < `service` put a Pause before the
    RegisterPipeline it followed)."""
    log = AuditLog(MemoryStorage())
    log.append(pb.AuditRecord(method="Admin/RegisterPipeline", role="service",
                              pipeline="orders", ts_unix_ms=10**12))
    log.append(pb.AuditRecord(method="Admin/Pause", role="admin", pipeline="orders",
                              ts_unix_ms=10**12))
    assert [r.method for r in log.list(pipeline="orders")] == ["Admin/RegisterPipeline",
                                                                "Admin/Pause"]
