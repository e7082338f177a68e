"""Redis Streams sink: one XADD per event, pipelined, in source order."""

from __future__ import annotations

import json
from collections.abc import Sequence

import redis

from tailrace.config._model import RedisSinkSpec
from tailrace.errors import NonRetryableError, RetryableError
from tailrace.events import event_to_json_dict, key_bytes
from tailrace.proto.event_pb2 import ChangeEvent
from tailrace_services.delivery.sinks.base import BatchCommit, Sink
from tailrace_services.delivery.sinks.templates import render


class RedisSink(Sink):
    def __init__(self, spec: RedisSinkSpec) -> None:
        self.id = spec.id
        self.required = spec.required
        self._spec = spec
        self._client: redis.Redis | None = None

    def open(self) -> None:
        self._client = redis.Redis.from_url(self._spec.url.get_secret_value(),
                                            socket_timeout=10, socket_connect_timeout=5)

    def write(self, events: Sequence[ChangeEvent], commit: BatchCommit | None = None) -> None:
        if self._client is None:
            self.open()
        assert self._client is not None
        pipe = self._client.pipeline(transaction=False)
        for event in events:
            fields = {
                "id": event.id,
                "op": str(event.op),
                "key": key_bytes(event),
                "idempotency_key": event.idempotency_key,
                "event": json.dumps(event_to_json_dict(event), separators=(",", ":")),
            }
            pipe.xadd(render(self._spec.stream, event), fields,  # type: ignore[arg-type]
                      maxlen=self._spec.maxlen, approximate=self._spec.maxlen is not None)
        try:
            pipe.execute()
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as e:
            raise NonRetryableError(f"redis sink {self.id}: authentication failed: {e}; "
                                    "check the password in spec.sinks[].url") from None
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as e:
            raise RetryableError(f"redis sink {self.id}: {e}") from None
        except redis.ResponseError as e:
            if "NOAUTH" in str(e) or "WRONGPASS" in str(e):
                raise NonRetryableError(f"redis sink {self.id}: authentication failed: {e}") \
                    from None
            raise

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
