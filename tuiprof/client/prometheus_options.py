"""``--prometheus URL`` and ``--match REGEX``: the fleet options ``tuiprof`` and ``tuiprof status`` share."""

from __future__ import annotations

import argparse
import asyncio

from tuiprof.client.prometheus import HostSelection, PrometheusClient
from tuiprof.client.targets import TargetError, addresses


def add_prometheus_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus", metavar="URL",
        help="read the cluster view from this Prometheus (or Thanos, Mimir, VictoriaMetrics) "
             "scraping the agents, e.g. http://prometheus:9090; agents are reached over gRPC only "
             "for a host you open, traces and stacks",
    )
    parser.add_argument(
        "--match", metavar="REGEX",
        help="with --prometheus: only hosts whose hostname label matches REGEX (default: every host)",
    )


def prometheus_selection(args: argparse.Namespace) -> HostSelection:
    """The hosts ``--slurm-job``, the host list or ``--match`` name (TargetError, BadPatternError when
    unusable).

    Expected hosts (a job's nodes, named hosts) are shown even when Prometheus has no series of them.
    """
    if args.match is not None and not args.prometheus:
        raise TargetError("--match selects hosts in Prometheus; give --prometheus URL too")
    nodes = [address.host for address in addresses(args)]
    if args.match is not None:
        if nodes:
            raise TargetError("give either --match REGEX or the hosts (HOST…, --slurm-job), not both")
        return HostSelection.matching(args.match)
    return HostSelection(expected=tuple(nodes))


async def _check(url: str, timeout: float) -> None:
    async with PrometheusClient(url, timeout) as client:
        await client.check()


def check_prometheus(url: str, timeout: float) -> None:
    """Raise PrometheusError unless ``url`` answers PromQL (one clear line before anything starts)."""
    asyncio.run(_check(url, timeout))
