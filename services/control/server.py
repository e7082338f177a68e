"""The gRPC server: control-plane services plus reflection and the standard health service.

Interceptors, outermost first: the admin token (when configured), then the mapping of
refusals and storage errors to gRPC status.
"""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.admin import AdminServicer
from tailrace_services.control.auth import TokenInterceptor
from tailrace_services.control.checkpoints import CheckpointsServicer, CheckpointStore
from tailrace_services.control.commits import CommitService, CommitsServicer
from tailrace_services.control.dlq import DeadLettersServicer, DeadLetterStore
from tailrace_services.control.epochs import EpochsServicer, EpochStore
from tailrace_services.control.health import HealthStore
from tailrace_services.control.identities import IdentitiesServicer, IdentityStore
from tailrace_services.control.owners import DeliveryOwners
from tailrace_services.control.pipelines import PipelineRegistry
from tailrace_services.control.schemas import SchemaRegistry, SchemasServicer
from tailrace_services.control.status import RefusalInterceptor
from tailrace_services.control.storage import Storage

SERVICES = ("Checkpoints", "Epochs", "Commits", "Schemas", "Identities", "DeadLetters", "Admin")


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
          token: str | None = None, tls: tuple[bytes, bytes] | None = None) -> ControlServer:
    """Start serving on `listen` (port 0 picks a free one) and return at once.

    `token`: admin mutations need `authorization: Bearer <token>`. `tls`: (certificate chain
    PEM, private key PEM) to serve TLS instead of plaintext.
    """
    interceptors: list[grpc.ServerInterceptor] = [RefusalInterceptor()]
    if token:
        interceptors.insert(0, TokenInterceptor(token))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         interceptors=interceptors)
    checkpoints = CheckpointStore(storage)
    epochs = EpochStore(storage)
    health_store = HealthStore(storage)
    rpc.add_CheckpointsServicer_to_server(CheckpointsServicer(checkpoints), server)
    rpc.add_EpochsServicer_to_server(EpochsServicer(epochs), server)
    rpc.add_CommitsServicer_to_server(CommitsServicer(
        CommitService(checkpoints, DeliveryOwners(storage))), server)
    rpc.add_SchemasServicer_to_server(SchemasServicer(SchemaRegistry(storage)), server)
    rpc.add_IdentitiesServicer_to_server(
        IdentitiesServicer(IdentityStore(storage), health_store), server)
    rpc.add_DeadLettersServicer_to_server(DeadLettersServicer(DeadLetterStore(storage)), server)
    rpc.add_AdminServicer_to_server(
        AdminServicer(PipelineRegistry(storage, health_store), checkpoints, epochs), server)

    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [pb.DESCRIPTOR.services_by_name[n].full_name for n in SERVICES]
    for name in [*names, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME],
                                        server)
    try:
        if tls is not None:
            port = server.add_secure_port(listen, grpc.ssl_server_credentials([(tls[1], tls[0])]))
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {listen}: address in use or invalid")
    server.start()
    return ControlServer(server=server, port=port, storage=storage, health=health_store)
