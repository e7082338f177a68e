"""`tailrace snapshot|resnapshot`: read tables again while streaming goes on, follow it,
cancel it, and recover from a lost position (docs/snapshots.md). Needs the admin token
except `snapshot status`.

    tailrace snapshot PIPELINE [--table T ...] [--where EXPR]   queue tables (all: no --table)
    tailrace snapshot status PIPELINE                          rows done / estimated, rows/s, ETA
    tailrace snapshot cancel PIPELINE [--table T ...]
    tailrace resnapshot PIPELINE --confirm SOURCE_ID           accept the server as it is now
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from tailrace.control_client import ControlClient
from tailrace.proto import control_pb2 as pb
from tailrace_services.cli.output import enum_word, print_json, print_table, short, when

ACTIONS = ("status", "cancel")
_STATE = pb.SnapshotTableState.DESCRIPTOR


def add_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    p = command("snapshot", "read tables again while streaming goes on; status; cancel")
    p.add_argument("words", nargs="+", metavar="[status|cancel] PIPELINE",
                   help="PIPELINE queues a snapshot; `status PIPELINE` shows progress; "
                        "`cancel PIPELINE` stops it")
    p.add_argument("--table", action="append", default=[], metavar="TABLE",
                   help="a captured table (repeat for several; default: every one)")
    p.add_argument("--where", default="", help="only the rows this condition selects "
                                               "(the source's SQL)")
    p = command("resnapshot", "after a lost position: accept the server as it is now, stream "
                              "from there and read every table again (pause the pipeline first)")
    p.add_argument("pipeline")
    p.add_argument("--confirm", default="", metavar="SOURCE_ID",
                   help="repeat the pipeline's source id to confirm")


def run_snapshot(client: ControlClient, args: argparse.Namespace) -> int:
    action, pipeline = _action(args.words)
    if action == "status":
        return _status(client.snapshot_state(pipeline), args.json)
    if action == "cancel":
        state = client.cancel_snapshot(pipeline, args.table)
        print(f"snapshot of {_tables(state, args.table)} cancelled")
        return 0
    state = client.request_snapshot(pipeline, args.table, args.where)
    queued = [t.table for t in state.tables if t.state == pb.SNAPSHOT_PENDING]
    print(f"snapshot of {', '.join(queued)} queued; follow it with: "
          f"tailrace snapshot status {pipeline}")
    return 0


def run_resnapshot(client: ControlClient, args: argparse.Namespace) -> int:
    state = client.resnapshot(args.pipeline, args.confirm)
    print(f"resnapshot of {state.source_id} requested. A tailrace-capture that stopped on the "
          f"lost position and still serves /health takes it within seconds; otherwise start "
          f"it. It streams from the server's current position, reads every table again (each "
          f"one cleared first by a TRUNCATE), and `tailrace snapshot status {args.pipeline}` "
          f"follows it. Then `tailrace resume {args.pipeline}`: the delivery sends what it "
          "had not yet sent of the lost history, then the new one.")
    return 0


def _action(words: list[str]) -> tuple[str, str]:
    if len(words) == 1:
        return "request", words[0]
    if len(words) == 2 and words[0] in ACTIONS:
        return words[0], words[1]
    raise SystemExit(f"tailrace snapshot: expected PIPELINE, `status PIPELINE` or "
                     f"`cancel PIPELINE`; got {' '.join(words)!r}")


def _tables(state: pb.SnapshotState, asked: list[str]) -> str:
    return ", ".join(asked) if asked else f"every table of {state.pipeline}"


def _status(state: pb.SnapshotState, as_json: bool) -> int:
    if as_json:
        print_json(state)
        return 0
    now = time.time()
    print_table(["TABLE", "STATE", "ROWS", "ESTIMATED", "ROWS/S", "ETA", "CHUNKS", "UPDATED",
                 "REASON"], [
        [t.table, enum_word(_STATE, t.state), t.rows_done, t.rows_estimated or "-",
         round(t.rows_per_s) if t.rows_per_s else "-", _eta(t, now), t.chunks_done,
         when(t.updated_unix_ms), short(t.reason + (f" (where {t.where})" if t.where else ""),
                                        80)]
        for t in state.tables], f"no snapshot of pipeline {state.pipeline} yet")
    return 0


def _eta(table: pb.SnapshotTable, now: float) -> str:
    if table.state != pb.SNAPSHOT_RUNNING or not table.rows_per_s or not table.rows_estimated:
        return "-"
    left = max(table.rows_estimated - table.rows_done, 0) / table.rows_per_s
    return f"{int(left // 60)}m{int(left % 60):02d}s"
