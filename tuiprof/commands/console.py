"""The console: ``tuiprof`` (this host), ``tuiprof connect HOST…``, ``tuiprof --slurm-job ID``,
``tuiprof --prometheus URL [--slurm-job ID | --match REGEX]``.

Without a host the console starts an agent inside its own process (no daemon to
install first) and watches it like any other. With ``--prometheus`` the cluster
view comes from Prometheus and only the hosts opened are watched over gRPC.
Exit status 2 for bad input (a bad option, a SLURM job that cannot be resolved,
a Prometheus that does not answer or a pattern it refuses), said in one line.
"""

from __future__ import annotations

import argparse
import sys

from tuiprof.client.prometheus import DEFAULT_REFRESH_S, PrometheusSource
from tuiprof.client.prometheus_options import add_prometheus_arguments, check_prometheus, prometheus_selection
from tuiprof.client.settings import SettingsFile
from tuiprof.client.sources import EventSource, LiveSource, LocalSource
from tuiprof.client.targets import (
    TargetError, add_connection_arguments, add_target_arguments, addresses, connection,
)
from tuiprof.errors import BadInputError


def add_top_level_arguments(parser: argparse.ArgumentParser) -> None:
    """``tuiprof [--slurm-job ID] [--port P] [--token-file F] [--tls-ca F] [--interval S]
    [--prometheus URL [--match REGEX]]``."""
    add_target_arguments(parser, hosts=False)
    _add_interval(parser)
    add_prometheus_arguments(parser)


def _add_interval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval", type=float, default=0.0, metavar="S",
        help="seconds between snapshots (default: each agent's own interval; the console "
             "remembers the interval and uses it when this is not given); with --prometheus, "
             f"seconds between refreshes (default {DEFAULT_REFRESH_S:g})",
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


def _fleet_mode(args: argparse.Namespace) -> bool:
    """Whether the cluster view comes from Prometheus (``connect`` has no such options)."""
    return bool(getattr(args, "prometheus", None)) or getattr(args, "match", None) is not None


def source_from_args(args: argparse.Namespace) -> tuple[EventSource, object]:
    """The live source the arguments name (this host when they name none), and its options."""
    if args.interval < 0:
        raise TargetError(f"--interval {args.interval}: expected a positive number of seconds")
    if _fleet_mode(args):  # --interval is the refresh; opened hosts stream at their agent's own interval
        options = connection(args)
        selection = prometheus_selection(args)
        check_prometheus(args.prometheus, options.timeout)
        fleet = PrometheusSource(args.prometheus, selection, options, args.port,
                                 refresh_s=args.interval or DEFAULT_REFRESH_S)
        return fleet, options
    options = connection(args, interval_ms=round(args.interval * 1000))
    targets = addresses(args)
    source: EventSource = LiveSource(targets, options) if targets else LocalSource(options)
    return source, options


def run(args: argparse.Namespace) -> int:
    settings_file = SettingsFile()
    fleet = _fleet_mode(args)
    if not args.interval and not fleet:  # not given: the remembered one (a bad file is reported inside the console)
        args.interval = settings_file.load()[0].interval_seconds
    source, options = source_from_args(args)
    if not sys.stdout.isatty():
        raise BadInputError("stdout is not a terminal; for scripts use `tuiprof status --json` "
                            "(under SLURM use `srun --pty`)")
    from tuiprof.tui.app import TuiprofApp  # Textual only for the interactive console

    app = TuiprofApp(source, connection=options, settings_file=settings_file,  # type: ignore[arg-type]
                     open_only_host=not fleet and len(source.hosts) <= 1)
    if not fleet:  # the refresh of Prometheus mode is not an agent interval to remember
        app.remember(interval_seconds=args.interval)
    app.run()
    return app.return_code or 0
