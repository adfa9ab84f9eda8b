"""The ``tuiprof`` command line: the console by default, headless subcommands otherwise.

Each subcommand lives in its own module under ``tuiprof.commands`` and exposes
``add_parser(subparsers)`` (registering its arguments and ``func``). The console
itself (``tuiprof``, ``tuiprof connect``, ``tuiprof --slurm-job``) is the
``console`` command module, which also handles the no-subcommand case.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Module names under tuiprof.commands, in the order `tuiprof --help` lists them.
COMMANDS: tuple[str, ...] = (
    "console", "status", "record", "replay", "stacks", "trace", "analyze", "run", "prometheus_targets",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuiprof",
        description="Monitor and profile distributed GPU training from the terminal.",
    )
    importlib.import_module("tuiprof.commands.console").add_top_level_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"tuiprof.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:  # no subcommand: the console on this host or on --slurm-job's nodes
        func = importlib.import_module("tuiprof.commands.console").run
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
