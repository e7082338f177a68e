"""Redis Streams sink: XADD per event and the sink's checkpoint in one MULTI/EXEC.

Each write, on one connection:
1. `WATCH` the checkpoint key and read it (`tailrace:checkpoint:{pipeline}:{sink}:{partition}`,
   the serialized `Position` of the last batch written);
2. drop the events at or before it (a replayed batch);
3. `MULTI`, one `XADD` per remaining event (fields `id`, `op`, `key`, `idempotency_key`,
   `event` = the envelope), `SET` the checkpoint to the batch's position, `EXEC`.
Redis applies the transaction as a unit, so the stream and the checkpoint never
disagree: a crash, a lost reply or a retry can not duplicate an entry. If the key
moved meanwhile (a second writer), EXEC is refused and the write is retried from step 1.
Without a `BatchCommit` the events are appended as they come (at-least-once).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tailrace.config._model import RedisSinkSpec
from tailrace.envelopes import Encoder
from tailrace.errors import NonRetryableError, RetryableError, TailraceError
from tailrace.events import ChangeEvent, Position, key_bytes
from tailrace.events._codec import op_name
from tailrace.logs import get_logger, redact
from tailrace_services.delivery.sinks._common import (
    advances,
    checkpoint_name,
    destination,
    fresh_indexes,
    parse_position,
)
from tailrace_services.delivery.sinks.base import (
    BatchCommit,
    ErrorClass,
    PerEventError,
    RetryPolicy,
    Sink,
    classify_default,
)

log = get_logger(__name__)

CHECKPOINT_PREFIX = "tailrace:checkpoint:"

_AUTH_MARKERS = ("NOAUTH", "WRONGPASS", "NOPERM", "invalid username-password")


def classify_redis(error: BaseException) -> ErrorClass:
    """NOAUTH/WRONGPASS/NOPERM: fix the credentials; connection trouble, LOADING, BUSY: retry."""
    if isinstance(error, redis.AuthenticationError | redis.exceptions.NoPermissionError) or (
            isinstance(error, redis.ResponseError) and str(error).startswith(_AUTH_MARKERS)):
        return ErrorClass.NON_RETRYABLE
    if isinstance(error, redis.ConnectionError | redis.TimeoutError | redis.BusyLoadingError
                  | redis.WatchError | redis.exceptions.TryAgainError | ConnectionError
                  | TimeoutError):
        return ErrorClass.RETRYABLE
    if isinstance(error, redis.ResponseError) and str(error).startswith(
            ("LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN")):
        return ErrorClass.RETRYABLE
    return classify_default(error)


class RedisSink(Sink):
    retry = RetryPolicy(base_s=0.05, max_s=5.0, attempts=3)

    def __init__(self, spec: RedisSinkSpec, *, pipeline: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.id = spec.id
        self.required = spec.required
        self._spec = spec
        self._pipeline = pipeline
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

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        self.open()
        assert self._client is not None
        try:
            if commit is None:
                pipe = self._client.pipeline(transaction=False)
                for stream, fields in self._entries(events, range(len(events))).values():
                    self._xadd(pipe, stream, fields)
                pipe.execute()
            else:
                self._pipeline = commit.pipeline
                self._write_exactly_once(self._client, events, commit)
        except TailraceError:
            raise
        except Exception as e:
            self.close()  # a fresh connection on the retry
            raise self._error("write failed", e) from None

    def _write_exactly_once(self, client: redis.Redis, events: Sequence[ChangeEvent],
                            commit: BatchCommit) -> None:
        key = self._checkpoint_key(commit.pipeline, commit.partition)
        with client.pipeline(transaction=True) as pipe:
            pipe.watch(key)
            stored = parse_position(pipe.get(key))  # type: ignore[arg-type]
            todo = fresh_indexes(events, stored)
            if len(todo) < len(events):
                log.info("replayed events skipped", sink=self.id, skipped=len(events) - len(todo))
            if not todo and not advances(commit, stored):
                return
            entries = self._entries(events, todo)
            pipe.multi()
            for stream, fields in entries.values():
                self._xadd(pipe, stream, fields)
            pipe.set(key, commit.position.SerializeToString())
            pipe.execute()  # WatchError when another writer moved the checkpoint: retryable

    def _entries(self, events: Sequence[ChangeEvent], indexes: Iterable[int]
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

    def _xadd(self, pipe: Any, stream: str, fields: dict[str, Any]) -> None:
        pipe.xadd(stream, fields, maxlen=self._spec.maxlen,
                  approximate=self._spec.maxlen is not None)

    def stored_position(self, partition: int = 0) -> Position | None:
        if self._pipeline is None:
            return None  # not known before the first commit; write() still skips replays
        self.open()
        assert self._client is not None
        try:
            raw = self._client.get(self._checkpoint_key(self._pipeline, partition))
        except Exception as e:
            self.close()
            raise self._error("cannot read the checkpoint", e) from None
        return parse_position(raw)  # type: ignore[arg-type]

    def _checkpoint_key(self, pipeline: str, partition: int) -> str:
        return CHECKPOINT_PREFIX + checkpoint_name(pipeline, self.id, partition)

    def classify(self, error: BaseException) -> ErrorClass:
        return classify_redis(error)

    def _error(self, what: str, error: BaseException) -> Exception:
        text = redact(f"{type(error).__name__}: {error}")
        cls = classify_redis(error)
        if cls is ErrorClass.NON_RETRYABLE and ("auth" in text.lower() or "NOPERM" in text
                                                or "WRONGPASS" in text):
            return NonRetryableError(
                f"redis sink {self.id}: authentication failed ({text}); check the user and "
                "password in spec.sinks[].url (redis://user:password@host:port/db)")
        if cls is ErrorClass.RETRYABLE:
            return RetryableError(f"redis sink {self.id}: {what}: {text}")
        return NonRetryableError(f"redis sink {self.id}: {what}: {text}")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
