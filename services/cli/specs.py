"""`tailrace apply|get|delete|diff`: pipeline specs kept by the control service, which
managed capture and delivery (`--managed`) run. Apply and delete need the admin token.

    tailrace apply -f spec.yaml [--dry-run]     store it as the pipeline's next version
    tailrace diff -f spec.yaml                  what apply would change (exit 1 if anything)
    tailrace get                                every pipeline's current version
    tailrace get NAME [--version N] [--history] its YAML, an older one, or every version
    tailrace delete NAME --confirm NAME         its managed services stop
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from tailrace.control_client import ControlClient
from tailrace.proto import control_pb2 as pb
from tailrace_services.cli.output import print_json, print_table, when


def add_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    p = command("apply", "store a pipeline spec in the control service (create or update)")
    p.add_argument("-f", "--filename", required=True, help="the spec's YAML file ('-': stdin)")
    p.add_argument("--dry-run", action="store_true", help="validate and show the diff only")
    command("diff", "what `apply` would change; exit 1 when it would change something"
            ).add_argument("-f", "--filename", required=True, help="the spec's YAML file")
    p = command("get", "pipeline specs kept by the control service")
    p.add_argument("name", nargs="?", help="one pipeline: print its spec")
    p.add_argument("--version", type=int, default=0, help="an earlier version")
    p.add_argument("--history", action="store_true", help="list every version")
    p = command("delete", "delete a pipeline's spec (its managed services stop)")
    p.add_argument("name")
    p.add_argument("--confirm", default="", metavar="NAME",
                   help="repeat the pipeline's name to confirm")


def _read(filename: str) -> str:
    return sys.stdin.read() if filename == "-" else Path(filename).read_text()


def run_apply(client: ControlClient, args: argparse.Namespace) -> int:
    answer = client.apply_spec(_read(args.filename), dry_run=args.dry_run)
    name = answer.spec.name
    if not answer.changed:
        print(f"pipeline {name} unchanged (version {answer.spec.version})")
        return 0
    sys.stdout.write(answer.diff)
    if args.dry_run:
        print(f"pipeline {name}: {'would be created' if answer.created else 'would change'} "
              "(dry run: nothing stored)")
    else:
        print(f"pipeline {name} {'created' if answer.created else 'configured'}: version "
              f"{answer.spec.version}")
    return 0


def run_diff(client: ControlClient, args: argparse.Namespace) -> int:
    answer = client.apply_spec(_read(args.filename), dry_run=True)
    sys.stdout.write(answer.diff)
    return 1 if answer.changed else 0


def _row(s: pb.SpecVersion) -> list[str]:
    return [s.name, str(s.version), "deleted" if s.deleted else "",
            when(s.applied_unix_ms), s.applied_by]


def run_get(client: ControlClient, args: argparse.Namespace) -> int:
    if args.name is None:
        specs = client.list_specs()
        if args.json:
            print_json([{"name": s.name, "version": s.version,
                         "applied_unix_ms": s.applied_unix_ms, "applied_by": s.applied_by}
                        for s in specs])
        else:
            print_table(["PIPELINE", "VERSION", "", "APPLIED", "BY"], [_row(s) for s in specs],
                        "no pipeline specs: store one with tailrace apply -f FILE")
        return 0
    if args.history:
        versions = client.spec_history(args.name)
        if args.json:
            print_json([{"version": s.version, "deleted": s.deleted, "text": s.text,
                         "applied_unix_ms": s.applied_unix_ms, "applied_by": s.applied_by}
                        for s in versions])
        else:
            print_table(["PIPELINE", "VERSION", "", "APPLIED", "BY"], [_row(s) for s in versions],
                        f"no spec of pipeline {args.name}")
        return 0
    spec = client.get_spec(args.name, args.version)
    if args.json:
        print_json({"name": spec.name, "version": spec.version, "text": spec.text,
                    "deleted": spec.deleted, "applied_unix_ms": spec.applied_unix_ms,
                    "applied_by": spec.applied_by})
    elif spec.deleted:
        print(f"# pipeline {spec.name} version {spec.version}: deleted")
    else:
        sys.stdout.write(spec.text if spec.text.endswith("\n") else spec.text + "\n")
    return 0


def run_delete(client: ControlClient, args: argparse.Namespace) -> int:
    deleted = client.delete_spec(args.name, args.confirm)
    print(f"pipeline {deleted.name} deleted (version {deleted.version}); its managed capture "
          "and delivery stop")
    return 0
