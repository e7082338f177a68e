"""`tailrace dlq replay PIPELINE`: hand dead letters back, then acknowledge them.

Nothing is removed before it is safe: entries are fetched (`Replay`), re-delivered — through
the sinks of the pipeline spec (`--spec`) or written out as JSON lines (`--out`) — and only
then acknowledged up to the last entry that made it. A replay that fails half-way leaves the
rest in the queue.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from itertools import groupby
from typing import IO, TYPE_CHECKING

from tailrace.control_client import ControlClient
from tailrace.logs import redact
from tailrace.proto import control_pb2 as pb
from tailrace.proto.event_pb2 import ChangeEvent

if TYPE_CHECKING:
    from tailrace_services.delivery.sinks import Sink


def replay(client: ControlClient, args: argparse.Namespace) -> int:
    if bool(args.spec) == bool(args.out):
        print("tailrace: dlq replay needs --spec PIPELINE.yaml (re-deliver through its sinks) or "
              "--out FILE (write JSON lines); entries are acknowledged once that succeeded",
              file=sys.stderr)
        return 1
    entries = client.dlq_replay(args.pipeline, args.limit, args.after)
    if not entries:
        print(f"pipeline {args.pipeline}: no dead letters to replay")
        return 0
    if args.out:
        done, error = _export(entries, args.out), ""
    else:
        done, error = _redeliver(entries, args.spec, args.pipeline)
    removed = client.dlq_ack(args.pipeline, done) if done else 0
    replayed = sum(1 for e in entries if e.sequence <= done)
    summary = {"replayed": replayed, "acknowledged_up_to": done, "removed": removed}
    if error:
        print(f"tailrace: dlq replay stopped after {replayed} of {len(entries)} entries: {error}",
              file=sys.stderr)
    if args.json:
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
    elif not error or replayed:
        target = args.out if args.out else "its sinks"
        print(f"pipeline {args.pipeline}: replayed {replayed} dead letter(s) to {target}; "
              f"acknowledged up to sequence {done}", file=sys.stderr if args.out == "-" else
              sys.stdout)
    return 1 if error else 0


def _export(entries: list[pb.DeadLetter], path: str) -> int:
    def write(out: IO[str]) -> None:
        for e in entries:
            out.write(json.dumps({"sequence": e.sequence, "sink_id": e.sink_id, "reason": e.reason,
                                  "created_unix_ms": e.created_unix_ms,
                                  "event_b64": base64.b64encode(e.event).decode()}) + "\n")
        out.flush()

    if path == "-":
        write(sys.stdout)
    else:
        with open(path, "a", encoding="utf-8") as out:
            write(out)
            os.fsync(out.fileno())
    return entries[-1].sequence


def _redeliver(entries: list[pb.DeadLetter], spec_path: str, pipeline: str) -> tuple[int, str]:
    """(last sequence re-delivered, error or "")."""
    from tailrace.config import load_pipeline
    from tailrace_services.delivery.sinks import build_sink

    spec = load_pipeline(spec_path)
    if spec.name != pipeline:
        return 0, f"{spec_path} is pipeline {spec.name}, not {pipeline}"
    specs = {s.id: s for s in spec.spec.sinks}
    sinks: dict[str, Sink] = {}
    done = 0
    try:
        for sink_id, group in groupby(entries, key=lambda e: e.sink_id):
            batch = list(group)
            if sink_id not in specs:
                return done, (f"entry {batch[0].sequence} is for sink {sink_id!r}, which "
                              f"{spec_path} does not have (its sinks: {', '.join(specs)})")
            try:
                events = [ChangeEvent.FromString(e.event) for e in batch]
            except Exception:
                return done, f"an entry from sequence {batch[0].sequence} is not a ChangeEvent"
            if sink_id not in sinks:
                sink = build_sink(specs[sink_id])
                sink.open()
                sinks[sink_id] = sink
            try:
                sinks[sink_id].write(events)
            except Exception as e:
                return done, redact(f"sink {sink_id}: {type(e).__name__}: {e}")
            done = batch[-1].sequence
        return done, ""
    finally:
        for sink in sinks.values():
            sink.close()
