"""The delivery health state machine (pure logic): failed at once on a non-retryable block,
degraded after restarts in a row without a checkpoint advancing, cleared by progress."""

from __future__ import annotations

import json

import pytest

from tailrace.config import parse_pipeline
from tailrace.errors import RetryableError
from tailrace.httpside import Health
from tailrace.proto import control_pb2 as pb
from tailrace_services.delivery.committer import BatchCommitter, BatchReport, _moved
from tailrace_services.delivery.health import DEGRADED_AFTER, PipelineHealth, SinkStatus, State

AUTH = "NonRetryableError: redis sink r1: authentication failed (WRONGPASS); check the url"
DOWN = "commit policy 'required' not met: sink r1: retryable: connection refused"


def test_starts_running_and_healthy():
    health = PipelineHealth()
    assert health.current == State("running")
    assert health.http() == Health(True, "ok")
    assert DEGRADED_AFTER == 5


def test_a_non_retryable_block_fails_at_once_and_progress_clears_it():
    health = PipelineHealth()
    health.blocked(f"sink r1 failed with a non-retryable error: {AUTH}", non_retryable=True)
    assert health.current.state == "failed", "no restart needed: non-retryable fails now"
    assert health.http() == Health(False, f"sink r1 failed with a non-retryable error: {AUTH}",
                                   "unhealthy")
    for _ in range(10):  # restarts while failed stay failed (the more specific reason)
        health.restarted("sink r1 failed ...")
    assert health.current.state == "failed"
    health.committed(advanced=True)  # the operator fixed the password
    assert health.current == State("running") and health.restarts == 0


def test_restarts_without_progress_turn_degraded_at_the_threshold():
    health = PipelineHealth(degraded_after=3)
    for n in range(1, 3):
        health.blocked(DOWN, non_retryable=False)
        health.restarted(DOWN)
        assert health.current == State("running"), f"{n} restart(s) are below the threshold"
    health.blocked(DOWN, non_retryable=False)
    health.restarted(DOWN)
    assert health.current == State(
        "degraded", f"3 restarts in a row without a checkpoint advancing: {DOWN}")
    assert health.http() == Health(False, health.current.reason, "degraded")
    health.committed(advanced=False)  # a batch that moved nothing is no progress
    assert health.current.state == "degraded"
    health.restarted("")  # a restart without a message keeps the last known error
    assert health.current.reason.endswith(DOWN) and health.restarts == 4
    health.committed(advanced=True)
    assert health.current == State("running")


def test_a_fixed_sink_that_is_then_unreachable_is_no_longer_failed():
    health = PipelineHealth(degraded_after=2)
    health.blocked(AUTH, non_retryable=True)
    health.restarted(AUTH)
    health.blocked(DOWN, non_retryable=False)  # password fixed, the sink went away
    assert health.current == State("running"), "1 restart: below the threshold"
    health.restarted(DOWN)
    assert health.current == State(
        "degraded", f"2 restarts in a row without a checkpoint advancing: {DOWN}")


def test_fatal_is_final():
    health = PipelineHealth()
    health.fatal("sink k: producer fenced")
    health.committed(advanced=True)
    assert health.current == State("failed", "sink k: producer fenced")


def test_retry_delay_doubles_to_30_s_and_restarts_after_progress():
    health = PipelineHealth()
    delays = []
    for _ in range(8):
        health.restarted("x")
        delays.append(health.retry_delay())
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    health.committed(advanced=True)
    health.restarted("x")
    assert health.retry_delay() == 1


def test_publish_sends_changes_only_and_retries_a_failed_send():
    health = PipelineHealth(degraded_after=1)
    sent: list[tuple[str, str]] = []
    down = {"control": False}

    def send(now: State) -> None:
        if down["control"]:
            raise RetryableError("control service unavailable")
        sent.append((now.state, now.reason))

    health.publish(send)
    health.publish(send)
    assert sent == [("running", "")], "a new owner says running once"
    health.blocked(AUTH, non_retryable=True)
    down["control"] = True
    assert health.publish(send).state == "failed"
    assert sent == [("running", "")]
    down["control"] = False
    health.publish(send)
    assert sent[-1] == ("failed", AUTH), "sent again once the control service answers"
    health.restarted(AUTH)
    health.publish(send)
    assert len(sent) == 2, "same state, same reason: nothing sent"
    health.committed(advanced=True)
    health.publish(send)
    assert sent[-1] == ("running", "")


def test_failing_sinks_are_tracked_and_published_in_any_state():
    health = PipelineHealth()
    sent: list[State] = []
    health.publish(sent.append)
    health.sinks_done({"req": True, "opt": False}, {"opt": "retryable: Error 111"}, now_ms=1000)
    health.publish(sent.append)
    assert sent[-1] == State("running", "", (SinkStatus("opt", "retryable: Error 111", 1000, 1),))
    health.sinks_done({"req": True, "opt": False}, {"opt": "retryable: Error 111"}, now_ms=2000)
    health.publish(sent.append)
    assert sent[-1].sinks == (SinkStatus("opt", "retryable: Error 111", 1000, 2),), \
        "the run of failures keeps its start and counts the batches"
    health.sinks_done({"req": True, "opt": True}, {}, now_ms=3000)
    health.publish(sent.append)
    assert sent[-1] == State("running") and len(sent) == 4
    health.sinks_done({"opt": False}, {}, now_ms=4000)
    assert health.current.sinks[0].error == "did not acknowledge the batch"


def test_threshold_must_be_positive():
    with pytest.raises(ValueError, match="degraded_after is 0; it must be at least 1"):
        PipelineHealth(degraded_after=0)


SPEC = """
apiVersion: tailrace/v1
kind: Pipeline
metadata: {{name: p}}
spec:
  source: {{type: postgres, id: s, dsn: "host=unused", tables: [public.t]}}
  sinks:
    - {{id: req, type: redis, url: "redis://127.0.0.1:1/0"}}
    - {{id: opt, type: redis, required: {optional}, url: "redis://127.0.0.1:1/0"}}
  bus: {{brokers: "127.0.0.1:1"}}
  commit_policy: {policy}
"""


def report(**classes: str) -> BatchReport:
    r = BatchReport(policy_satisfied=False)
    for sink, cls in classes.items():
        r.acked[sink] = cls == ""
        if cls:
            r.errors[sink] = f"{cls}: {sink} broke"
            r.error_classes[sink] = cls
    return r


@pytest.mark.parametrize(("policy", "classes", "blocking"), [
    ("required", {"req": "non_retryable", "opt": ""}, {"req": "req broke"}),
    ("required", {"req": "retryable", "opt": "non_retryable"}, {}),  # opt does not gate
    ("all", {"req": "", "opt": "non_retryable"}, {"opt": "opt broke"}),
    ("{quorum: 2}", {"req": "retryable", "opt": "non_retryable"}, {"opt": "opt broke"}),
])
def test_blocking_failures_are_non_retryable_errors_of_sinks_the_policy_waits_for(
        policy: str, classes: dict[str, str], blocking: dict[str, str]) -> None:
    # `opt` is optional where that means something: under `all` and `quorum` every sink counts
    spec = SPEC.format(policy=policy, optional="false" if policy == "required" else "true")
    committer = BatchCommitter(parse_pipeline(spec), None)  # type: ignore[arg-type]
    assert committer.blocking_failures(report(**classes)) == blocking


def test_a_checkpoint_moved_when_its_position_or_offsets_grew():
    old = pb.Checkpoint(sink_id="a")
    old.position.tx_seq, old.bus_offsets[0] = 5, 50
    same = pb.Checkpoint()
    same.CopyFrom(old)
    assert _moved(None, same) and not _moved(old, same)
    same.bus_offsets[0] = 51
    assert _moved(old, same)
    later = pb.Checkpoint()
    later.CopyFrom(old)
    later.position.tx_seq = 6
    assert _moved(old, later)


def test_a_checkpoint_takes_the_bus_generation_of_its_batch():
    """Offsets of the generation the batch read: the old checkpoint's are of a bus that
    lost its records, so the generation's start is the base, then the batch's ends."""
    spec = SPEC.format(policy="required", optional="false")
    committer = BatchCommitter(parse_pipeline(spec), None)  # type: ignore[arg-type]
    old = pb.Checkpoint(sink_id="a", bus_offsets={0: 500, 1: 400})
    old.position.tx_seq = 5
    rows = [{"partition": 0, "generation": 1, "end_offset": 30, "epoch_position": None,
             "outcomes": "[]"}]
    new = committer.new_checkpoint("a", old, rows, generation_start={0: 12, 1: 7})
    assert (new.bus_generation, dict(new.bus_offsets)) == (1, {0: 30, 1: 7})
    assert _moved(old, new)
    again = committer.new_checkpoint("a", new, [{**rows[0], "end_offset": 45}])
    assert (again.bus_generation, dict(again.bus_offsets)) == (1, {0: 45, 1: 7})


def test_a_checkpoint_keeps_what_each_partition_of_the_sink_stored():
    """`sink_stored` moves with the outcomes of this sink's partitions and is carried
    forward, across bus generations too (its positions are the source's)."""
    spec = SPEC.format(policy="required", optional="false")
    committer = BatchCommitter(parse_pipeline(spec), None)  # type: ignore[arg-type]
    old = pb.Checkpoint(sink_id="a", bus_generation=0)
    old.sink_stored[0].tx_seq, old.sink_stored[1].tx_seq = 4, 3

    def row(partition: int, stored: list[int] | None) -> dict[str, object]:
        outcome = {"acked": True, "delivered": 1, "write_s": 0.0, "e2e_ms_max": 0.0,
                   "error": "", "error_class": ""}
        outcomes = [{**outcome, "sink_id": "a", "stored": stored},
                    {**outcome, "sink_id": "b", "stored": [99, 0]}]
        return {"partition": partition, "generation": 1, "end_offset": 10, "events": 1,
                "task_ms": 0.0, "read_ms": 0.0, "epoch_position": None,
                "outcomes": json.dumps(outcomes)}

    rows = [row(0, [7, 2]), row(1, None)]
    new = committer.new_checkpoint("a", old, rows, stored=committer.summarize(rows).stored["a"])
    assert {p: (s.tx_seq, s.event_index) for p, s in new.sink_stored.items()} == {
        0: (7, 2), 1: (3, 0)}


def test_ready_names_a_failing_sink_until_it_acknowledges_again():
    health = PipelineHealth()
    assert health.readiness() == (True, "")
    health.sinks_done({"r1": False, "r2": True}, {"r1": "retryable: ConnectionError: refused"})
    health.sinks_done({"r1": False, "r2": True}, {"r1": "retryable: ConnectionError: refused"})
    assert health.readiness() == (
        False, "sink r1 failed 2 batches in a row: retryable: ConnectionError: refused")
    health.sinks_done({"r1": True, "r2": True}, {})
    assert health.readiness() == (True, "")
