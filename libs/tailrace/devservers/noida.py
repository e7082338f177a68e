"""A throwaway Kafka-protocol broker that gets transactions right: noida-db's Kafka.

Tansu (`KafkaBroker`) shows aborted transactions to `read_committed` readers and does
not report a fenced producer as fatal, so exactly-once tests run here instead. The
PyPI package noida-db ships one static binary speaking several protocols; only its
Kafka is started. Its data (a JSON file in the temp dir) survives a graceful stop,
so `restart()` brings the topics back: an outage, not a new cluster.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from typing import ClassVar

from tailrace.devservers._process import DevServerError, wait_for_port, wait_until
from tailrace.devservers.kafka import KafkaProtocolServer

__all__ = ["NoidaKafka", "noida_binary"]

_MISSING = 'the noida-db binary was not found: run "make setup" (pip install noida-db)'


def noida_binary() -> str:
    """Path of the binary inside the noida_db package (its `noida-db` script only wraps it)."""
    spec = importlib.util.find_spec("noida_db")
    if spec is None or spec.origin is None:
        raise DevServerError(_MISSING)
    binary = Path(spec.origin).parent / "noida-db"
    if not binary.is_file():
        raise DevServerError(f"{_MISSING} (looked for {binary})")
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)
    return str(binary)


class NoidaKafka(KafkaProtocolServer):
    """noida-db's Kafka on 127.0.0.1:`port`; `bootstrap` is its address."""

    name: ClassVar[str] = "noida"

    def __init__(self, *, port: int | None = None, startup_timeout: float = 30.0) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.binary = noida_binary()

    def _command(self) -> list[str]:
        assert self.dir is not None
        return [
            self.binary, "start",
            "--data-dir", str(self.dir / "data"),
            "--host", self.host,
            "--only", "kafka",
            "--kafka-port", str(self.port),
        ]  # fmt: skip

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        log, timeout = self.log_path, self.startup_timeout
        wait_for_port(self.port, proc=proc, log_path=log, what="noida kafka", timeout=timeout)

        def metadata() -> None:
            self._admin().list_topics(timeout=2)

        wait_until(metadata, proc=proc, log_path=log, what="noida kafka metadata", timeout=timeout)
