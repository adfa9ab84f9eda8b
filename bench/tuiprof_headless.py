"""`tuiprof run|stacks|status …` for the GPU machine, whose image lacks the console's
dependencies (Textual): the commands' own parsers, registered as tuiprof.cli does, so every
option keeps its default. Usage: ``python3 bench/tuiprof_headless.py run --no-kineto-daemon -- CMD…``."""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tuiprof.commands import run, stacks, status  # noqa: E402  (after the checkout is on the path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tuiprof")
    commands = parser.add_subparsers(required=True)
    for module in (run, stacks, status):
        module.add_parser(commands)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
