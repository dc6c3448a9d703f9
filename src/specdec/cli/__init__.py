"""specdec's command line: one module per subcommand, listed in COMMANDS.

Each module's add_parser(sub) adds its subcommand and sets `func`, one plain function of the
parsed arguments. Errors meant for people (SpecdecError, ValueError from settings) print one
line and exit 2, never a stack trace.
"""

from __future__ import annotations

import argparse
import os
import sys

from specdec.cli import bench, demo, export, generate, inspect, pull, serve, train, tune
from specdec.model.errors import SpecdecError

# subcommand -> the module that adds it (generate adds chat too), in the order --help lists them
COMMANDS = {"demo": demo, "generate": generate, "chat": generate, "serve": serve, "bench": bench, "inspect": inspect,
            "export-config": export, "pull": pull, "train": train, "tune": tune}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="speculative decoding for open-weight models, "
                                     "with output identical to the target's")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in dict.fromkeys(COMMANDS.values()):  # each module once
        module.add_parser(sub)
    missing = set(COMMANDS) - set(sub.choices)
    if missing:
        raise RuntimeError(f"cli.COMMANDS lists {', '.join(sorted(missing))}, which no module added")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (SpecdecError, ValueError, FileNotFoundError) as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`specdec generate ... | head`): stop quietly, as cat does
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush cannot fail
        except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor
            pass
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the signal
