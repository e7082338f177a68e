"""The HTTP side port every service serves beside its real work.

- `/health`: 200 `ok`, or 503 with `{"status": "unhealthy", "reason": ...}` (a lost source
  position, a failed pipeline); a check may answer a `Health` with another status (the
  delivery service says `degraded` while it restarts without progress);
- `/ready`: 200 `ready` once the service can do its job, 503 before, and while it cannot
  now: with `{"status": "not ready", "reason": ...}` when it can say why (a link that is
  cut, `tailrace.links`);
- `/metrics`: Prometheus text from the default registry;
- any other path, and POST/PUT/DELETE, to the service's own `routes` if it gives them (the
  control service's schema registry API), else 404.

It runs in a background thread; `start_http_side(0, ...)` picks a free port (`.port`).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple
from urllib.parse import parse_qsl

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from tailrace.logs import get_logger, redact

log = get_logger(__name__)


class ThreadingHTTPServer6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class Request(NamedTuple):
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes


class Response(NamedTuple):
    status: int
    body: bytes
    content_type: str = "application/json"


Routes = Callable[[Request], Response | None]  # None: not one of its paths


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
                    host: str = "127.0.0.1", routes: Routes | None = None) -> HttpSide:
    """Serve /health, /ready and /metrics on `host:port` (0 = a free port) in a thread.
    `health` answers `(ok, reason)` or a `Health`; `ready` a bool or `(ready, reason)`;
    `routes` answers the rest of the paths it knows."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: registry clients make many small calls

        def _routed(self, method: str) -> bool:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""  # read even if unused: keep-alive
            if routes is None:
                return False
            path, _, query = self.path.partition("?")
            answer = routes(Request(method, path, dict(parse_qsl(query)),
                                    {k.lower(): v for k, v in self.headers.items()}, body))
            if answer is None:
                return False
            self._send(answer.status, answer.body, answer.content_type)
            return True

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self._write("POST")

        def do_PUT(self) -> None:  # noqa: N802 - http.server's name
            self._write("PUT")

        def do_DELETE(self) -> None:  # noqa: N802 - http.server's name
            self._write("DELETE")

        def _write(self, method: str) -> None:
            try:
                if not self._routed(method):
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")
            except Exception as e:
                log.exception("http side request failed", method=method, path=self.path)
                self._send(500, json.dumps({"error_code": 50001, "message": redact(str(e))})
                           .encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            try:
                if path not in ("/health", "/ready", "/metrics") and self._routed("GET"):
                    return
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
