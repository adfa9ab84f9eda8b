"""The console: ``tuiprof`` (this host), ``tuiprof connect HOST…``, ``tuiprof --slurm-job ID``.

Without a host the console starts an agent inside its own process (no daemon to
install first) and watches it like any other.
"""

from __future__ import annotations

import argparse
import sys

from agentd.token import TokenFileError
from tuiprof.client.settings import SettingsFile
from tuiprof.client.sources import EventSource, LiveSource, LocalSource
from tuiprof.client.targets import (
    TargetError, add_connection_arguments, add_target_arguments, addresses, connection,
)


def add_top_level_arguments(parser: argparse.ArgumentParser) -> None:
    """``tuiprof [--slurm-job ID] [--port P] [--token-file F] [--tls-ca F] [--interval S]``."""
    add_target_arguments(parser, hosts=False)
    _add_interval(parser)


def _add_interval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval", type=float, default=0.0, metavar="S",
        help="seconds between snapshots (default: each agent's own interval; the console "
             "remembers the interval and uses it when this is not given)",
    )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "connect", help="open the console on these agents",
        description="Open the console on the agents at HOST[:PORT] (default port 1779).",
    )
    parser.add_argument("hosts", nargs="+", metavar="HOST[:PORT]", help="agents to watch")
    parser.add_argument("--slurm-job", metavar="JOBID", help="also watch every node of this SLURM job")
    add_connection_arguments(parser)
    _add_interval(parser)
    parser.set_defaults(func=run)


def source_from_args(args: argparse.Namespace) -> tuple[EventSource, object]:
    """The live source the arguments name (this host when they name none), and its options."""
    if args.interval < 0:
        raise TargetError(f"--interval {args.interval}: expected a positive number of seconds")
    options = connection(args, interval_ms=round(args.interval * 1000))
    targets = addresses(args)
    source: EventSource = LiveSource(targets, options) if targets else LocalSource(options)
    return source, options


def run(args: argparse.Namespace) -> int:
    settings_file = SettingsFile()
    if not args.interval:  # not given: the remembered one (a bad file is reported inside the console)
        args.interval = settings_file.load()[0].interval_seconds
    try:
        source, options = source_from_args(args)
    except (TargetError, TokenFileError) as exc:
        print(f"tuiprof: {exc}", file=sys.stderr)
        return 2
    if not sys.stdout.isatty():
        print("tuiprof: stdout is not a terminal; for scripts use `tuiprof status --json` "
              "(under SLURM use `srun --pty`)", file=sys.stderr)
        return 2
    from tuiprof.tui.app import TuiprofApp  # Textual only for the interactive console

    app = TuiprofApp(source, connection=options, settings_file=settings_file)  # type: ignore[arg-type]
    app.remember(interval_seconds=args.interval)
    app.run()
    return app.return_code or 0
