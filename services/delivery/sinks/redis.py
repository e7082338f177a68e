"""Redis Streams sink: XADD per event and the sink's checkpoint in one MULTI/EXEC.

Each write (`exactly_once.ExactlyOnceSink` owns the steps), on one connection:
1. `WATCH` the checkpoint key and read it (`tailrace:checkpoint:{pipeline}:{sink}:{partition}`,
   the serialized `Position` of the last batch written; after an operator's rewind the
   sink part is `{sink}#rewind{n}`, see `_common.stored_sink_id`);
2. drop the events at or before it (a replayed batch);
3. `WATCH` the batch's streams as well and check each is a stream (or absent): inside
   EXEC, Redis would run the rest of the transaction after an XADD to another kind of key
   failed, and the checkpoint would pass an event never written;
4. `MULTI`, one `XADD` per remaining event (fields `id`, `op`, `key`, `idempotency_key`,
   `event` = the envelope), `SET` the checkpoint to the batch's position, `EXEC`: sent at
   once and answered in one read, packed by hiredis.
Redis applies the transaction as a unit, so the stream and the checkpoint never
disagree: a crash, a lost reply or a retry can not duplicate an entry. (Should a
command still fail inside EXEC, the checkpoint is put back by a compare-and-set
script and the batch retried: its written entries repeat, none is lost; if it cannot
be put back, the sink stops with a `FatalError`.) If the key
moved meanwhile (a second writer), EXEC is refused and the write is retried from step 1.
Without a `BatchCommit` the events are appended as they come (at-least-once).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, cast

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.retry import Retry

from tailrace.config import RedisSinkSpec
from tailrace.envelopes import Encoder
from tailrace.errors import FatalError, NonRetryableError, RetryableError, TailraceError
from tailrace.events import ChangeEvent, Position, key_bytes
from tailrace.events._codec import op_name, xadd_commands
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

try:  # redis[hiredis]: packs commands in C
    import hiredis
except ImportError:  # pragma: no cover - redis-py packs them
    hiredis = None  # type: ignore[assignment]

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
        self._raw = cast(bytes | None, pipe.get(key))
        self.stored = parse_position(self._raw)

    def write(self, events: Sequence[ChangeEvent], indexes: list[int],
              commit: BatchCommit) -> None:
        """MULTI, the XADDs, SET, EXEC sent at once on the watching connection and their
        replies read back, packed and parsed by hiredis (redis-py's pipeline cost ~10 µs
        an entry)."""
        conn: Any = self._pipe.connection  # redis-py leaves Connection unannotated
        assert conn is not None  # watching: the pipeline holds its connection
        streams, xadds = self._sink.xadds(conn, events, indexes)
        packed = [*_packed(conn, [(b"MULTI",)]), *xadds, *_packed(conn, [
            (b"SET", self._key, commit.position.SerializeToString()), (b"EXEC",)])]
        try:
            self._check_streams(conn, streams)
            conn.send_packed_command(packed)
            for _ in range(len(indexes) + 2):  # +OK, then +QUEUED each (or an error)
                conn.read_response()
            applied = conn.read_response()
        except BaseException:
            conn.disconnect()  # replies may be left unread: never reuse it
            raise
        self._pipe.watching = False  # EXEC (applied or not) ended the WATCH
        if applied is None:  # another writer moved the checkpoint: retryable
            raise redis.WatchError("the checkpoint key changed while the batch was written")
        failed = [reply for reply in cast(list[Any], applied) if isinstance(reply, Exception)]
        if failed:
            self._put_back(conn, commit, failed)

    def _put_back(self, conn: Any, commit: BatchCommit, failed: list[Exception]) -> NoReturn:
        """A command failed inside EXEC and Redis ran the rest: the checkpoint moved past
        an entry never written. Put it back, unless another writer moved it since, so
        the retry writes the batch again: the entries that were written are then
        repeated (at-least-once for this batch), but none is lost."""
        new = commit.position.SerializeToString()
        conn.send_packed_command(_packed(conn, [(
            b"EVAL", _PUT_BACK, b"1", self._key, new, self._raw or b"")]))
        try:
            restored = conn.read_response()
        except Exception as e:  # noqa: BLE001 - said below, with what it means
            restored = e
        count = len(failed)
        if restored != 1:
            raise FatalError(
                f"redis sink {self._sink.id}: {count} command(s) failed inside EXEC (first: "
                f"{failed[0]}) and the checkpoint {self._key!r} could not be put back "
                f"({restored!r}): it is past events never written. Rewind the sink "
                f"(tailrace rewind) to write them again")
        log.error("redis transaction partly applied; checkpoint put back, the batch's "
                  "written entries will be repeated by the retry", sink=self._sink.id,
                  failed=count, first=str(failed[0]))
        raise failed[0]


    def _check_streams(self, conn: Any, streams: list[str]) -> None:
        """Redis runs the rest of a transaction when one command fails in EXEC: an XADD to
        a key that is not a stream (WRONGTYPE) would fail while the checkpoint moved past
        its event. So the streams are watched too (their type cannot change until EXEC),
        and checked first."""
        conn.send_packed_command(_packed(conn, [(b"WATCH", *streams),
                                                *[(b"TYPE", s) for s in streams]]))
        conn.read_response()
        kinds = [conn.read_response() for _ in streams]
        for stream, kind in zip(streams, kinds, strict=True):
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            if kind not in ("none", "stream"):
                raise NonRetryableError(
                    f"redis sink {self._sink.id}: key {stream!r} holds a {kind}, not a stream; "
                    "rename or delete that key, or route the events elsewhere with "
                    "spec.sinks[].stream")


# Puts the checkpoint (KEYS[1]) back to ARGV[2] (deleted if empty) only if it still
# holds ARGV[1], the position this write stored.
_PUT_BACK = b"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2]) end
return 1
"""


def _packed(conn: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
    if hiredis is not None:
        return [b"".join([hiredis.pack_command(c) for c in commands])]
    return cast(list[bytes], conn.pack_commands(commands))


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

    def per_event_failures(self, events: Sequence[ChangeEvent]) -> list[tuple[int, str]]:
        try:
            self.entries(events, range(len(events)))
        except PerEventError as e:
            return e.failures
        return []

    def entries(self, events: Sequence[ChangeEvent], indexes: Iterable[int]
                ) -> dict[int, tuple[str, dict[str, Any]]]:
        """(stream, fields) for `events[i]`; events that cannot be routed or encoded fail alone."""
        encoder = Encoder(self._spec.envelope)
        # the field `key` is the native key whatever the envelope (`key_bytes`)
        keyed = encoder.keyed if encoder.envelope == "native" else (
            lambda e: (key_bytes(e), encoder.encode(e)))
        entries: dict[int, tuple[str, dict[str, Any]]] = {}
        failures: list[tuple[int, str]] = []
        for i in indexes:
            event = events[i]
            try:
                key, value = keyed(event)
                entries[i] = (destination(self._spec.stream, event), {
                    "id": event.id,
                    "op": op_name(event.op),
                    "key": key,
                    "idempotency_key": event.idempotency_key,
                    "event": value,
                })
            except (KeyError, ValueError, TypeError) as e:
                failures.append((i, f"cannot route or encode the event: {type(e).__name__}: {e}"))
        if failures:
            raise PerEventError(f"redis sink {self.id}: {len(failures)} event(s) cannot be "
                                f"written; first: {failures[0][1]}", failures)
        return entries

    def xadds(self, conn: Any, events: Sequence[ChangeEvent], indexes: Sequence[int]
              ) -> tuple[list[str], list[bytes]]:
        """The streams `events[i]` go to, sorted, and their XADD commands packed for `conn`.
        With the native envelope the commands are written in one C call from the events'
        bytes (`xadd_commands`); the fields of `entries` otherwise, or when that declines."""
        chosen = [events[i] for i in indexes]
        if self._spec.envelope == "native" and hiredis is not None:
            try:
                routes = [destination(self._spec.stream, event) for event in chosen]
            except (KeyError, ValueError, TypeError):
                routes = []  # `entries` says which events cannot be routed
            packed = xadd_commands(chosen, routes, self._trim) if routes else None
            if packed is not None:
                return sorted(set(routes)), [packed]
        entries = self.entries(events, indexes)
        return sorted({stream for stream, _ in entries.values()}), _packed(
            conn, [self.xadd_args(stream, fields) for stream, fields in entries.values()])

    @property
    def _trim(self) -> tuple[bytes, ...]:
        maxlen = self._spec.maxlen
        return (b"MAXLEN", b"~", str(maxlen).encode()) if maxlen is not None else ()

    def xadd(self, pipe: Any, stream: str, fields: dict[str, Any]) -> None:
        pipe.xadd(stream, fields, maxlen=self._spec.maxlen,
                  approximate=self._spec.maxlen is not None)

    def xadd_args(self, stream: str, fields: dict[str, Any]) -> tuple[Any, ...]:
        """`xadd`'s command: XADD stream [MAXLEN ~ n] * field value ..."""
        return (b"XADD", stream, *self._trim, b"*", *[x for pair in fields.items() for x in pair])

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
