"""``tuiprof record FILE``: write every host event (snapshots, outages) to an NDJSON file.

Replays with ``tuiprof replay FILE``; the line format is in ``tuiprof.model.record``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import sys
from typing import TextIO

from tuiprof.client.targets import add_target_arguments
from tuiprof.commands.console import _add_interval, source_from_args
from tuiprof.errors import BadInputError
from tuiprof.model import record
from tuiprof.model.events import HostEvent, HostUnreachable


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "record", help="record snapshots of hosts to an NDJSON file (replay it later)",
        description="Write every host event (snapshots, outages) to FILE as NDJSON; "
                    "open it later with `tuiprof replay FILE`.",
    )
    parser.add_argument("file", type=pathlib.Path, metavar="FILE", help="where to write (appended)")
    add_target_arguments(parser)
    _add_interval(parser)
    parser.add_argument("--duration", type=float, metavar="S",
                        help="stop after this many seconds (default: until Ctrl-C)")
    parser.set_defaults(func=run)


async def _record(args: argparse.Namespace, out: TextIO) -> tuple[int, dict[str, str]]:
    """Record until ``--duration`` ends; the count of events and why each host is down at the end."""
    source, _ = source_from_args(args)
    count = 0
    down: dict[str, str] = {}

    def write(event: HostEvent) -> None:
        nonlocal count
        out.write(record.encode(event) + "\n")
        out.flush()
        count += 1
        if isinstance(event, HostUnreachable):
            down[event.host] = event.error
        else:
            down.pop(event.host, None)

    task = asyncio.ensure_future(source.run(write))
    try:
        await asyncio.wait_for(asyncio.shield(task), args.duration)
    except TimeoutError:
        pass
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return count, down


def run(args: argparse.Namespace) -> int:
    if args.duration is not None and args.duration <= 0:
        raise BadInputError(f"--duration {args.duration}: expected a positive number")
    try:
        out = args.file.open("a", encoding="utf-8")
    except OSError as exc:
        raise BadInputError(f"cannot write {args.file}: {exc.strerror}") from exc
    with out:
        try:
            count, down = asyncio.run(_record(args, out))
        except KeyboardInterrupt:
            return 0
    print(f"recorded {count} events to {args.file}", file=sys.stderr)
    for host, error in down.items():
        print(f"tuiprof record: {host}: unreachable: {error}", file=sys.stderr)
    return 1 if down else 0
