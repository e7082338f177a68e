"""`tailrace pipelines|checkpoints|...|audit|snapshot|resnapshot|apply|get|diff|delete`: the
admin client.

Each command talks gRPC to the control service (`--control`, default $TAILRACE_CONTROL or
127.0.0.1:50051) with the admin token (`--token-file`, default $TAILRACE_ADMIN_TOKEN) and
TLS options (`connect.py`). Tables for people, `--json` for scripts; a failure is one line
on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from tailrace.control_client import PIPELINE_STATES, ControlClient, ControlRefused, ControlUnavailable
from tailrace.errors import ConfigError
from tailrace.events import native_position
from tailrace.logs import redact
from tailrace.proto import control_pb2 as pb
from tailrace_services.cli import audit, snapshot, specs
from tailrace_services.cli.connect import add_credential_options, admin_client
from tailrace_services.cli.output import print_json, print_table, short, when

REASON_WIDTH = 240  # the last column: enough for a sink id, the error and its fix
_POLICY = {pb.POLICY_REQUIRED: "required", pb.POLICY_ALL: "all", pb.POLICY_QUORUM: "quorum"}


def connection_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """On the top parser with defaults; on each command too, so they may come after it."""
    default: Any = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    env = os.environ.get
    parser.add_argument("--control", metavar="ADDRESS",
                        default=default(env("TAILRACE_CONTROL", "127.0.0.1:50051")),
                        help="control service address (default $TAILRACE_CONTROL or "
                             "127.0.0.1:50051)")
    add_credential_options(parser, default)
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print JSON instead of a table")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def command(name: str, help: str) -> argparse.ArgumentParser:  # noqa: A002
        p = sub.add_parser(name, help=help)
        connection_options(p, top=False)
        return p

    command("pipelines", "pipelines with their state")
    command("checkpoints", "each sink's checkpoint and lag").add_argument(
        "pipeline", nargs="?", help="one pipeline (default: all)")
    p = command("schemas", "registered schema versions")
    p.add_argument("--table", help="only this table: db.table (or db.schema.table)")
    p.add_argument("--tenant", default="", help="only this tenant")
    command("drift", "reconcile records: what changed when a source's server changed"
            ).add_argument("source", nargs="?", help="one source id (default: all)")
    dlq = command("dlq", "the dead-letter queue: list, replay or purge")
    dlq.add_argument("action", choices=["list", "replay", "purge"])
    dlq.add_argument("pipeline")
    dlq.add_argument("--limit", type=int, default=100, help="at most this many entries")
    dlq.add_argument("--after", type=int, default=0, help="entries after this sequence")
    dlq.add_argument("--spec", help="replay: re-deliver through the sinks of this pipeline spec")
    dlq.add_argument("--out", help="replay: write the entries as JSON lines to this file "
                                   "('-' = stdout) for a tool of your own")
    p = command("pause", "pause a pipeline (capture and delivery stop at the next batch)")
    p.add_argument("pipeline")
    p.add_argument("--reason", default="", help="shown in `tailrace pipelines`")
    command("resume", "resume a paused pipeline").add_argument("pipeline")
    p = command("rewind", "set a sink's checkpoint back; the pipeline must be paused")
    p.add_argument("pipeline")
    p.add_argument("sink")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-sequence", type=int, help="back to the last epoch at or before "
                                                        "this transaction sequence")
    target.add_argument("--reset", action="store_true", help="back to the earliest position")
    p.add_argument("--confirm", default="", metavar="SINK",
                   help="repeat the sink id to confirm it receives again what it already has")
    p = command("attach", "bring back a sink detached for holding the source log back (past "
                          "source.max_retained); the pipeline must be paused")
    p.add_argument("pipeline")
    p.add_argument("sink")
    p.add_argument("--confirm", default="", metavar="SINK",
                   help="repeat the sink id to confirm it skips what it missed while detached "
                        "(a snapshot brings that)")
    audit.add_command(command)
    snapshot.add_commands(command)
    specs.add_commands(command)


def run(args: argparse.Namespace) -> int:
    try:
        client = admin_client(args)
    except ConfigError as e:  # an unreadable token or certificate file
        return fail(str(e), code=2)
    try:
        return _COMMANDS[args.command](client, args)
    except ControlUnavailable as e:
        if e.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            return fail(f"cannot reach control service at {args.control}: {_why(e.details)}")
        return fail(f"{args.command}: {redact(e.details or str(e))}")
    except ControlRefused as e:
        return fail(f"{args.command} refused: {redact(e.details)}")
    except ConfigError as e:  # TLS settings that do not fit the server's (ControlTlsError)
        return fail(str(e), code=2)
    finally:
        client.close()


def fail(message: str, code: int = 1) -> int:
    print(f"tailrace: {message}", file=sys.stderr)
    return code


def _why(details: str) -> str:
    for pattern, reason in ((r"connection refused", "connection refused"),
                            (r"deadline|timed? ?out", "timed out"),
                            (r"ssl|handshake|certificate", "TLS handshake failed (check --tls-ca)"),
                            (r"name resolution|dns|resolve", "address does not resolve")):
        if re.search(pattern, details, re.I):
            return reason
    return short(details.splitlines()[0] if details else "unavailable", 120)


def _pipelines(client: ControlClient, args: argparse.Namespace) -> int:
    pipelines = client.list_pipelines()
    if args.json:
        print_json(pipelines)
        return 0
    print_table(["PIPELINE", "TENANT", "SOURCE", "STATE", "POLICY", "SINKS", "DELIVERY",
                 "RETAINED", "REASON"], [
        [p.name, p.tenant, f"{p.source_id} ({p.source_type})", PIPELINE_STATES[p.state],
         _policy(p.commit_policy), ", ".join(_sink(s) for s in p.sinks),
         f"{p.delivery_owner.instance} (gen {p.delivery_owner.generation})"
         if p.delivery_owner.generation else "-", _retained(p), short(p.reason, REASON_WIDTH)]
        for p in pipelines], "no pipelines registered")
    return 0


def _retained(info: pb.PipelineInfo | pb.SinkCheckpointsResponse) -> str:
    """The source log the server keeps for the pipeline and what holds it, as capture last
    measured it: `3.1MiB (slot tailrace_orders)`; `-` before the first measurement."""
    if not info.HasField("retained_bytes"):
        return "-"
    return f"{_bytes(info.retained_bytes)} ({info.retained_what})"


def _sink(sink: pb.SinkInfo) -> str:
    """`id` (`id?` when optional), with `(failing)` while its last batch failed."""
    return f"{sink.id}{'' if sink.required else '?'}{' (failing)' if sink.last_error else ''}"


def _policy(policy: pb.CommitPolicy) -> str:
    name = _POLICY[policy.kind]
    return f"quorum {policy.quorum}" if policy.kind == pb.POLICY_QUORUM else name


def _checkpoints(client: ControlClient, args: argparse.Namespace) -> int:
    names = [args.pipeline] if args.pipeline else [p.name for p in client.list_pipelines()]
    answers = [client.sink_checkpoints(n) for n in names]
    if args.json:
        print_json(answers)
        return 0
    rows = []
    for a in answers:
        for s in a.sinks:
            cp = s.checkpoint
            rows.append([a.pipeline, s.sink_id, s.required,
                         (native_position(cp.position) or "-") if s.found else "-",
                         f"{cp.position.tx_seq}.{cp.position.event_index}" if s.found else "-",
                         cp.version if s.found else "-", s.lag_offsets,
                         _bytes(s.lag_bytes) if s.HasField("lag_bytes") else "-",
                         s.lag_transactions if s.HasField("lag_transactions") else "-",
                         s.lag_seconds, when(cp.updated_unix_ms) if s.found else "-",
                         _retained(a), _detached(s), _failing(s)])
    print_table(["PIPELINE", "SINK", "REQUIRED", "POSITION", "TX_SEQ", "VERSION", "LAG_OFFSETS",
                 "LAG_BYTES", "LAG_TX", "LAG_S", "UPDATED", "SOURCE_LOG_KEPT", "DETACHED",
                 "LAST_ERROR"], rows, "no checkpoints")
    return 0


def _native(position: Any) -> str:
    """` (0/198E748)`: the source's own notation of a position, when it has one."""
    text = native_position(position)
    return f" ({text})" if text else ""


def _bytes(n: int) -> str:
    """WAL bytes for people: `0B`, `512B`, `12.5KiB`, `3.1MiB`, `2.0GiB`."""
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{int(size)}B" if unit == "B" else f"{size:.1f}{unit}"


def _detached(s: pb.SinkCheckpoint) -> str:
    """`since <time>: <why>` for a sink detached for holding the source log back."""
    if not s.HasField("detached"):
        return "-"
    return short(f"since {when(s.detached.ts_unix_ms)}: {s.detached.reason}", REASON_WIDTH)


def _failing(s: pb.SinkCheckpoint) -> str:
    if not s.last_error:
        return "-"
    batches = f"{s.failed_batches} batch{'' if s.failed_batches == 1 else 'es'}"
    return short(f"{batches} since {when(s.failing_since_unix_ms)}: {s.last_error}",
                 REASON_WIDTH)


def _schemas(client: ControlClient, args: argparse.Namespace) -> int:
    records = client.list_schemas(args.tenant)
    if args.table:
        t = args.table
        records = [r for r in records if t in (f"{r.database}.{r.table}", r.table,
                                               f"{r.database}.{r.table.rsplit('.', 1)[-1]}")]
    if args.json:
        print_json(records)
        return 0
    print_table(["TENANT", "DATABASE", "TABLE", "VERSION", "SEQUENCE", "FINGERPRINT", "CREATED"],
                [[r.tenant, r.database, r.table, r.version, r.sequence, r.fingerprint[:12],
                  when(r.created_unix_ms)] for r in records], "no schemas registered")
    return 0


def _drift(client: ControlClient, args: argparse.Namespace) -> int:
    records = client.list_reconcile_records(args.source or "")
    if args.json:
        print_json(records)
        return 0
    print_table(["TIME", "SOURCE", "DECISION", "IDENTITY", "DRIFT"], [
        [when(r.ts_unix_ms), r.source_id, r.decision,
         f"{r.old_identity.fingerprint[:8] or '-'} -> {r.new_identity.fingerprint[:8] or '-'}",
         short("; ".join(r.drift) or "-", 80)] for r in records], "no reconcile records")
    return 0


def _dlq(client: ControlClient, args: argparse.Namespace) -> int:
    if args.action == "purge":
        removed = client.dlq_purge(args.pipeline)
        print_json({"removed": removed}) if args.json else print(
            f"purged {removed} dead letter(s) of pipeline {args.pipeline}")
        return 0
    if args.action == "replay":
        from tailrace_services.cli.replay import replay

        return replay(client, args)
    stats = client.dlq_stats(args.pipeline)
    entries = client.dlq_list(args.pipeline, args.limit, args.after)
    if args.json:
        print_json({"stats": stats, "entries": entries})
        return 0
    print(f"pipeline {args.pipeline}: {stats.count} dead letter(s); since created: "
          f"{stats.dropped_total} dropped (drop_oldest), {stats.expired_total} expired, "
          f"{stats.rejected_total} rejected")
    print_table(["SEQ", "SINK", "REASON", "BYTES", "CREATED", "EXPIRES"], [
        [e.sequence, e.sink_id, short(e.reason), len(e.event), when(e.created_unix_ms),
         when(e.expires_unix_ms) if e.expires_unix_ms else "never"] for e in entries], "")
    return 0


def _pause(client: ControlClient, args: argparse.Namespace) -> int:
    info = client.pause(args.pipeline, args.reason)
    print_json(info) if args.json else print(f"pipeline {info.name} paused")
    return 0


def _resume(client: ControlClient, args: argparse.Namespace) -> int:
    info = client.resume(args.pipeline)
    print_json(info) if args.json else print(
        f"pipeline {info.name} resumed (state {PIPELINE_STATES[info.state]})")
    return 0


def _attach(client: ControlClient, args: argparse.Namespace) -> int:
    r = client.attach(args.pipeline, args.sink, args.confirm)
    if args.json:
        print_json(r)
    else:
        print(f"sink {args.sink} of pipeline {args.pipeline} attached again at tx "
              f"{r.checkpoint.position.tx_seq}{_native(r.checkpoint.position)} (detached at tx "
              f"{r.was.checkpoint.position.tx_seq}: {r.was.reason}). It skips what it missed: "
              f"resume (`tailrace resume {args.pipeline}`), then read its tables again "
              f"(`tailrace snapshot {args.pipeline} --table ...`)")
    return 0


def _rewind(client: ControlClient, args: argparse.Namespace) -> int:
    r = client.rewind(args.pipeline, args.sink, args.confirm, to_sequence=args.to_sequence,
                      reset=args.reset)
    if args.json:
        print_json(r)
    else:
        after = ("the earliest available position" if args.reset else
                 f"tx {r.after.position.tx_seq}.{r.after.position.event_index}"
                 + _native(r.after.position))
        print(f"sink {args.sink} of pipeline {args.pipeline}: checkpoint moved from tx "
              f"{r.before.position.tx_seq}.{r.before.position.event_index}"
              f"{_native(r.before.position)} to {after}; once resumed (`tailrace resume "
              f"{args.pipeline}`) it receives again what it had from there")
    return 0


_COMMANDS = {"pipelines": _pipelines, "checkpoints": _checkpoints, "schemas": _schemas,
             "drift": _drift, "dlq": _dlq, "pause": _pause, "resume": _resume, "rewind": _rewind,
             "attach": _attach,
             "audit": audit.run_audit, "snapshot": snapshot.run_snapshot,
             "resnapshot": snapshot.run_resnapshot, "apply": specs.run_apply,
             "diff": specs.run_diff, "get": specs.run_get, "delete": specs.run_delete}
COMMANDS = tuple(_COMMANDS)  # the subcommands `run` answers
