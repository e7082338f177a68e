"""NATS JetStream sink (nats-py): publish with `Nats-Msg-Id`, wait for every ack.

The server drops a message whose `Nats-Msg-Id` it stored within the stream's
`duplicate_window`; the id is the event's idempotency key, identical across replays,
so a batch re-sent inside the window is stored once. Beyond the window a replay
stores duplicates: size the window above the longest outage plus restart you want
covered (docs/guarantees.md). At `open()` the stream is created if missing, and
its window raised to `duplicate_window_s` if it is shorter.

nats-py is asyncio; the sink runs a private event loop in a thread and calls it
from the runtime's (synchronous) thread. A batch is published in order on one
connection (`publish_async`), then all acks are awaited; a lost connection or a
missing ack fails the batch (retryable) and the next write reconnects.

Security: the URL's user and password (`nats://user:pw@host`), `tls://` for TLS with the
system's CAs, `tls: {ca, cert, key}` for a CA of one's own and a client certificate, and
`credentials` for a .creds file (JWT and NKey seed).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck, StreamConfig

from tailrace.config import NatsSinkSpec
from tailrace.envelopes import Encoder
from tailrace.errors import ConfigError, NonRetryableError, RetryableError, TailraceError
from tailrace.events import ChangeEvent
from tailrace.logs import get_logger, redact
from tailrace_services.delivery.sinks._common import destination
from tailrace_services.delivery.sinks.base import (
    BatchCommit,
    PerEventError,
    RetryPolicy,
    Sink,
    error_class,
)

log = get_logger(__name__)
T = TypeVar("T")

_AUTH = (nats.errors.AuthorizationError, nats.errors.InvalidUserCredentialsError)
_RETRYABLE = (nats.errors.TimeoutError, nats.errors.ConnectionClosedError,
              nats.errors.NoServersError, nats.errors.StaleConnectionError,
              nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError,
              nats.js.errors.ServiceUnavailableError, nats.js.errors.ServerError,
              nats.js.errors.TooManyStalledMsgsError, ConnectionError, OSError,
              asyncio.TimeoutError)


def classify_nats(error: BaseException) -> type[TailraceError]:
    """Auth, no responders (no stream for the subject), bad requests: fail now; transport: retry."""
    if isinstance(error, _AUTH) or "authorization violation" in str(error).lower():
        return NonRetryableError
    if isinstance(error, nats.js.errors.NoStreamResponseError | nats.errors.NoRespondersError
                  | nats.errors.MaxPayloadError | nats.js.errors.BadRequestError):
        return NonRetryableError
    if isinstance(error, _RETRYABLE):
        return RetryableError
    return error_class(error)


def connect_security(spec: NatsSinkSpec) -> dict[str, Any]:
    """nats.connect's `tls` (an SSL context from `spec.tls`) and `user_credentials`. The files
    are read where the sink runs (an executor); one that cannot be read is a ConfigError
    naming the setting."""
    out: dict[str, Any] = {}
    if spec.tls is not None:
        try:
            context = ssl.create_default_context(cafile=spec.tls.ca)
            if spec.tls.cert:
                context.load_cert_chain(spec.tls.cert, spec.tls.key)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"nats sink {spec.id}: spec.sinks[].tls: {e}; fix the paths of "
                              "ca, cert and key (PEM files)") from None
        out["tls"] = context
    if spec.credentials:
        if not os.access(spec.credentials, os.R_OK):
            raise ConfigError(f"nats sink {spec.id}: spec.sinks[].credentials: cannot read "
                              f"{spec.credentials}")
        out["user_credentials"] = spec.credentials
    return out


def subject_filter(template: str) -> str:
    """The stream subject that covers a subject template: `cdc.{database}.{table}` -> `cdc.*.>`."""
    tokens = template.split(".")
    out = ["*" if "{" in t else t for t in tokens]
    if "{" in tokens[-1]:
        out[-1] = ">"
    return ".".join(out)


_MIN_RATE = 2_000  # bytes/s a publish is given at least, beyond the timeout

class NatsSink(Sink):
    retry = RetryPolicy(base_s=0.05, max_s=5.0, attempts=3)

    def __init__(self, spec: NatsSinkSpec, *, pipeline: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.id = spec.id
        self.required = spec.required
        self._spec = spec
        self._timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._stream_checked = False
        self.duplicates_dropped = 0  # acks the server marked duplicate, since start

    # -- the private event loop -----------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                            name=f"nats-sink-{self.id}")
            self._thread.start()
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    # -- lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        if self._nc is not None and self._nc.is_connected:
            return
        self._drop_connection()
        try:
            self._run(self._connect(), self._timeout_s + 5)
        except Exception as e:
            self._drop_connection()
            raise self._error("cannot connect", e) from None

    async def _connect(self) -> None:
        async def on_error(e: Exception) -> None:
            log.debug("nats client error", sink=self.id, error=redact(str(e)))

        self._nc = await nats.connect(
            self._spec.url.get_secret_value(), name=f"tailrace-sink-{self.id}",
            connect_timeout=max(int(self._timeout_s), 1), allow_reconnect=False,
            # two attempts, then NoServersError (0 would mean "forever" to nats-py);
            # the runtime's retry policy does the waiting
            max_reconnect_attempts=1, reconnect_time_wait=0.1, error_cb=on_error,
            **connect_security(self._spec))
        self._js = self._nc.jetstream(timeout=self._timeout_s)
        if not self._stream_checked:
            await self._ensure_stream(self._js)
            self._stream_checked = True

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        name, window = self._spec.stream, self._spec.duplicate_window_s
        try:
            info = await js.stream_info(name)
        except nats.js.errors.NotFoundError:
            subjects = [subject_filter(self._spec.subject)]
            await js.add_stream(name=name, subjects=subjects, duplicate_window=window)
            log.info("stream created", sink=self.id, stream=name, subjects=subjects,
                     duplicate_window_s=window)
            return
        config: StreamConfig = info.config
        if (config.duplicate_window or 0) < window:
            log.warning("stream duplicate window raised", sink=self.id, stream=name,
                        was_s=config.duplicate_window, now_s=window)
            config.duplicate_window = window
            await js.update_stream(config)

    def close(self) -> None:
        self._drop_connection()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._loop.close()
            self._loop = self._thread = None

    def _drop_connection(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            try:
                self._run(nc.close(), 5)
            except Exception as e:  # closing a broken connection may fail; it is gone either way
                log.debug("nats close failed", sink=self.id, error=redact(str(e)))

    # -- writing -----------------------------------------------------------------------

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        self.open()
        assert self._nc is not None
        messages = self._messages(events, self._nc.max_payload)
        try:  # _publish times out when acks stop coming; this bounds a stalled publish
            acks = self._run(self._publish(messages),
                             self._timeout_s + 5 + sum(len(m[1]) for m in messages) / _MIN_RATE)
        except Exception as e:
            self._drop_connection()
            raise self._error("publish failed", e) from None
        dropped = sum(1 for a in acks if a.duplicate)
        if dropped:
            self.duplicates_dropped += dropped
            log.info("server dropped duplicates", sink=self.id, duplicates=dropped)

    def _messages(self, events: Sequence[ChangeEvent], max_payload: int
                  ) -> list[tuple[str, bytes, dict[str, str]]]:
        encoder = Encoder(self._spec.envelope)
        out: list[tuple[str, bytes, dict[str, str]]] = []
        failures: list[tuple[int, str]] = []
        for i, event in enumerate(events):
            try:
                # Few headers: nats-py's header encoding costs more than the payload; the
                # event id, tx id and schema version are in every envelope's body.
                hdrs = {"Nats-Msg-Id": event.idempotency_key,
                        "Content-Type": encoder.content_type}
                msg = (destination(self._spec.subject, event), encoder.encode(event), hdrs)
            except (KeyError, ValueError, TypeError) as e:
                failures.append((i, f"cannot route or encode the event: {type(e).__name__}: {e}"))
                continue
            size = len(msg[1]) + sum(len(k) + len(v) + 4 for k, v in hdrs.items())
            if size > max_payload:
                failures.append((i, f"message too large: {size} bytes > the server's max_payload "
                                    f"{max_payload}"))
            out.append(msg)
        if failures:
            raise PerEventError(f"nats sink {self.id}: {len(failures)} event(s) cannot be "
                                f"published; first: {failures[0][1]}", failures)
        return out

    async def _publish(self, messages: Sequence[tuple[str, bytes, dict[str, str]]]
                       ) -> list[PubAck]:
        """Publish in order, then wait for every ack; fail fast when the connection drops,
        and when no ack came for the timeout (a slow link that still acknowledges goes on:
        a batch's bytes need not fit in one timeout)."""
        nc, js = self._nc, self._js
        assert nc is not None and js is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s

        def acked(_: asyncio.Future[PubAck]) -> None:
            nonlocal deadline
            deadline = loop.time() + self._timeout_s

        futures = [await js.publish_async(subject, payload, headers=dict(hdrs))
                   for subject, payload, hdrs in messages]
        deadline = loop.time() + self._timeout_s  # from the last publish, then the last ack
        for future in futures:
            future.add_done_callback(acked)
        acks = asyncio.gather(*futures)  # fails with the first failed ack
        try:
            while not acks.done():
                await asyncio.wait({acks}, timeout=0.05)
                if not acks.done() and (nc.is_closed or not nc.is_connected):
                    raise nats.errors.ConnectionClosedError
                if not acks.done() and loop.time() > deadline:
                    raise nats.errors.TimeoutError
        except BaseException:
            acks.cancel()
            raise
        return list(acks.result())

    # -- errors ------------------------------------------------------------------------

    def _error(self, what: str, error: BaseException) -> Exception:
        if isinstance(error, ConfigError):
            return error  # connect_security names the setting
        text = redact(f"{type(error).__name__}: {error}")
        cls = classify_nats(error)
        if isinstance(error, _AUTH) or "authorization violation" in text.lower():
            return NonRetryableError(
                f"nats sink {self.id}: authentication failed ({text}); check the user and "
                "password in spec.sinks[].url (nats://user:password@host:port)")
        if isinstance(error, nats.js.errors.NoStreamResponseError | nats.errors.NoRespondersError):
            return NonRetryableError(
                f"nats sink {self.id}: no JetStream stream stores the subject (no responders); "
                f"add the subject to stream {self._spec.stream}'s subjects "
                f"(e.g. {subject_filter(self._spec.subject)}) or fix spec.sinks[].subject")
        if cls is RetryableError:
            return RetryableError(f"nats sink {self.id}: {what}: {text}")
        return NonRetryableError(f"nats sink {self.id}: {what}: {text}")
