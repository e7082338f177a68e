"""`tailrace audit`: who changed what — the control service's audit log (needs the admin token).

One line per accepted change of state: when, the caller's role, the RPC, how it ended, the
pipeline, who called (client certificate with mutual TLS, else what the client says it is,
and its address) and what the request was about.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from tailrace.control_client import ControlClient
from tailrace_services.cli.output import print_json, print_table, short, when


def add_command(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    p = command("audit", "who changed what: the control service's audit log (admin token)")
    p.add_argument("--pipeline", default="", help="only calls about this pipeline")
    p.add_argument("--role", choices=["admin", "service", "none"], default="",
                   help="only calls made with this role's token (none: control runs with "
                        "--insecure-no-auth)")
    p.add_argument("--limit", type=int, default=50, help="the newest N records (default 50)")


def run_audit(client: ControlClient, args: argparse.Namespace) -> int:
    records = client.list_audit(args.role, args.pipeline, args.limit)
    if args.json:
        print_json(records)
        return 0
    print_table(["TIME", "ROLE", "METHOD", "OUTCOME", "PIPELINE", "WHO", "PEER", "WHAT"], [
        [when(r.ts_unix_ms), r.role, r.method, r.outcome, r.pipeline or "-",
         short(r.client_cert or r.agent or "-", 40), r.peer, short(r.summary, 160)]
        for r in records], "no audit records")
    return 0
