"""Redis Streams sink: XADD per event and the sink's checkpoint in one MULTI/EXEC.

Each write (`exactly_once.ExactlyOnceSink` owns the steps), on one connection:
1. `WATCH` the checkpoint key and read it (`tailrace:checkpoint:{pipeline}:{sink}:{partition}`,
   the serialized `Position` of the last batch written; after an operator's rewind the
   sink part is `{sink}#rewind{n}`, see `_common.stored_sink_id`);
2. drop the events at or before it (a replayed batch);
3. `MULTI`, one `XADD` per remaining event (fields `id`, `op`, `key`, `idempotency_key`,
   `event` = the envelope), `SET` the checkpoint to the batch's position, `EXEC`.
Redis applies the transaction as a unit, so the stream and the checkpoint never
disagree: a crash, a lost reply or a retry can not duplicate an entry. If the key
moved meanwhile (a second writer), EXEC is refused and the write is retried from step 1.
Without a `BatchCommit` the events are appended as they come (at-least-once).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.retry import Retry

from tailrace.config import RedisSinkSpec
from tailrace.envelopes import Encoder
from tailrace.errors import NonRetryableError, RetryableError, TailraceError
from tailrace.events import ChangeEvent, Position, key_bytes
from tailrace.events._codec import op_name
from tailrace.logs import get_logger, redact
from tailrace_services.delivery.sinks._common import (
    checkpoint_name,
    destination,
    parse_position,
)
from tailrace_services.delivery.sinks.base import (
    BatchCommit,
    PerEventError,
    RetryPolicy,
    error_class,
)
from tailrace_services.delivery.sinks.exactly_once import AtomicWrite, ExactlyOnceSink

log = get_logger(__name__)

CHECKPOINT_PREFIX = "tailrace:checkpoint:"

_AUTH_MARKERS = ("NOAUTH", "WRONGPASS", "NOPERM", "invalid username-password")


def classify_redis(error: BaseException) -> type[TailraceError]:
    """NOAUTH/WRONGPASS/NOPERM: fix the credentials; connection trouble, LOADING, BUSY: retry."""
    if isinstance(error, redis.AuthenticationError | redis.exceptions.NoPermissionError) or (
            isinstance(error, redis.ResponseError) and str(error).startswith(_AUTH_MARKERS)):
        return NonRetryableError
    if isinstance(error, redis.ConnectionError | redis.TimeoutError | redis.BusyLoadingError
                  | redis.WatchError | redis.exceptions.TryAgainError | ConnectionError
                  | TimeoutError):
        return RetryableError
    if isinstance(error, redis.ResponseError) and str(error).startswith(
            ("LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN")):
        return RetryableError
    return error_class(error)


class _Transaction(AtomicWrite):
    """MULTI/EXEC on a pipeline that WATCHes the checkpoint key."""

    def __init__(self, sink: RedisSink, pipe: Pipeline, key: str) -> None:
        self._sink, self._pipe, self._key = sink, pipe, key
        pipe.watch(key)  # type: ignore[no-untyped-call]  # redis-py leaves Pipeline.watch unannotated
        # Watching puts the pipeline in immediate mode: GET answers the value (redis-py's
        # ResponseT also allows the asyncio client's awaitable).
        self.stored = parse_position(cast(bytes | None, pipe.get(key)))

    def write(self, events: Sequence[ChangeEvent], indexes: list[int],
              commit: BatchCommit) -> None:
        entries = self._sink.entries(events, indexes)
        self._pipe.multi()
        for stream, fields in entries.values():
            self._sink.xadd(self._pipe, stream, fields)
        self._pipe.set(self._key, commit.position.SerializeToString())
        self._pipe.execute()  # WatchError when another writer moved the checkpoint: retryable


class RedisSink(ExactlyOnceSink):
    retry = RetryPolicy(base_s=0.05, max_s=5.0, attempts=3)

    def __init__(self, spec: RedisSinkSpec, *, pipeline: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.id = spec.id
        self.required = spec.required
        self.pipeline = pipeline
        self._spec = spec
        self._timeout_s = timeout_s
        self._client: redis.Redis | None = None

    def open(self) -> None:
        if self._client is not None:
            return
        client = redis.Redis.from_url(
            self._spec.url.get_secret_value(), socket_timeout=self._timeout_s,
            socket_connect_timeout=min(self._timeout_s, 5.0),
            retry=Retry(NoBackoff(), retries=0))  # one retry policy: the runtime's
        try:
            client.ping()
        except Exception as e:
            client.close()
            raise self._error("cannot connect", e) from None
        self._client = client

    # -- writing (exactly_once.ExactlyOnceSink) -----------------------------------------

    @contextmanager
    def begin(self, commit: BatchCommit) -> Iterator[AtomicWrite]:
        self.open()
        assert self._client is not None
        key = self._checkpoint_key(commit.pipeline, commit.partition, commit.rewind)
        with self._client.pipeline(transaction=True) as pipe:
            yield _Transaction(self, pipe, key)

    def write_unchecked(self, events: Sequence[ChangeEvent]) -> None:
        self.open()
        assert self._client is not None
        pipe = self._client.pipeline(transaction=False)
        for stream, fields in self.entries(events, range(len(events))).values():
            self.xadd(pipe, stream, fields)
        pipe.execute()

    def write_failed(self, error: Exception, commit: BatchCommit | None) -> Exception:
        if isinstance(error, TailraceError):
            return error  # routing or encoding (PerEventError), or open() already said why
        self.close()  # a fresh connection on the retry
        return self._error("write failed", error)

    def entries(self, events: Sequence[ChangeEvent], indexes: Iterable[int]
                ) -> dict[int, tuple[str, dict[str, Any]]]:
        """(stream, fields) for `events[i]`; events that cannot be routed or encoded fail alone."""
        encoder = Encoder(self._spec.envelope)
        entries: dict[int, tuple[str, dict[str, Any]]] = {}
        failures: list[tuple[int, str]] = []
        for i in indexes:
            event = events[i]
            try:
                entries[i] = (destination(self._spec.stream, event), {
                    "id": event.id,
                    "op": op_name(event.op),
                    "key": key_bytes(event),
                    "idempotency_key": event.idempotency_key,
                    "event": encoder.encode(event),
                })
            except (KeyError, ValueError, TypeError) as e:
                failures.append((i, f"cannot route or encode the event: {type(e).__name__}: {e}"))
        if failures:
            raise PerEventError(f"redis sink {self.id}: {len(failures)} event(s) cannot be "
                                f"written; first: {failures[0][1]}", failures)
        return entries

    def xadd(self, pipe: Any, stream: str, fields: dict[str, Any]) -> None:
        pipe.xadd(stream, fields, maxlen=self._spec.maxlen,
                  approximate=self._spec.maxlen is not None)

    def read_checkpoint(self, pipeline: str, partition: int, rewind: int) -> Position | None:
        self.open()
        assert self._client is not None
        try:
            raw = self._client.get(self._checkpoint_key(pipeline, partition, rewind))
        except Exception as e:
            self.close()
            raise self._error("cannot read the checkpoint", e) from None
        return parse_position(cast(bytes | None, raw))  # a sync client: bytes or None

    def _checkpoint_key(self, pipeline: str, partition: int, rewind: int = 0) -> str:
        return CHECKPOINT_PREFIX + checkpoint_name(pipeline, self.id, partition, rewind=rewind)

    # -- errors ------------------------------------------------------------------------

    def _error(self, what: str, error: BaseException) -> Exception:
        text = redact(f"{type(error).__name__}: {error}")
        cls = classify_redis(error)
        if cls is NonRetryableError and ("auth" in text.lower() or "NOPERM" in text
                                         or "WRONGPASS" in text):
            return NonRetryableError(
                f"redis sink {self.id}: authentication failed ({text}); check the user and "
                "password in spec.sinks[].url (redis://user:password@host:port/db)")
        if cls is RetryableError:
            return RetryableError(f"redis sink {self.id}: {what}: {text}")
        return NonRetryableError(f"redis sink {self.id}: {what}: {text}")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
