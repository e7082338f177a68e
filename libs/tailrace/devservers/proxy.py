"""A loopback TCP proxy whose plug can be pulled: network outages without root or iptables.

Point a client at `proxy.port` instead of the server. `cut()` drops every open
connection and closes the listening socket, so new connections are refused (not hung);
`restore()` listens again on the same port. `retarget()` sends new connections to
another server, which is how a failover to a different address looks to a client.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from types import TracebackType
from typing import Self

from tailrace.devservers._process import LOOPBACK, free_port

__all__ = ["TcpProxy"]

_CHUNK = 65536


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
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(_CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        # One side ended or failed: end both so the other pump returns as well.
        with self._lock:
            self._conns.discard(src)
            self._conns.discard(dst)
        _close(src)
        _close(dst)

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
