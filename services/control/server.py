"""The gRPC server: control-plane services plus reflection and the standard health service."""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tailrace.proto import control_pb2 as pb
from tailrace.proto import control_pb2_grpc as rpc
from tailrace_services.control.checkpoints import CheckpointsServicer, CheckpointStore
from tailrace_services.control.epochs import EpochsServicer, EpochStore
from tailrace_services.control.storage import Storage


@dataclass
class ControlServer:
    server: grpc.Server
    port: int
    storage: Storage

    def stop(self, grace: float = 1.0) -> None:
        self.server.stop(grace).wait()
        self.storage.close()


def serve(storage: Storage, listen: str = "127.0.0.1:50051", workers: int = 16) -> ControlServer:
    """Start serving on `listen` (port 0 picks a free one) and return at once."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    rpc.add_CheckpointsServicer_to_server(CheckpointsServicer(CheckpointStore(storage)), server)
    rpc.add_EpochsServicer_to_server(EpochsServicer(EpochStore(storage)), server)

    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [pb.DESCRIPTOR.services_by_name[n].full_name for n in ("Checkpoints", "Epochs")]
    for name in [*names, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME],
                                        server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}: address in use or invalid")
    server.start()
    return ControlServer(server=server, port=port, storage=storage)
