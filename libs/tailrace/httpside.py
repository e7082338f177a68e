"""The HTTP side port every service serves beside its real work.

- `/health`: 200 `ok`, or 503 with `{"status": "unhealthy", "reason": ...}` (a lost source
  position, a failed pipeline); a check may answer a `Health` with another status (the
  delivery service says `degraded` while it restarts without progress);
- `/ready`: 200 `ready` once the service can do its job, 503 before, and while it cannot
  now: with `{"status": "not ready", "reason": ...}` when it can say why (a link that is
  cut, `tailrace.links`);
- `/metrics`: Prometheus text from the default registry.

It runs in a background thread; `start_http_side(0, ...)` picks a free port (`.port`).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from tailrace.logs import get_logger, redact

log = get_logger(__name__)


class ThreadingHTTPServer6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class Health(NamedTuple):
    """What `/health` answers: 200 when `ok`, else 503 with `status` and `reason`."""

    ok: bool
    reason: str
    status: str = "unhealthy"


class HttpSide:
    """A running side port; `stop()` shuts it down."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def start_http_side(port: int, health: Callable[[], tuple[bool, str] | Health],
                    ready: Callable[[], bool | tuple[bool, str]],
                    host: str = "127.0.0.1") -> HttpSide:
    """Serve /health, /ready and /metrics on `host:port` (0 = a free port) in a thread.
    `health` answers `(ok, reason)` or a `Health`; `ready` a bool or `(ready, reason)`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            try:
                if path == "/health":
                    answer = Health(*health())
                    if answer.ok:
                        self._send(200, b"ok\n", "text/plain; charset=utf-8")
                    else:
                        body = json.dumps({"status": answer.status,
                                           "reason": redact(answer.reason)})
                        self._send(503, body.encode() + b"\n", "application/json")
                elif path == "/ready":
                    readiness = ready()
                    is_ready, why = readiness if isinstance(readiness, tuple) \
                        else (readiness, "")
                    if is_ready:
                        self._send(200, b"ready\n", "text/plain; charset=utf-8")
                    elif why:
                        body = json.dumps({"status": "not ready", "reason": redact(why)})
                        self._send(503, body.encode() + b"\n", "application/json")
                    else:
                        self._send(503, b"not ready\n", "text/plain; charset=utf-8")
                elif path == "/metrics":
                    self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
                else:
                    self._send(404, b"not found: try /health, /ready or /metrics\n",
                               "text/plain; charset=utf-8")
            except Exception as e:  # a failing check is unhealthy, never a dead side port
                body = json.dumps({"status": "unhealthy",
                                   "reason": redact(f"{path} check failed: {e}")})
                self._send(503, body.encode() + b"\n", "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # probes every few seconds would flood the log

    server_class = ThreadingHTTPServer
    if ":" in host:  # an IPv6 address such as "::"
        server_class = ThreadingHTTPServer6
    try:
        server = server_class((host, port), Handler)
    except OSError as e:
        raise OSError(f"cannot serve the HTTP side port on {host}:{port}: {e.strerror}; "
                      "choose another --http-port") from None
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="http-side", daemon=True)
    thread.start()
    side = HttpSide(server, thread)
    log.debug("http side port listening", url=side.url)
    return side
