"""``tuiprof status``: one snapshot from each agent, as a table or as JSON.

Each host is asked for GetInfo, then its Watch stream is read until the first
snapshot whose per-second rates are filled in (an agent needs two samples for
rates, so this is at most about one interval after it starts), for at most
``--timeout`` seconds; a host that answered without rates by then is shown with
its rate fields unavailable. Exit status 0 when every host answered, else 1.

With ``--prometheus URL`` the rows come from Prometheus instead (one query per
column, aggregated by the server, no agent contacted): the same table and JSON
document, a host without series or with stale series unreachable with the reason, and each
host's ``hang`` from its hang series (what only the agent has null with the reason).
Exit status 2 for bad input, Prometheus not answering included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from agentd.address import AgentAddress
from tuiprof.analysis.slowdown import jobs_of_agents, slowdown_json
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.host_client import HostClient
from tuiprof.client.local import local_agent
from tuiprof.client.prometheus import FleetEvents, PrometheusClient, fetch_fleet
from tuiprof.client.prometheus_options import add_prometheus_arguments, prometheus_selection
from tuiprof.client.targets import add_target_arguments, addresses, connection
from tuiprof.errors import BadInputError
from tuiprof.model import convert, units
from tuiprof.model.cluster import ClusterState
from tuiprof.model.export import cluster_document
from tuiprof.model.behaviour import has_rates
from tuiprof.model.messages import HangLevel, HangStatus
from tuiprof.model.summary import HostSummary
from tuiprof.model.values import Unavailable
from tuiprof.tui.text import pair, reading


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status", help="print one snapshot of each host (table or --json)",
        description="One snapshot from each agent (rates filled in), as a table or as one "
                    "JSON document; exit 0 when every host answered, 1 otherwise.",
    )
    add_target_arguments(parser)
    add_prometheus_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument(
        "--timeout", type=float, default=5.0, metavar="S",
        help="seconds to wait for each host (default 5)",
    )
    parser.set_defaults(func=run)


async def gather(targets: list[AgentAddress], options: ConnectionOptions, timeout: float) -> ClusterState:
    """Ask every host at once; one slow host costs at most ``timeout``, not more."""
    cluster = ClusterState([str(a) for a in targets])

    await asyncio.gather(
        *(HostClient(a, options, cluster.apply).once(has_rates, timeout) for a in targets)
    )
    return cluster


async def from_prometheus(args: argparse.Namespace) -> tuple[ClusterState, dict[str, HangStatus]]:
    """One refresh of the Prometheus fleet view, as the cluster state the agents would give,
    and the hung or suspect hosts' verdicts (by address)."""
    selection = prometheus_selection(args)
    events = FleetEvents(lambda node: str(AgentAddress(node, args.port)))
    cluster = ClusterState(events.address_of(node) for node in selection.expected)
    async with PrometheusClient(args.prometheus, timeout=args.timeout) as client:
        view = await fetch_fleet(client, selection)
    for event in events.events(view):
        cluster.apply(event)
    cluster.tick(view.evaluated_at)
    return cluster, {events.address_of(node): status for node, status in view.hangs.items()}


NO_HANG_SERIES = "no tuiprof_hang_status series in Prometheus: the agent's hang detection is off"
NO_FREE_TEXT = ("not in Prometheus: labels carry no free text (the agent's own explanation: "
                "`tuiprof status HOST` without --prometheus)")
ONLY_TROUBLED = ("read from Prometheus only for hung or suspect hosts (the agent's own: "
                 "`tuiprof status HOST` without --prometheus)")


def prometheus_hang(level: HangLevel, status: HangStatus | None) -> dict[str, Any]:
    """A host's ``hang`` section of the JSON document from Prometheus: the keys the agent's
    snapshot gives, what Prometheus does not have null with its reason in ``unavailable``;
    ``ranks`` of a troubled host are its hung or suspect ones (those the banner reads)."""
    if level == HangLevel.UNSPECIFIED:
        return {"level": None, "since_unix_ns": None, "explanation": None, "ranks": None,
                "unavailable": dict.fromkeys(("level", "since_unix_ns", "explanation", "ranks"), NO_HANG_SERIES)}
    if status is None:
        return {"level": level, "since_unix_ns": None, "explanation": None, "ranks": None,
                "unavailable": {"since_unix_ns": ONLY_TROUBLED, "explanation": NO_FREE_TEXT, "ranks": ONLY_TROUBLED}}
    return {"level": status.level, "since_unix_ns": status.since_unix_ns, "explanation": None,
            "ranks": [_without_explanation(convert.to_json(verdict)) for verdict in status.ranks],
            "unavailable": {"explanation": NO_FREE_TEXT}}


def _without_explanation(verdict: dict[str, Any]) -> dict[str, Any]:
    return verdict | {"explanation": None, "unavailable": verdict.get("unavailable", {}) | {"explanation": NO_FREE_TEXT}}


def document(cluster: ClusterState, hangs: dict[str, HangStatus] | None, embedded: bool = False) -> dict[str, Any]:
    """The ``--json`` document; ``hangs``: from Prometheus (no snapshot: ``hang`` from its series);
    ``embedded``: the one host is this one, through an embedded agent, named by its host name (the
    agent's ephemeral port is gone once the command ends)."""
    result = cluster_document(cluster)
    for entry, state in zip(result["hosts"], cluster.hosts(), strict=True):
        if hangs is not None and state.summary is not None:
            entry["hang"] = prometheus_hang(state.summary.hang_level, hangs.get(state.address))
        if embedded and state.info is not None:
            entry["host"] = state.info.hostname
    result["jobs"] = jobs_document(cluster)
    return result


def jobs_document(cluster: ClusterState) -> list[dict[str, Any]]:
    """Every job with ranks on the hosts, with its slowdown verdict (the agents' own; null when healthy)."""
    messages = [state.message for state in cluster.hosts() if state.message is not None]
    verdicts = jobs_of_agents(messages)
    ranks: dict[str, list[str]] = {}
    for message in messages:
        for rank in message.ranks:
            ranks.setdefault(rank.job_id, []).append(message.hostname)
    return [{"job_id": job_id, "ranks": len(hosts), "hosts": sorted(set(hosts)),
             "slowdown": slowdown_json(verdicts.get(job_id))}
            for job_id, hosts in sorted(ranks.items())]


async def _status(args: argparse.Namespace) -> tuple[ClusterState, dict[str, HangStatus] | None, bool]:
    """The hosts' state; the hung or suspect hosts' verdicts where they come from Prometheus; whether the
    one host is this one, through an embedded agent."""
    if args.prometheus or args.match is not None:
        return *await from_prometheus(args), False
    options = connection(args, timeout=args.timeout)
    targets = addresses(args)
    if targets:
        return await gather(targets, options, args.timeout), None, False
    async with local_agent() as address:
        return await gather([address], options, args.timeout), None, True


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise BadInputError(f"--timeout {args.timeout}: expected a positive number of seconds")
    cluster, hangs, embedded = asyncio.run(_status(args))
    if args.json:
        json.dump(document(cluster, hangs, embedded), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_table(table(cluster))
        for line in notes(cluster):
            print(line)
    return 0 if all(state.reachable for state in cluster.hosts()) else 1


def _cells(summary: HostSummary) -> list[Text]:
    return [
        reading(summary.cpu_percent, units.percent),
        reading(summary.memory_percent, units.percent),
        reading(summary.gpu_count, units.plain),
        pair(summary.gpu_util_mean, summary.gpu_util_min, units.percent),
        pair(summary.sm_active_mean, summary.sm_active_min, units.percent),
        reading(summary.power_watts, units.watts),
        pair(summary.gpu_memory_used_bytes, summary.gpu_memory_total_bytes, units.bytes_),
        reading(summary.nccl_busbw_bytes_per_s, units.bytes_per_s),
        reading(summary.step_time_seconds, units.seconds),
        Text(summary.hang_level or units.NA),
    ]


def table(cluster: ClusterState) -> Table:
    result = Table(title="tuiprof status")
    for name in ("Host", "State", "CPU", "Mem", "GPUs", "Util avg/min", "SM avg/min",
                 "Power", "GPU mem", "NCCL busbw", "Step", "Hang"):
        result.add_column(name, justify="left" if name in ("Host", "State") else "right",
                          no_wrap=name in ("Host", "State"))
    shared = cluster.shared_names()
    for state in cluster.hosts():
        if state.summary is None:
            result.add_row(state.address, "[bold red]DOWN[/]", *[""] * 10)
        else:  # unreachable with figures: stale in Prometheus, its last figures shown
            state_cell = "[green]up[/]" if state.reachable else "[bold red]DOWN[/]"
            result.add_row(cluster.label(state, shared), state_cell, *_cells(state.summary))
    return result


UNLIMITED_WIDTH = 10_000


def print_table(rendered: Table) -> None:
    """On a terminal fit its width; into a pipe or file the whole table, never cut to "C…"."""
    console = Console()
    if not console.is_terminal:
        console.width = Measurement.get(console, console.options.update_width(UNLIMITED_WIDTH), rendered).maximum
    console.print(rendered)


def notes(cluster: ClusterState) -> list[str]:
    """Why each DOWN host is down and each n/a cell is n/a, one line per host and reason."""
    lines = []
    shared = cluster.shared_names()
    for state in cluster.hosts():
        if state.summary is None:
            lines.append(f"{state.address}: unreachable: {state.error}")
            continue
        if not state.reachable:
            lines.append(f"{cluster.label(state, shared)}: unreachable: {state.error}")
        reasons: dict[str, list[str]] = {}
        for field in HostSummary.__dataclass_fields__:
            value = getattr(state.summary, field)
            if isinstance(value, Unavailable):
                reasons.setdefault(value.reason, []).append(field)
        for reason, fields in reasons.items():
            lines.append(f"{cluster.label(state, shared)}: n/a {', '.join(fields)}: {reason}")
    return lines
