"""`tailrace`: run a pipeline locally (`up`), the end-to-end demo (`demo`), and the admin client
for a running control service (`pipelines`, `checkpoints`, `schemas`, `drift`, `dlq`,
`pause`, `resume`, `rewind`, `attach`, `audit`)."""

from __future__ import annotations

import argparse
import sys

from tailrace.errors import ConfigError
from tailrace.logs import add_log_options
from tailrace_services.cli import admin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tailrace", description=__doc__)
    admin.connection_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start control, capture and delivery for a pipeline spec")
    up.add_argument("pipeline")
    up.add_argument("--state-dir", default=".tailrace/state",
                    help="where the control service keeps its SQLite state")
    up.add_argument("--log-dir", default=None,
                    help="write each service's log to DIR/<service>.log instead of the terminal")
    up.add_argument("--http-port", type=int, default=0, metavar="BASE",
                    help="/health, /ready, /metrics of control on BASE, capture on BASE+1, "
                         "delivery on BASE+2 (default: free ports, printed at start)")
    add_log_options(up)

    demo = sub.add_parser("demo", help="throwaway PostgreSQL, broker, Redis and NATS, a sample "
                                       "pipeline, and changes arriving (what `make run` does)")
    demo.add_argument("--duration", type=float, default=None,
                      help="stop by itself this many seconds after the first events arrive "
                           "(default: until Ctrl-C)")
    demo.add_argument("--dir", default=".tailrace/demo", help="logs and state (default %(default)s)")
    add_log_options(demo)

    admin.add_commands(sub)

    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            from tailrace_services.cli.up import run_up

            return run_up(args.pipeline, args.state_dir, args.log_dir, args.http_port,
                          args.log_format, args.log_level)
        if args.command == "demo":
            from tailrace_services.cli.demo import run_demo

            return run_demo(args.dir, args.duration, args.log_format, args.log_level)
        if args.command in admin.COMMANDS:
            return admin.run(args)
    except ConfigError as e:
        print(f"tailrace: invalid pipeline spec:\n{e}", file=sys.stderr)
        return 2
    except Exception as e:  # the CLI speaks plainly: one line, non-zero exit
        from tailrace.logs import redact

        print(f"tailrace: {args.command} failed: {redact(str(e))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
