"""Per-sink checkpoints under sink outages, through the real Spark job, bus, control and Redis."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.fix_delivery import stream_seqs

pytestmark = pytest.mark.integration


def keys(seq: int) -> list[int]:
    return [seq % 5, 100 + seq % 3]


def test_optional_sink_down_30s_catches_up_without_resending_to_others(
        delivery_rig, redis_server, tcp_proxy):
    proxy = tcp_proxy(int(redis_server.url.rsplit(":", 1)[1].split("/")[0]))
    rig = delivery_rig([
        {"id": "a", "type": "redis", "url": redis_server.url, "stream": "a.{table}"},
        {"id": "b", "type": "redis", "required": False,
         "url": f"redis://127.0.0.1:{proxy.port}/0", "stream": "b.{table}"},
    ])
    stream_a, stream_b = "a.items", "b.items"
    rig.publish(1, 20, keys)
    rig.start_job()
    rig.wait(lambda: rig.checkpoint_seq("a") == 20 and rig.checkpoint_seq("b") == 20, 180,
             "both sinks at 20")

    proxy.cut()
    down_since = time.monotonic()
    for first in range(21, 61, 10):
        rig.publish(first, first + 9, keys)
        time.sleep(5)
    rig.wait(lambda: rig.checkpoint_seq("a") == 60, 120, "the required sink at 60 while b is down")
    assert rig.checkpoint_seq("b") == 20, "the optional sink's checkpoint stays while it is down"
    time.sleep(max(0.0, 30 - (time.monotonic() - down_since)))
    proxy.restore()
    rig.wait(lambda: rig.checkpoint_seq("b") == 60, 180, "the optional sink to catch up")

    expected = [(s, i) for s in range(1, 61) for i in range(2)]
    a = stream_seqs(redis_server.url, stream_a)
    assert a == expected, "the sink that was ahead got every event exactly once, in order"
    b = stream_seqs(redis_server.url, stream_b)
    assert sorted(set(b)) == expected
    first_seen = list(dict.fromkeys(b))
    assert first_seen == expected, "the caught-up sink saw source order"
    print(f"\noptional sink b: {len(b)} entries for {len(expected)} events "
          f"({len(b) - len(expected)} duplicates)")


def test_required_sink_down_blocks_every_checkpoint_and_loses_nothing(
        delivery_rig, redis_server, tcp_proxy):
    proxy = tcp_proxy(int(redis_server.url.rsplit(":", 1)[1].split("/")[0]))
    rig = delivery_rig([
        {"id": "req", "type": "redis", "url": f"redis://127.0.0.1:{proxy.port}/0",
         "stream": "req.{table}"},
        {"id": "opt", "type": "redis", "required": False, "url": redis_server.url,
         "stream": "opt.{table}"},
    ])
    rig.publish(1, 10, keys)
    rig.start_job()
    rig.wait(lambda: rig.checkpoint_seq("req") == 10, 180, "first batch")
    proxy.cut()
    rig.publish(11, 30, keys)
    time.sleep(20)
    assert (rig.checkpoint_seq("req"), rig.checkpoint_seq("opt")) == (10, 10), \
        "no checkpoint moves while a required sink is down"
    proxy.restore()
    rig.wait(lambda: rig.checkpoint_seq("req") == 30 and rig.checkpoint_seq("opt") == 30, 180,
             "both checkpoints after the outage")
    expected = [(s, i) for s in range(1, 31) for i in range(2)]
    req = stream_seqs(redis_server.url, "req.items")
    assert sorted(set(req)) == expected and list(dict.fromkeys(req)) == expected
    opt = Counter(stream_seqs(redis_server.url, "opt.items"))
    assert sorted(opt) == expected, "nothing lost on the optional sink either"


def test_a_zombie_commit_is_fatal_and_reported(delivery_rig, redis_server):
    rig = delivery_rig([{"id": "z", "type": "redis", "url": redis_server.url,
                         "stream": "z.{table}"}])
    rig.publish(1, 5, keys)
    rig.start_job()
    rig.wait(lambda: rig.checkpoint_seq("z") == 5, 180, "first batch")
    # another process moves the checkpoint (its version) behind the job's back; not past
    # what was published, which control would refuse
    cp = rig.client.get_checkpoint("syn", "z")
    assert rig.client.commit_checkpoint(cp, cp.version)[0]
    rig.publish(6, 9, keys)
    deadline = time.monotonic() + 120
    while rig.error is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert rig.error is not None and "second delivery process" in str(rig.error)
    from tailrace.proto import control_pb2 as pb

    health = rig.client.get_health(rig.name)
    assert health is not None and health.state == pb.HEALTH_FAILED
    assert "second delivery process" in health.reason
    # and the control service's /health says so (503 with the reason)
    import json
    import urllib.error
    import urllib.request

    from tailrace.httpside import start_http_side

    side = start_http_side(0, rig.control_server.check, rig.control_server.ready)
    try:
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"{side.url}/health", timeout=10)
        assert answer.value.code == 503
        assert "second delivery process" in json.loads(answer.value.read())["reason"]
    finally:
        side.stop()
