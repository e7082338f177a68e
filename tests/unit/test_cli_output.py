"""`--json` output: numbers as numbers, states as the words the tables show, positions in the
source's own notation beside `tx_seq`; and the lines `tailrace up` shows when a service dies."""

from __future__ import annotations

import json

from tailrace.proto import control_pb2 as pb
from tailrace_services.cli.output import to_json
from tailrace_services.cli.supervisor import error_summary


def test_numbers_stay_numbers_and_enums_are_words() -> None:
    info = pb.PipelineInfo(name="orders", state=pb.PIPELINE_DEGRADED, registered_unix_ms=17,
                           commit_policy=pb.CommitPolicy(kind=pb.POLICY_QUORUM, quorum=2),
                           sinks=[pb.SinkInfo(id="r", failed_batches=3, last_error="x")])
    out = json.loads(json.dumps(to_json([info])))[0]
    assert out["state"] == "degraded" and out["registered_unix_ms"] == 17
    assert out["commit_policy"] == {"kind": "quorum", "quorum": 2}
    assert out["sinks"][0]["failed_batches"] == 3
    assert "delivery_owner" not in out, "an unset message is left out"


def test_positions_carry_the_source_notation_beside_tx_seq() -> None:
    cp = pb.Checkpoint(sink_id="r", version=2)
    cp.position.tx_seq = (1 << 48) | 0x198E748
    cp.position.postgres.commit_lsn = 0x198E748
    cp.bus_offsets[0] = 123
    answer = pb.SinkCheckpoint(sink_id="r", found=True, checkpoint=cp, lag_offsets=4,
                               lag_bytes=4096, lag_seconds=1.5)
    out = to_json(answer)
    assert out["checkpoint"]["position"]["native"] == "0/198E748"
    assert out["checkpoint"]["position"]["tx_seq"] == (1 << 48) | 0x198E748
    assert out["checkpoint"]["bus_offsets"] == {"0": 123}
    assert (out["lag_offsets"], out["lag_bytes"], out["lag_seconds"]) == (4, 4096, 1.5)
    assert "lag_transactions" not in out, "not measured for this source"
    mysql = pb.Checkpoint()
    mysql.position.tx_seq = 9
    mysql.position.mysql.gtid_set = "0-1-9"
    assert to_json(mysql)["position"]["native"] == "0-1-9"


def test_bytes_are_base64() -> None:
    assert to_json(pb.DeadLetter(sequence=5, event=b"ab"))["event"] == "YWI="


def test_the_cause_of_a_dead_service_is_its_last_error_line() -> None:
    line = json.dumps({"event": "capture stopped", "level": "error", "state": "failed",
                       "reason": "cannot connect to postgresql://app:hunter2@db/shop: FATAL:  "
                                 "password authentication failed for user \"app\""})
    assert error_summary(line) == ("capture stopped: cannot connect to postgresql://app:***@db/"
                                   "shop: FATAL:  password authentication failed for user \"app\"")
    assert error_summary(json.dumps({"event": "batch delivered", "level": "info"})) is None
    assert error_summary("2026-01-01T00:00:00Z [error    ] capture stopped   reason=boom") == \
        "capture stopped   reason=boom"
    assert error_summary("psycopg.OperationalError: database \"nope\" does not exist") == \
        "psycopg.OperationalError: database \"nope\" does not exist"
    assert error_summary("Traceback (most recent call last):") is None
