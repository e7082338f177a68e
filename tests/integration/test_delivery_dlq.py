"""Per-event processor failures: to the DLQ with the journal on, a blocked batch with it off."""

from __future__ import annotations

import time

import pytest

from tailrace.events import ChangeEvent, Column, Op, Position, Row, value_of
from tailrace_services.capture.publisher import BusPublisher
from tests.fix_delivery import stream_seqs

pytestmark = pytest.mark.integration


def events(seq: int, bad: bool) -> list[ChangeEvent]:
    v = "not-a-number" if bad else seq
    return [ChangeEvent(
        source_id="syn", tenant="t", database="db", table="items", op=Op.OP_INSERT,
        key_columns=["id"], tx_id=str(seq), tx_size=1, tx_end=True, id=f"e{seq}",
        after=Row(columns=[Column(name="id", value=value_of(seq)),
                           Column(name="v", value=value_of(v))]),
        position=Position(tx_seq=seq))]


def publish(rig, seqs, bad) -> None:
    pub = BusPublisher(rig.brokers, rig.topic, 1, "syn", rig.client, 0)
    for seq in seqs:
        pub.publish_transaction(events(seq, seq in bad))
    pub.close()


PROCESSORS = """  processors: [{type: filter, where: "v + 1 > 0"}]
"""


def test_failed_events_go_to_the_dlq_and_the_pipeline_goes_on(delivery_rig, redis_server):
    rig = delivery_rig([{"id": "r", "type": "redis", "url": redis_server.url,
                         "stream": "dlq-on.{table}"}],
                       extra=PROCESSORS + "  journal: {enabled: true, max_entries: 100}\n")
    bad = {3, 7, 8}
    publish(rig, range(1, 21), bad)
    rig.start_job()
    rig.wait(lambda: rig.checkpoint_seq("r") == 20, 180, "the checkpoint past the bad events")
    delivered = [s for s, _ in stream_seqs(redis_server.url, "dlq-on.items")]
    assert delivered == [s for s in range(1, 21) if s not in bad]
    entries = rig.client.dlq_list(rig.name)
    assert sorted(ChangeEvent.FromString(e.event).position.tx_seq for e in entries) == sorted(bad)
    assert all("filter where" in e.reason for e in entries)
    assert rig.client.dlq_count(rig.name) == 3


def test_without_journal_a_failing_event_blocks_with_a_clear_error(delivery_rig, redis_server):
    rig = delivery_rig([{"id": "r", "type": "redis", "url": redis_server.url,
                         "stream": "dlq-off.{table}"}], extra=PROCESSORS)
    publish(rig, range(1, 6), {4})
    rig.start_job()
    rig.wait(lambda: rig.client.pipeline_state(rig.name)[0] == "failed", 180,
             "the pipeline failed by the non-retryable processor error")
    state, reason = rig.client.pipeline_state(rig.name)
    assert reason.startswith(f"{rig.name}: failed: processor failed on ") and \
        "spec.journal.enabled: true" in reason, reason
    time.sleep(5)
    assert rig.error is None, "not fatal: the batch is retried until fixed"
    assert rig.checkpoint_seq("r") == 0, "nothing committed past the failing event"
    assert rig.client.dlq_count(rig.name) == 0
