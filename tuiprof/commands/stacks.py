"""``tuiprof stacks``: every rank's stacks, merged into one tree, and the odd ranks named.

Each agent takes its local ranks' stacks (py-spy) and pre-merges them; this
command merges the hosts' trees, lists the equivalence classes (ranks with the
same stack) smallest first, and names the suspects, using the ranks' in-flight
collectives where the hook library reports them. Exit status 0 when every host
answered, 1 when some did not, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from dataclasses import dataclass

import grpc

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.stacks import ranksets
from tuiprof.analysis.flamegraph import flamegraph_svg
from agentd.stacks.merge import merge, merge_trees, project
from agentd.stacks.collectives import behind, findings
from agentd.stacks.wire import (
    collectives_from_ranks, samples_from_ranks, tree_from_proto, tree_to_proto,
)
from tuiprof.analysis.stacks_report import StacksReport, build_report, folded, render_text, report_json
from agentd.stacks.verdicts import summarize
from agentd.address import AgentAddress
from agentd.token import TokenFileError
from tuiprof.client.channel import open_channel
from tuiprof.client.errors import describe_rpc_error
from tuiprof.client.host_client import ConnectionOptions
from tuiprof.client.local import LocalAgentError, local_agent
from tuiprof.client.targets import TargetError, add_target_arguments, addresses, connection


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stacks", help="merged stacks of every rank; names the rank that is elsewhere",
        description=__doc__.split("\n\n")[0],
    )
    add_target_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document (schema in the README)")
    parser.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    parser.add_argument("--lines", action="store_true",
                        help="tell frames apart by line number too (more, smaller classes)")
    parser.add_argument("--job", metavar="ID",
                        help="only the ranks of this job (SLURM job id, torchelastic run id or "
                             "TUIPROF_JOB_ID); needed when the hosts run several jobs")
    parser.add_argument("--incident", action="store_true",
                        help="the stacks each agent took when it detected a hang, instead of new ones")
    parser.add_argument("--folded", action="store_true", help="print folded stacks (for flame-graph tools)")
    parser.add_argument("--svg", metavar="FILE", help="also write a flame graph of the merged tree to FILE")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for each host (default 60)")
    parser.set_defaults(func=run)


@dataclass
class HostStacks:
    """One agent's answer: its ranks' stacks and its latest snapshot, or why not."""

    host: str
    reply: pb.StacksReply | None = None
    snapshot: pb.HostSnapshot | None = None
    error: str | None = None


class JobChoiceError(ValueError):
    """The hosts run several jobs and none was chosen (their rank numbers overlap)."""

    def __init__(self, jobs: dict[str, int]) -> None:
        self.jobs = jobs  # job id -> live ranks
        listed = ", ".join(f"{job or '(no job id)'} ({count} ranks)" for job, count in sorted(jobs.items()))
        super().__init__(f"these hosts run several jobs: {listed}; choose one with --job ID")


async def gather_stacks(
    targets: list[AgentAddress], options: ConnectionOptions, take_now: bool, native: bool, timeout: float,
    job: str | None = None,
) -> list[HostStacks]:
    """Every host's newest snapshot, then every host's stacks of one job, hosts in parallel.

    The snapshots come first so that no process is dumped before it is known
    which job is meant; a slow host costs at most ``timeout`` per phase.
    """
    hosts = [HostStacks(str(a)) for a in targets]
    async with contextlib.AsyncExitStack() as stack:
        stubs = [pb_grpc.AgentStub(await stack.enter_async_context(open_channel(a, options.token, options.tls_ca)))
                 for a in targets]
        await asyncio.gather(*(_snapshot(stub, host, timeout) for stub, host in zip(stubs, hosts)))
        if job is None:
            job = single_job(hosts)
        await asyncio.gather(*(_stacks(stub, host, take_now, native, timeout, job)
                               for stub, host in zip(stubs, hosts) if host.error is None))
    return hosts


async def _snapshot(stub: pb_grpc.AgentStub, host: HostStacks, timeout: float) -> None:
    """The agent's newest snapshot: its ranks, their in-flight collectives, its hang verdict."""
    call = stub.Watch(pb.WatchRequest(), timeout=timeout)
    try:
        async for snapshot in call:
            host.snapshot = snapshot
            return
    except grpc.aio.AioRpcError as exc:
        host.error = describe_rpc_error(exc, timeout)
    finally:
        call.cancel()


async def _stacks(
    stub: pb_grpc.AgentStub, host: HostStacks, take_now: bool, native: bool, timeout: float, job: str | None
) -> None:
    pids = [r.pid for r in _live_ranks(host) if job is None or r.job_id == job]
    if not pids:
        return  # no rank (of this job) here: nothing to dump
    try:
        host.reply = await stub.GetStacks(
            pb.GetStacksRequest(take_now=take_now, native=native, pids=pids if take_now else []),
            timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        host.error = describe_rpc_error(exc, timeout)
        return
    if not take_now:
        _keep_only(host.reply, set(pids))


def _live_ranks(host: HostStacks) -> list[pb.RankStats]:
    return [r for r in host.snapshot.ranks if r.state != "exited"] if host.snapshot is not None else []


def _keep_only(reply: pb.StacksReply, pids: set[int]) -> None:
    """An incident's stacks reduced to ``pids``, re-merged from its raw per-rank stacks."""
    if {r.pid for r in reply.ranks} <= pids:
        return
    kept = [r for r in reply.ranks if r.pid in pids]
    del reply.ranks[:]
    reply.ranks.extend(kept)
    reply.merged.CopyFrom(tree_to_proto(merge(samples_from_ranks(kept))))


def single_job(hosts: list[HostStacks]) -> str | None:
    """The one job the hosts' live ranks belong to; several are refused (rank numbers would collide)."""
    jobs: dict[str, int] = {}
    for host in hosts:
        for rank in _live_ranks(host):
            jobs[rank.job_id] = jobs.get(rank.job_id, 0) + 1
    if len(jobs) > 1:
        raise JobChoiceError(jobs)
    return next(iter(jobs), None)


def job_report(hosts: list[HostStacks], lines: bool, native: bool) -> StacksReport:
    """The hosts' trees merged, projected to the wanted detail, with collective findings."""
    trees = [tree_from_proto(h.reply.merged) for h in hosts if h.reply is not None]
    merged = project(merge_trees(trees), lines=lines, native=native)
    pids = {(h.host, r.pid) for h in hosts if h.reply is not None for r in h.reply.ranks}
    ranks = [r for h in hosts if h.snapshot is not None for r in h.snapshot.ranks if (h.host, r.pid) in pids]
    collectives = collectives_from_ranks(ranks)
    return build_report(merged, findings(collectives), behind=behind(collectives))


def duplicate_ranks(hosts: list[HostStacks]) -> list[str]:
    """One warning per rank number that more than one process reported (merged as one rank)."""
    owners: dict[int, list[str]] = {}
    for host in hosts:
        for rank in host.reply.ranks if host.reply is not None else []:
            if rank.HasField("rank"):
                owners.setdefault(rank.rank, []).append(f"{host.host} pid {rank.pid}")
    return [
        f"rank {rank} is reported by {len(who)} processes ({', '.join(who)}); their stacks are merged "
        f"as one rank: check the job's RANK variables, or choose one job with --job"
        for rank, who in sorted(owners.items()) if len(who) > 1
    ]


def document(hosts: list[HostStacks], report: StacksReport) -> dict:
    doc = report_json(report)
    doc["hosts"] = [_host_json(h) for h in hosts]
    doc["warnings"] = duplicate_ranks(hosts)
    return doc


def _host_json(host: HostStacks) -> dict:
    out: dict = {"host": host.host, "error": host.error}
    if host.reply is not None:
        reply = host.reply
        out.update(
            hostname=reply.hostname,
            taken_unix_ns=reply.taken_unix_ns,
            incident=reply.incident,
            ranks=ranksets.fold(r.rank for r in reply.ranks if r.HasField("rank")),
            processes=[
                {"pid": r.pid, "rank": r.rank if r.HasField("rank") else None,
                 "dump_seconds": round(r.dump_seconds, 4), "error": r.error or None}
                for r in reply.ranks
            ],
        )
    if host.snapshot is not None and host.snapshot.hang.level:
        hang = host.snapshot.hang
        mine = job_verdicts(host)
        out["hang"] = {
            "level": hang.level, "since_unix_ns": hang.since_unix_ns, "explanation": hang.explanation,
            "ranks": [{"rank": v.rank if v.HasField("rank") else None, "pid": v.pid, "level": v.level,
                       "explanation": v.explanation} for v in mine],
        }
    return out


def job_verdicts(host: HostStacks) -> list[pb.RankVerdict]:
    """The host's rank verdicts for the processes whose stacks were taken (the chosen job)."""
    pids = {r.pid for r in host.reply.ranks} if host.reply is not None else set()
    return [v for v in host.snapshot.hang.ranks if v.pid in pids] if host.snapshot is not None else []


def _host_lines(hosts: list[HostStacks]) -> list[str]:
    lines = []
    for host in hosts:
        if host.error:
            lines.append(f"{host.host}: no stacks: {host.error}")
            continue
        if host.reply is None:
            lines.append(f"{host.host}: no ranks here")
            continue
        doc = _host_json(host)
        lines.append(f"{host.host}: ranks [{doc['ranks']}], {len(doc['processes'])} processes")
        for proc in doc["processes"]:
            if proc["error"]:
                lines.append(f"  pid {proc['pid']} (rank {proc['rank']}): {proc['error']}")
        verdicts = summarize(job_verdicts(host))
        if verdicts:
            lines.append(f"  {verdicts}")
    return lines


async def _gather(args: argparse.Namespace) -> list[HostStacks]:
    options = connection(args, timeout=args.timeout)
    targets = addresses(args)
    if targets:
        return await gather_stacks(targets, options, not args.incident, args.native, args.timeout, args.job)
    async with local_agent() as address:
        return await gather_stacks([address], options, not args.incident, args.native, args.timeout, args.job)


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        print(f"tuiprof stacks: --timeout {args.timeout}: expected a positive number of seconds", file=sys.stderr)
        return 2
    try:
        hosts = asyncio.run(_gather(args))
    except (TargetError, TokenFileError, LocalAgentError, JobChoiceError) as exc:
        print(f"tuiprof stacks: {exc}", file=sys.stderr)
        return 2
    report = job_report(hosts, lines=args.lines, native=args.native)
    if args.svg:
        try:
            with open(args.svg, "w") as out:
                out.write(flamegraph_svg(report.merged, title=f"tuiprof stacks: {', '.join(h.host for h in hosts)}"))
        except OSError as exc:
            print(f"tuiprof stacks: cannot write --svg {args.svg}: {exc.strerror}", file=sys.stderr)
            return 2
    if args.json:
        json.dump(document(hosts, report), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.folded:
        sys.stdout.write(folded(report.merged))
    else:
        sys.stdout.write("\n".join(_host_lines(hosts) + [f"warning: {w}" for w in duplicate_ranks(hosts)]) + "\n\n")
        sys.stdout.write(render_text(report))
    return 0 if all(h.error is None for h in hosts) else 1
