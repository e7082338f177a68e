"""NATS JetStream sink against a real nats-server: dedup window, stream set-up, outage, auth."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import nats
import pytest

from tailrace.errors import NonRetryableError, RetryableError
from tailrace_services.delivery.sinks.base import PerEventError
from tailrace_services.delivery.sinks.nats import NatsSink
from tests.fix_sinks import NATS_PASSWORD, NATS_USER, batches_of, sink_spec, source_events

pytestmark = pytest.mark.integration


def make_sink(url: str, stream: str | None = None, **spec: Any) -> NatsSink:
    stream = stream or f"S{uuid.uuid4().hex[:8]}"
    fields = {"id": "n1", "type": "nats", "url": url, "stream": stream,
              "subject": f"{stream}.{{database}}.{{table}}", **spec}
    return NatsSink(sink_spec(**fields), timeout_s=3)


def stream_messages(url: str, stream: str) -> list[Any]:
    async def fetch() -> list[Any]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        info = await js.stream_info(stream)
        msgs = [await js.get_msg(stream, seq) for seq in range(1, info.state.messages + 1)]
        await nc.close()
        return msgs

    return asyncio.run(fetch())


def stream_info(url: str, stream: str) -> Any:
    async def fetch() -> Any:
        nc = await nats.connect(url)
        info = await nc.jetstream().stream_info(stream)
        await nc.close()
        return info

    return asyncio.run(fetch())


def test_stream_created_and_messages_carry_the_idempotency_key(nats_server: Any) -> None:
    sink = make_sink(nats_server.url, duplicate_window_s=300)
    stream = sink._spec.stream
    events = source_events(500)
    for batch in batches_of(events, 100):
        sink.write(batch)
    sink.close()
    info = stream_info(nats_server.url, stream)
    assert info.config.duplicate_window == 300
    assert info.config.subjects == [f"{stream}.*.>"]
    msgs = stream_messages(nats_server.url, stream)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [e.idempotency_key for e in events]
    assert msgs[0].subject == f"{stream}.shop.{events[0].table}"
    assert msgs[0].headers["Content-Type"] == "application/json"


def test_a_replayed_batch_inside_the_window_is_stored_once(nats_server: Any) -> None:
    sink = make_sink(nats_server.url)
    stream = sink._spec.stream
    batches = batches_of(source_events(400), 100)
    for batch in batches[:3]:
        sink.write(batch)
    sink.close()
    restarted = make_sink(nats_server.url, stream)  # a restart re-sends from its checkpoint
    for batch in batches:
        restarted.write(batch)
    restarted.close()
    assert stream_info(nats_server.url, stream).state.messages == sum(map(len, batches))
    assert restarted.duplicates_dropped == sum(map(len, batches[:3]))


def test_an_existing_stream_gets_the_configured_window(nats_server: Any) -> None:
    stream = f"S{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        nc = await nats.connect(nats_server.url)
        await nc.jetstream().add_stream(name=stream, subjects=[f"{stream}.>"], duplicate_window=5)
        await nc.close()

    asyncio.run(create())
    sink = make_sink(nats_server.url, stream, duplicate_window_s=600)
    sink.open()
    sink.close()
    assert stream_info(nats_server.url, stream).config.duplicate_window == 600


def test_no_responders_and_too_large_fail_without_retry(nats_server: Any) -> None:
    sink = make_sink(nats_server.url)
    sink.open()  # creates the stream for its own subject
    other = make_sink(nats_server.url, sink._spec.stream, subject="elsewhere.{table}")
    with pytest.raises(NonRetryableError, match="no JetStream stream stores the subject"):
        other.write(source_events(2))
    big = source_events(3)
    big[1].after.columns[2].value.text_value = "x" * 2_000_000
    with pytest.raises(PerEventError) as caught:
        sink.write(big)
    assert [i for i, _ in caught.value.failures] == [1]
    sink.close()
    other.close()


def test_outage_is_retryable_and_recovers_without_duplicates(nats_server: Any,
                                                            tcp_proxy: Any) -> None:
    proxy = tcp_proxy(nats_server.port)
    sink = make_sink(f"nats://127.0.0.1:{proxy.port}")
    stream = sink._spec.stream
    batches = batches_of(source_events(300), 100)
    sink.write(batches[0])
    proxy.cut()
    for _ in range(2):  # the write that loses its connection, then a retry that cannot connect
        started = time.monotonic()
        with pytest.raises(Exception) as caught:
            sink.write(batches[1])
        assert isinstance(caught.value, RetryableError), caught.value
        assert time.monotonic() - started < 5
    proxy.restore()
    for batch in batches:  # the runtime retries from its checkpoint
        sink.write(batch)
    sink.close()
    assert stream_info(nats_server.url, stream).state.messages == 300


def test_wrong_password_fails_fast_and_says_what_to_fix(password_nats: Any) -> None:
    wrong = f"x{uuid.uuid4().hex[:6]}"
    sink = make_sink(f"nats://{NATS_USER}:{wrong}@127.0.0.1:{password_nats.port}")
    started = time.monotonic()
    with pytest.raises(NonRetryableError) as caught:
        sink.write(source_events(2))
    assert time.monotonic() - started < 2
    assert "authentication failed" in str(caught.value) and "spec.sinks[].url" in str(caught.value)
    assert wrong not in str(caught.value)
    sink.close()
    good = make_sink(f"nats://{NATS_USER}:{NATS_PASSWORD}@127.0.0.1:{password_nats.port}")
    good.write(source_events(2))
    good.close()
