"""``tuiprof replay FILE``: the console over a recording made by ``tuiprof record``."""

from __future__ import annotations

import argparse
import pathlib
import sys

from tuiprof.client.sources import ReplaySource
from tuiprof.errors import BadInputError
from tuiprof.model import record


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay", help="open the console over a recording",
        description="Open the console over a recording made by `tuiprof record` (space pauses).",
    )
    parser.add_argument("file", type=pathlib.Path, metavar="FILE", help="an NDJSON recording")
    parser.add_argument("--speed", type=float, default=1.0, metavar="X",
                        help="playback speed (default 1 = real time; 0 = jump to the end)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.speed < 0:
        raise BadInputError(f"--speed {args.speed}: expected 0 or more")
    events = list(record.read(args.file))
    if not events:
        raise BadInputError(f"{args.file} holds no events")
    if not sys.stdout.isatty():
        raise BadInputError("stdout is not a terminal; replay draws the console (read the NDJSON itself for scripts)")
    from tuiprof.tui.app import TuiprofApp

    app = TuiprofApp(ReplaySource(events, speed=args.speed))
    app.run()
    return app.return_code or 0
