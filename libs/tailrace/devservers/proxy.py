"""A loopback TCP proxy whose plug can be pulled: network outages without root or iptables.

Point a client at `proxy.port` instead of the server. `cut()` drops every open
connection and closes the listening socket, so new connections are refused (not hung);
`restore()` listens again on the same port. `retarget()` sends new connections to
another server, which is how a failover to a different address looks to a client.

Two finer faults, for what a client cannot tell from a cut:
- `lose_reply_to(pattern)`: the next time a client sends `pattern` (Redis's `EXEC`,
  PostgreSQL's `COMMIT`), the request reaches the server but its reply is dropped and the
  connection closed: the client cannot know whether its transaction committed;
- `slow(delay_s, bytes_per_s)`: every chunk waits `delay_s` and is sent at most
  `bytes_per_s` (a slow, thin link); `slow()` undoes it.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from types import TracebackType
from typing import Self

from tailrace.devservers._process import LOOPBACK, free_port

__all__ = ["TcpProxy"]

_CHUNK = 65536
_TRICKLE = 1024  # bytes sent at a time on a slow link


class _Pair:
    """One proxied connection: whether the server's next reply is to be lost."""

    def __init__(self) -> None:
        self.lose_reply = False
        self.tail = b""  # the client's last bytes, for a pattern split across chunks


class TcpProxy:
    """Forward 127.0.0.1:`port` to `target_host:target_port`, one thread per direction."""

    def __init__(self, target_port: int, target_host: str = LOOPBACK, port: int | None = None):
        self.host = LOOPBACK
        self.port = port if port is not None else free_port()
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._acceptor: threading.Thread | None = None
        self._lose_reply_to: bytes | None = None
        self.replies_lost = 0
        self.delay_s = 0.0
        self.bytes_per_s = 0

    @property
    def cut_off(self) -> bool:
        return self._listener is None

    def start(self) -> Self:
        """Listen and forward; a no-op when already listening."""
        with self._lock:
            if self._listener is not None:
                return self
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.port))
            listener.listen(64)
            self._listener = listener
            self._wake = socket.socketpair()
            self._acceptor = threading.Thread(
                target=self._accept_loop,
                args=(listener, self._wake[0]),
                name=f"tcp-proxy-{self.port}",
                daemon=True,
            )
            self._acceptor.start()
        return self

    def cut(self) -> None:
        """Drop all connections and refuse new ones until `restore()`."""
        with self._lock:
            listener, wake, acceptor = self._listener, self._wake, self._acceptor
            self._listener = self._wake = self._acceptor = None
            conns, self._conns = self._conns, set()
        if wake is not None:
            wake[1].send(b"x")
        if acceptor is not None:
            acceptor.join(timeout=5)
        for sock in [*([listener] if listener else []), *(wake or ()), *conns]:
            _close(sock)

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        self.start()

    def retarget(self, port: int, host: str = LOOPBACK) -> None:
        """Send new connections to `host:port`; open ones stay where they are."""
        self.target = (host, port)

    def lose_reply_to(self, pattern: bytes) -> None:
        """Arm once: the next request holding `pattern` is forwarded, the reply to it
        dropped and the connection closed (`replies_lost` counts them)."""
        self._lose_reply_to = pattern

    def slow(self, delay_s: float = 0.0, bytes_per_s: int = 0) -> None:
        """Delay every chunk in both directions and cap its rate; no arguments: full speed."""
        self.delay_s, self.bytes_per_s = delay_s, bytes_per_s

    def close(self) -> None:
        self.cut()

    def _accept_loop(self, listener: socket.socket, wake: socket.socket) -> None:
        while True:
            ready, _, _ = select.select([listener, wake], [], [])
            if wake in ready:
                return
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)  # the target is down: the client sees its connection closed
                continue
            with self._lock:
                if self._listener is not listener:  # cut() ran meanwhile
                    _close(client)
                    _close(upstream)
                    return
                self._conns.update((client, upstream))
            pair = _Pair()
            for src, dst, upwards in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, pair, upwards),
                                 daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: _Pair, upwards: bool) -> None:
        try:
            while data := src.recv(_CHUNK):
                if not upwards and pair.lose_reply:
                    self.replies_lost += 1
                    break  # the reply is dropped: both ends closed below
                pattern = self._lose_reply_to
                if upwards and pattern is not None:  # armed before the server can answer
                    if pattern in pair.tail + data:
                        self._lose_reply_to = None
                        pair.lose_reply = True
                    pair.tail = (pair.tail + data)[-len(pattern):]
                self._send(dst, data)
        except OSError:
            pass
        # One side ended or failed: end both so the other pump returns as well.
        with self._lock:
            self._conns.discard(src)
            self._conns.discard(dst)
        _close(src)
        _close(dst)

    def _send(self, dst: socket.socket, data: bytes) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        if not self.bytes_per_s:
            dst.sendall(data)
            return
        for start in range(0, len(data), _TRICKLE):
            dst.sendall(data[start:start + _TRICKLE])
            time.sleep(min(_TRICKLE, len(data) - start) / self.bytes_per_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "cut" if self.cut_off else "open"
        return f"<TcpProxy {self.host}:{self.port} -> {self.target[0]}:{self.target[1]} {state}>"


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
