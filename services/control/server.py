"""The gRPC server: control-plane services plus reflection and the standard health service.

Interceptors, outermost first: roles and audit (`auth.py`), then the mapping of refusals
and storage errors to gRPC status. Every method registered here must have a role in
`roles.ACCESS`, or `serve` refuses to start.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tailrace.logs import get_logger
from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.admin import AdminServicer
from tailrace_services.control.audit import DEFAULT_KEEP, AuditLog, AuditServicer
from tailrace_services.control.auth import AuthInterceptor, AuthPolicy
from tailrace_services.control.checkpoints import CheckpointsServicer, CheckpointStore
from tailrace_services.control.commits import CommitService, CommitsServicer
from tailrace_services.control.dlq import DeadLettersServicer, DeadLetterStore
from tailrace_services.control.epochs import EpochsServicer, EpochStore
from tailrace_services.control.health import HealthStore
from tailrace_services.control.identities import IdentitiesServicer, IdentityStore
from tailrace_services.control.leases import LeasesServicer, LeaseStore
from tailrace_services.control.owners import DeliveryOwners
from tailrace_services.control.pipelines import PipelineRegistry
from tailrace_services.control.retention import RetentionGuard
from tailrace_services.control.roles import RoleTableError, check_methods
from tailrace_services.control.schemas import SchemaRegistry, SchemasServicer
from tailrace_services.control.sink_start import SinkStarts
from tailrace_services.control.snapshots import SnapshotService, SnapshotsServicer, SnapshotStore
from tailrace_services.control.specs import SpecsServicer, SpecStore
from tailrace_services.control.status import RefusalInterceptor
from tailrace_services.control.storage import Storage

SERVICES = ("Checkpoints", "Epochs", "Commits", "Schemas", "Identities", "DeadLetters", "Admin",
            "Audit", "Snapshots", "Leases", "Specs")
log = get_logger(__name__)


@dataclass(frozen=True)
class ServerTls:
    """PEM bytes: the server's certificate chain and key; with `client_ca`, clients must
    present a certificate signed by it (mutual TLS)."""

    cert_chain: bytes
    key: bytes
    client_ca: bytes | None = None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert_chain)],
                                           root_certificates=self.client_ca,
                                           require_client_auth=self.client_ca is not None)


class _Registrations:
    """Stands in for the server while services are added, noting every method they register
    (through gRPC's public registration calls) for the role-table check."""

    def __init__(self, server: grpc.Server) -> None:
        self._server = server
        self.methods: set[str] = set()
        self.services: set[str] = set()
        self.generic: set[str] = set()

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.services.add(service)
        self.methods.update(f"/{service}/{name}" for name in handlers)
        self._server.add_registered_method_handlers(service, handlers)

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.generic.update(str(h.service_name()) for h in handlers
                            if hasattr(h, "service_name"))
        self._server.add_generic_rpc_handlers(handlers)

    def check(self) -> None:
        unlisted = sorted(self.generic - self.services)
        if unlisted:
            raise RoleTableError(f"cannot list the methods of service(s) {', '.join(unlisted)} "
                                 "to check their roles; register them with generated code")
        check_methods(self.methods)


@dataclass
class ControlServer:
    server: grpc.Server
    port: int
    storage: Storage
    health: HealthStore

    def check(self) -> tuple[bool, str]:
        """For `/health`: unhealthy while a source lost its position or a pipeline failed, or
        while the storage cannot be read."""
        try:
            return self.health.check()
        except Exception as e:
            return False, f"control storage unavailable: {e}"

    def ready(self) -> bool:
        """For `/ready`: serving and the storage answers."""
        try:
            self.storage.kv_get("ready::probe")
        except Exception:
            return False
        return True

    def stop(self, grace: float = 1.0) -> None:
        self.server.stop(grace).wait()
        self.storage.close()


def serve(storage: Storage, listen: str = "127.0.0.1:50051", workers: int = 16,
          auth: AuthPolicy | None = None, tls: ServerTls | None = None,
          audit_keep: int = DEFAULT_KEEP) -> ControlServer:
    """Start serving on `listen` (port 0 picks a free one) and return at once.

    `auth`: the tokens and whether reads are open; None serves without authentication (an
    in-process server of a test; `tailrace-control` refuses that unless told
    `--insecure-no-auth`). `tls`: serve TLS, optionally mutual. Raises `RoleTableError`
    when a registered method has no role.
    """
    audit = AuditLog(storage, audit_keep)
    policy = auth if auth is not None else AuthPolicy(tokens=None)
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                              interceptors=[AuthInterceptor(policy, audit), RefusalInterceptor()])
    server: Any = _Registrations(grpc_server)
    checkpoints = CheckpointStore(storage)
    epochs = EpochStore(storage)
    health_store = HealthStore(storage)
    rpc.add_CheckpointsServicer_to_server(CheckpointsServicer(checkpoints), server)
    rpc.add_EpochsServicer_to_server(EpochsServicer(epochs), server)
    rpc.add_CommitsServicer_to_server(CommitsServicer(
        CommitService(checkpoints, DeliveryOwners(storage))), server)
    rpc.add_SchemasServicer_to_server(SchemasServicer(SchemaRegistry(storage)), server)
    identities = IdentityStore(storage)
    pipelines = PipelineRegistry(storage, health_store)
    rpc.add_IdentitiesServicer_to_server(IdentitiesServicer(
        identities, health_store, RetentionGuard(pipelines, checkpoints, identities).judge),
        server)
    rpc.add_DeadLettersServicer_to_server(DeadLettersServicer(DeadLetterStore(storage)), server)
    snapshots = SnapshotService(SnapshotStore(storage), PipelineRegistry(storage, health_store))
    starts = SinkStarts(storage, checkpoints, epochs, snapshots)
    rpc.add_AdminServicer_to_server(AdminServicer(pipelines, checkpoints, epochs, starts),
                                    server)
    rpc.add_AuditServicer_to_server(AuditServicer(audit), server)
    rpc.add_LeasesServicer_to_server(LeasesServicer(LeaseStore(storage)), server)
    rpc.add_SnapshotsServicer_to_server(SnapshotsServicer(snapshots), server)
    rpc.add_SpecsServicer_to_server(SpecsServicer(SpecStore(storage), storage.now_ms), server)

    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [pb.DESCRIPTOR.services_by_name[n].full_name for n in SERVICES]
    for name in [*names, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME],
                                        server)
    server.check()
    try:
        if tls is not None:
            port = grpc_server.add_secure_port(listen, tls.credentials())
        else:
            port = grpc_server.add_insecure_port(listen)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {listen}: address in use or invalid")
    grpc_server.start()
    if policy.tokens is None:
        log.warning("control serves without authentication: every call is allowed")
    return ControlServer(server=grpc_server, port=port, storage=storage, health=health_store)
