"""Throwaway real servers on loopback, for the test suite and `make run`.

Each server gets a free port and a short temp dir, never the standard ports, so the
machine's own services are left alone. A missing binary raises DevServerError with the
fix; nothing is ever skipped. `stop()` removes everything; `kill()` is SIGKILL for
chaos tests, after which `start()` brings the same server back.
"""

from tailrace.devservers._base import DevServer
from tailrace.devservers._process import DevServerError, free_port
from tailrace.devservers.kafka import KafkaBroker
from tailrace.devservers.mariadb import MariaDBServer
from tailrace.devservers.nats import NatsServer
from tailrace.devservers.postgres import PostgresServer
from tailrace.devservers.proxy import TcpProxy
from tailrace.devservers.redis import RedisServer

__all__ = [
    "DevServer",
    "DevServerError",
    "KafkaBroker",
    "MariaDBServer",
    "NatsServer",
    "PostgresServer",
    "RedisServer",
    "TcpProxy",
    "free_port",
]
