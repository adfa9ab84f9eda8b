"""`tuiprof run|stacks|status …` for the GPU machine, whose image lacks the console's
dependencies (Textual): the commands' own parsers, registered as tuiprof.cli does, so every
option keeps its default. Usage: ``python3 bench/gpu/tuiprof_headless.py run --no-kineto-daemon -- CMD…``."""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

COMMANDS = ("run", "stacks", "status")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Only the command asked for is imported: `status` prints with the console's text helpers (Textual).
    names = [argv[0]] if argv and argv[0] in COMMANDS else list(COMMANDS)
    parser = argparse.ArgumentParser(prog="tuiprof")
    commands = parser.add_subparsers(required=True)
    for name in names:
        importlib.import_module(f"tuiprof.commands.{name}").add_parser(commands)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
