"""The ``tuiprof`` command line: the console by default, headless subcommands otherwise.

Each subcommand lives in its own module under ``tuiprof.commands`` and exposes
``add_parser(subparsers)`` (registering its arguments and ``func``). The console
itself (``tuiprof``, ``tuiprof connect``, ``tuiprof --slurm-job``) is the
``console`` command module, which also handles the no-subcommand case.

Commands raise ``tuiprof.errors.TuiprofError`` for what the user can fix; ``main``
prints it as ``tuiprof COMMAND: message`` and exits with its status.

``tuiprof COMMAND …`` imports only that command's module: importing every one
(the console's Textual and Prometheus client among them) costs more than most
headless commands take to run. Anything else (top-level options, ``--help``, no
command) builds the whole parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from agentd.address import DEFAULT_AGENT_PORT
from agentd.version import installed_version
from tuiprof.errors import TuiprofError

# Module under tuiprof.commands → the command it registers, in the order `tuiprof --help` lists them.
COMMANDS: dict[str, str] = {
    "console": "connect", "status": "status", "record": "record", "replay": "replay", "stacks": "stacks",
    "trace": "trace", "analyze": "analyze", "run": "run", "gemm_replay": "gemm-replay",
    "prometheus_targets": "prometheus-targets", "doctor": "doctor",
}
# What the console's top-level options (``console.add_top_level_arguments``) leave in every command's
# arguments when not given: a command run alone gets the same namespace as through the whole parser.
TOP_LEVEL_DEFAULTS: dict[str, object] = {
    "slurm_job": None, "port": DEFAULT_AGENT_PORT, "token_file": None, "tls_ca": None,
    "allow_plaintext_token": False, "interval": 0.0,
    "prometheus": None, "match": None,
}
DESCRIPTION = "Monitor and profile distributed GPU training from the terminal."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuiprof", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"tuiprof {installed_version()}")
    importlib.import_module("tuiprof.commands.console").add_top_level_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(f"tuiprof.commands.{module}").add_parser(subparsers)
    _plain_descriptions(subparsers)
    return parser


def _plain_descriptions(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """A command's description is mostly its module's docstring, written in reStructuredText for
    readers of the code: in ``--help`` its literals read as the rest of the help writes them (`x`)."""
    for command in subparsers.choices.values():
        if command.description:
            command.description = command.description.replace("``", "`")


class _OneCommandParser(argparse.ArgumentParser):
    """``tuiprof`` with only the command asked for; an error of its own (e.g. an argument no parser takes)
    is left to the whole parser, so it reads exactly as it always has."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__(prog="tuiprof", description=DESCRIPTION)
        self._argv = argv

    def error(self, message: str) -> NoReturn:
        build_parser().parse_args(self._argv)
        super().error(message)  # the whole parser took it after all: still an error here


def command_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser for ``argv``: only its command's when it starts with one, else the whole parser."""
    module = next((module for module, name in COMMANDS.items() if argv[:1] == [name]), None)
    if module is None:
        return build_parser()
    parser = _OneCommandParser(argv)
    parser.set_defaults(**TOP_LEVEL_DEFAULTS)
    # parser_class: the command's own parser reports its own errors, as under the whole parser.
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=argparse.ArgumentParser)
    importlib.import_module(f"tuiprof.commands.{module}").add_parser(subparsers)
    _plain_descriptions(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names; a ``TuiprofError`` becomes one line on stderr and its exit status."""
    arguments = sys.argv[1:] if argv is None else argv
    args = command_parser(arguments).parse_args(arguments)
    func = getattr(args, "func", None)
    if func is None:  # no subcommand: the console on this host or on --slurm-job's nodes
        func = importlib.import_module("tuiprof.commands.console").run
    try:
        return int(func(args) or 0)
    except TuiprofError as exc:
        command = f"tuiprof {args.command}" if args.command else "tuiprof"
        print(f"{command}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
