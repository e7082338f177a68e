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
  `bytes_per_s` (a slow, thin link); `slow()` undoes it;
- `cut_before(match)`: the link is cut at the first request `match` finds: what comes
  before the match is forwarded, the rest never reaches the server, so a client is cut in
  the middle of what it was doing (between a Kafka transaction's produce and its
  `EndTxn`, between Redis's `MULTI` and `EXEC`);
- `cut(clients=...)`: only the connections of some processes are cut (delivery's from the
  bus while capture's go on), found by who owns the client end of each connection.

`kafka=True` reads both directions as Kafka frames (a size, then that many bytes) and
rewrites the target's address in the server's answers (Metadata, FindCoordinator) to the
proxy's, so a broker that advertises only where it listens is reached through the proxy
too; `match` then sees whole requests (`kafka_request(api_key)`).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

from tailrace.devservers._process import LOOPBACK, free_port

__all__ = ["TcpProxy", "before_bytes", "kafka_request"]

_CHUNK = 65536
_TRICKLE = 1024  # bytes sent at a time on a slow link


Match = Callable[[bytes], int | None]  # where in the data to cut; None: not here
Clients = Callable[[], Iterable[int]]


def kafka_request(api_key: int) -> Match:
    """A `cut_before` match for a Kafka request frame of `api_key` (26: EndTxn, 0: Produce):
    the frame is not forwarded."""
    key = struct.pack(">h", api_key)
    return lambda frame: 0 if frame[4:6] == key else None


def before_bytes(pattern: bytes) -> Match:
    """A `cut_before` match for `pattern` in what a client sends: the bytes before it are
    forwarded (within one read; a pattern split across reads is not found)."""
    return lambda chunk: at if (at := chunk.find(pattern)) >= 0 else None


class _Pair:
    """One proxied connection: whether the server's next reply is to be lost, and the
    client's port (who the connection belongs to)."""

    def __init__(self, client: socket.socket, upstream: socket.socket, client_port: int) -> None:
        self.client, self.upstream, self.client_port = client, upstream, client_port
        self.lose_reply = False
        self.tail = b""  # the client's last bytes, for a pattern split across chunks


class TcpProxy:
    """Forward 127.0.0.1:`port` to `target_host:target_port`, one thread per direction."""

    def __init__(self, target_port: int, target_host: str = LOOPBACK, port: int | None = None,
                 *, kafka: bool = False):
        self.host = LOOPBACK
        self.port = port if port is not None else free_port()
        self.target = (target_host, target_port)
        self.kafka = kafka
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._pairs: set[_Pair] = set()
        self._cut_clients: Clients | None = None
        self._cut_before: Match | None = None
        self.cuts_made = threading.Event()  # set when a `cut_before` match cut the link
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

    def cut(self, clients: Clients | None = None) -> None:
        """Drop all connections and refuse new ones until `restore()`. `clients`: only
        those of these processes (pids, asked again at each new connection); the others
        go on."""
        if clients is not None:
            self._cut_clients = clients
            with self._lock:
                pairs = list(self._pairs)
            owned = _ports_of(clients(), self.port)
            for pair in pairs:
                if pair.client_port in owned:
                    self._drop(pair)
            return
        with self._lock:
            listener, wake, acceptor = self._listener, self._wake, self._acceptor
            self._listener = self._wake = self._acceptor = None
            conns, self._conns = self._conns, set()
            self._pairs = set()
        if wake is not None:
            wake[1].send(b"x")
        if acceptor is not None:
            acceptor.join(timeout=5)
        for sock in [*([listener] if listener else []), *(wake or ()), *conns]:
            _close(sock)

    def restore(self) -> None:
        """Accept connections again, on the same port (every client's)."""
        self._cut_clients = None
        self.start()

    def cut_before(self, match: Match) -> None:
        """Arm once: at the first client request `match` finds (in a chunk as read, a whole
        frame with `kafka=True`), what precedes the match is forwarded, the rest dropped,
        and the whole link cut, as `cut()` does; `cuts_made` is set then. `restore()`
        brings it back."""
        self.cuts_made.clear()
        self._cut_before = match

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
                client, (_, client_port) = listener.accept()
            except OSError:
                return
            if self._refused(client_port):
                _close(client)  # this process is cut off; the others are not
                continue
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
                if self._refused(client_port):  # cut(clients=) ran while connecting
                    _close(client)
                    _close(upstream)
                    continue
                self._conns.update((client, upstream))
                pair = _Pair(client, upstream, client_port)
                self._pairs.add(pair)
            for src, dst, upwards in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, pair, upwards),
                                 daemon=True).start()

    def _refused(self, client_port: int) -> bool:
        """Whether a process cut off by `cut(clients=)` owns this connection's client end;
        a process that cannot be looked at (gone) owns nothing."""
        clients = self._cut_clients
        if clients is None:
            return False
        try:
            return client_port in _ports_of(clients(), self.port)
        except Exception:  # noqa: BLE001 - the accept loop must go on whatever the lookup does
            return False

    def _drop(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)
            self._conns.difference_update((pair.client, pair.upstream))
        _close(pair.client)
        _close(pair.upstream)

    def _pump(self, src: socket.socket, dst: socket.socket, pair: _Pair, upwards: bool) -> None:
        advertised = struct.pack(">i", self.target[1])
        ours = struct.pack(">i", self.port)
        try:
            for data in (_frames(src) if self.kafka else iter(lambda: src.recv(_CHUNK), b"")):
                if upwards and self._cut_before is not None and \
                        (at := self._matches(data)) is not None:
                    if at:
                        self._send(dst, data[:at])
                    threading.Thread(target=self._cut_now, daemon=True).start()
                    break
                if self.kafka and not upwards:  # the broker's own address -> ours
                    data = data.replace(self.target[0].encode() + advertised,
                                        self.target[0].encode() + ours)
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
        self._drop(pair)

    def _matches(self, data: bytes) -> int | None:
        """Where the armed `cut_before` match cuts `data` (then disarmed: once only)."""
        with self._lock:
            match = self._cut_before
            at = None if match is None else match(data)
            if at is not None:
                self._cut_before = None
            return at

    def _cut_now(self) -> None:
        self.cut()
        self.cuts_made.set()

    def _send(self, dst: socket.socket, data: bytes) -> None:
        # read once: `slow()` may undo the rate while a chunk trickles (a rate of 0 read
        # again here killed the pump with ZeroDivisionError, and its connection hung)
        delay_s, bytes_per_s = self.delay_s, self.bytes_per_s
        if delay_s:
            time.sleep(delay_s)
        if not bytes_per_s:
            dst.sendall(data)
            return
        for start in range(0, len(data), _TRICKLE):
            dst.sendall(data[start:start + _TRICKLE])
            time.sleep(min(_TRICKLE, len(data) - start) / bytes_per_s)

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


def _frames(sock: socket.socket) -> Iterator[bytes]:
    """Kafka frames (a big-endian int32 size, then the frame), each whole, size included."""
    buf = b""
    while True:
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            data = sock.recv(_CHUNK)
            if not data:
                return
            buf += data
        end = 4 + struct.unpack(">i", buf[:4])[0]
        yield buf[:end]
        buf = buf[end:]


def _ports_of(pids: Iterable[int], server_port: int) -> set[int]:
    """The local ports of these processes' TCP connections to 127.0.0.1:`server_port`."""
    inodes: dict[str, int] = {}  # socket inode -> its local port
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if remote == f"0100007F:{server_port:04X}":  # 127.0.0.1, as /proc writes it
            inodes[f"socket:[{inode}]"] = int(local.rsplit(":", 1)[1], 16)
    ports: set[int] = set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    port = inodes.get(os.readlink(f"{fd_dir}/{fd}"))
                    if port is not None:
                        ports.add(port)
    return ports
