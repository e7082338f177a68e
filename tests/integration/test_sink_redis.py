"""Redis Streams sink against a real Redis: delivery, replay, outage, auth."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
import redis

from tailrace.errors import NonRetryableError, RetryableError
from tailrace.events import ChangeEvent
from tailrace_services.delivery.sinks.base import BatchCommit
from tailrace_services.delivery.sinks.redis import RedisSink, _Transaction
from tests.fix_sinks import NATS_PASSWORD, REDIS_PASSWORD, batches_of, sink_spec, source_events

pytestmark = pytest.mark.integration


_PIPELINE = {"name": "p"}


@pytest.fixture(autouse=True)
def _own_pipeline() -> None:
    """Each test its own pipeline name, so checkpoints of other tests do not interfere."""
    _PIPELINE["name"] = f"p{uuid.uuid4().hex[:8]}"


def make_sink(url: str, prefix: str | None = None, **spec: Any) -> tuple[RedisSink, str]:
    prefix = prefix or f"t{uuid.uuid4().hex[:8]}"
    fields = {"id": "r1", "type": "redis", "url": url, "stream": prefix + ".{table}", **spec}
    return RedisSink(sink_spec(**fields), timeout_s=2), prefix


def commit(batch: list[ChangeEvent]) -> BatchCommit:
    return BatchCommit(pipeline=_PIPELINE["name"], source_id="src1", sink_id="r1",
                       position=batch[-1].position)


def entries(url: str, prefix: str) -> list[dict[bytes, bytes]]:
    client = redis.Redis.from_url(url)
    out = []
    for stream in sorted(client.keys(f"{prefix}.*")):
        out.extend(fields for _, fields in client.xrange(stream))
    return out


def test_batches_land_in_order_with_idempotency_keys_and_the_checkpoint(redis_server: Any) -> None:
    sink, prefix = make_sink(redis_server.url)
    events = source_events(600)
    batches = batches_of(events, 200)
    for batch in batches:
        sink.write(batch, commit(batch))
    client = redis.Redis.from_url(redis_server.url)
    for table in ("orders", "items"):
        stored = [f[b"id"].decode() for _, f in client.xrange(f"{prefix}.{table}")]
        assert stored == [e.id for e in events if e.table == table]  # source order per stream
    got = entries(redis_server.url, prefix)
    assert {f[b"idempotency_key"].decode() for f in got} == {e.idempotency_key for e in events}
    assert json.loads(got[0][b"event"])["idempotency_key"] == got[0][b"idempotency_key"].decode()
    assert sink.stored_position() == batches[-1][-1].position
    raw = client.get(f"tailrace:checkpoint:{_PIPELINE['name']}:r1:0")
    assert raw == batches[-1][-1].position.SerializeToString()
    sink.close()


def test_a_replayed_batch_is_skipped_by_the_stored_checkpoint(redis_server: Any) -> None:
    sink, prefix = make_sink(redis_server.url)
    batches = batches_of(source_events(300), 100)
    for batch in batches[:2]:
        sink.write(batch, commit(batch))
    sink.close()
    # a restarted delivery whose control checkpoint is behind re-sends everything
    again, _ = make_sink(redis_server.url, prefix)
    for batch in batches:
        again.write(batch, commit(batch))
    got = [f[b"id"].decode() for f in entries(redis_server.url, prefix)]
    assert len(got) == len(set(got)) == sum(map(len, batches))
    # without a BatchCommit there is no checkpoint: the same replay duplicates
    again.write(batches[0])
    assert len(entries(redis_server.url, prefix)) == sum(map(len, batches)) + len(batches[0])


def test_a_rewound_sink_receives_again_what_it_had(redis_server: Any) -> None:
    """After `tailrace rewind --reset` the control checkpoint carries rewind generation 1:
    the sink's stored checkpoint of generation 0 no longer skips the replay."""
    sink, prefix = make_sink(redis_server.url)
    batches = batches_of(source_events(300), 100)
    for batch in batches:
        sink.write(batch, commit(batch))
    for batch in batches:  # the same generation: a replay is skipped
        sink.write(batch, commit(batch))
    total = sum(map(len, batches))
    assert len(entries(redis_server.url, prefix)) == total
    rewound = [replace(commit(batch), rewind=1) for batch in batches]
    assert sink.stored_position(0, rewind=1) is None, "a new generation starts empty"
    for batch, batch_commit in zip(batches, rewound, strict=True):
        sink.write(batch, batch_commit)
        sink.write(batch, batch_commit)  # and is exactly-once again within it
    got = [f[b"id"].decode() for f in entries(redis_server.url, prefix)]
    assert len(got) == 2 * total and set(Counter(got).values()) == {2}, "each event twice"
    assert sink.stored_position(0, rewind=1) == batches[-1][-1].position
    assert sink.stored_position(0) == batches[-1][-1].position
    raw = redis.Redis.from_url(redis_server.url).get(
        f"tailrace:checkpoint:{_PIPELINE['name']}:r1#rewind1:0")
    assert raw == batches[-1][-1].position.SerializeToString()
    sink.close()


def test_a_checkpoint_moved_by_another_writer_refuses_the_whole_batch(redis_server: Any
                                                                     ) -> None:
    """Between the WATCH and EXEC another writer stores a checkpoint: nothing of the batch
    is applied, the error is retryable, and the connection serves the next write."""
    sink, prefix = make_sink(redis_server.url)
    first, second = batches_of(source_events(200), 100)
    client = redis.Redis.from_url(redis_server.url)
    key = f"tailrace:checkpoint:{_PIPELINE['name']}:r1:0"
    with pytest.raises(redis.WatchError), sink.begin(commit(first)) as tx:
        client.set(key, second[-1].position.SerializeToString())  # the other writer
        tx.write(first, list(range(len(first))), commit(first))
    assert entries(redis_server.url, prefix) == [], "no entry of the refused batch"
    assert client.get(key) == second[-1].position.SerializeToString()
    client.delete(key)
    sink.write(first, commit(first))
    assert len(entries(redis_server.url, prefix)) == len(first)
    sink.close()


def test_a_key_that_is_not_a_stream_fails_the_batch_before_anything_is_applied(
        redis_server: Any) -> None:
    """Redis runs the rest of a transaction when one XADD fails inside EXEC (WRONGTYPE): the
    checkpoint would move past an event never written. The sink checks the streams' types
    first, says which key is in the way, and applies nothing."""
    sink, prefix = make_sink(redis_server.url)
    batch = source_events(100)
    client = redis.Redis.from_url(redis_server.url)
    client.set(f"{prefix}.orders", "not a stream")
    with pytest.raises(NonRetryableError, match=rf"key '{prefix}.orders' holds a string"):
        sink.write(batch, commit(batch))
    assert client.get(f"tailrace:checkpoint:{_PIPELINE['name']}:r1:0") is None
    assert client.xlen(f"{prefix}.items") == 0
    client.delete(f"{prefix}.orders")
    sink.write(batch, commit(batch))
    assert len(entries(redis_server.url, prefix)) == len(batch)
    sink.close()


def test_a_command_failing_inside_exec_puts_the_checkpoint_back(
        redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should an XADD still fail inside EXEC (here: the type check skipped), Redis has run
    the SET of the checkpoint: it is put back, so nothing of the batch is lost."""
    sink, prefix = make_sink(redis_server.url)
    first = source_events(100, tables=("items",))
    second = source_events(100, first_tx=1000)  # items and orders, later positions
    sink.write(first, commit(first))
    key = f"tailrace:checkpoint:{_PIPELINE['name']}:r1:0"
    client = redis.Redis.from_url(redis_server.url)
    before = client.get(key)
    monkeypatch.setattr(_Transaction, "_check_streams", lambda *args: None)
    client.set(f"{prefix}.orders", "not a stream")
    with pytest.raises(NonRetryableError, match="WRONGTYPE"):
        sink.write(second, commit(second))
    assert client.get(key) == before
    client.delete(f"{prefix}.orders")
    sink.write(second, commit(second))  # the retry after the fix
    written = [e[b"id"].decode() for e in entries(redis_server.url, prefix)]
    assert {e.id for e in first + second} <= set(written)  # none lost
    sink.close()


def test_envelope_and_maxlen(redis_server: Any) -> None:
    sink, prefix = make_sink(redis_server.url, envelope="debezium", maxlen=50)
    batch = source_events(400)
    sink.write(batch, commit(batch))
    client = redis.Redis.from_url(redis_server.url)
    assert client.xlen(f"{prefix}.orders") < 200  # trimmed (approximately) to about 50
    first = entries(redis_server.url, prefix)[0]
    assert json.loads(first[b"event"])["payload"]["op"] in ("c", "u", "d")


def test_outage_is_retryable_and_recovers_without_duplicates(redis_server: Any,
                                                            tcp_proxy: Any) -> None:
    proxy = tcp_proxy(redis_server.port)
    url = f"redis://127.0.0.1:{proxy.port}/0"
    sink, prefix = make_sink(url)
    batches = batches_of(source_events(300), 100)
    sink.write(batches[0], commit(batches[0]))
    proxy.cut()
    for _ in range(2):  # the write that loses its connection, then a retry that cannot connect
        started = time.monotonic()
        with pytest.raises(Exception) as caught:
            sink.write(batches[1], commit(batches[1]))
        assert isinstance(caught.value, RetryableError), caught.value
        assert time.monotonic() - started < 5
    proxy.restore()
    for batch in batches[1:]:  # the runtime retries the failed batch
        sink.write(batch, commit(batch))
    got = [f[b"id"].decode() for f in entries(redis_server.url, prefix)]
    assert got == [e.id for b in batches for e in b if e.table == "items"] + \
        [e.id for b in batches for e in b if e.table == "orders"]


def test_wrong_or_missing_password_fails_fast_and_says_what_to_fix(password_redis: Any) -> None:
    batch = source_events(5)
    for url in (f"redis://:wrong-{NATS_PASSWORD}@127.0.0.1:{password_redis.port}/0",
                password_redis.url):  # the second has no password: NOAUTH
        sink, _ = make_sink(url)
        started = time.monotonic()
        with pytest.raises(NonRetryableError) as caught:
            sink.write(batch, commit(batch))
        assert time.monotonic() - started < 2
        message = str(caught.value)
        assert "authentication failed" in message and "spec.sinks[].url" in message
        assert NATS_PASSWORD not in message
        assert isinstance(caught.value, NonRetryableError)
    good, prefix = make_sink(f"redis://:{REDIS_PASSWORD}@127.0.0.1:{password_redis.port}/0")
    good.write(batch, commit(batch))
    assert len(entries(f"redis://:{REDIS_PASSWORD}@127.0.0.1:{password_redis.port}/0",
                       prefix)) == 5
