"""``tuiprof stacks``: every rank's stacks, merged into one tree, and the odd ranks named.

Each agent takes its local ranks' stacks (py-spy) and pre-merges them; this
command merges the hosts' trees, lists the equivalence classes (ranks with the
same stack) smallest first, and names the suspects, using the ranks' in-flight
collectives where the hook library reports them. A process without a rank
number (started without ``RANK``) is in the tree under its pid. Exit status 0
when every host answered and none reports a hang, 1 when some host did not
answer, 2 on bad arguments (a ``--pid`` that is not a process of yours under
``tuiprof run`` included), 3 when an agent reports a rank of the job hung or
suspect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import hang_level
from agentd.stacks import ranksets
from agentd.stacks.verdicts import summarize, who
from agentd.text import printable
from tuiprof.analysis.flamegraph import flamegraph_svg
from tuiprof.analysis.stacks_report import (
    StacksReport, cached_note, duplicate_ranks, folded, job_report, job_verdicts, processes_named, render_text,
    report_json,
)
from tuiprof.client.local import local_agent
from tuiprof.client.stacks import gather_stacks
from tuiprof.client.targets import add_target_arguments, addresses, connection
from tuiprof.errors import BadInputError
from tuiprof.model.stacks import HostStacks


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
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--job", metavar="ID",
                        help="only the ranks of this job (SLURM job id, torchelastic run id or "
                             "TUIPROF_JOB_ID); needed when the hosts run several jobs")
    chosen.add_argument("--pid", metavar="PID[,PID...]", type=pid_list,
                        help="only these processes of the one host asked (started with `tuiprof run`, "
                             "with or without RANK), as py-spy dump --pid")
    parser.add_argument("--incident", action="store_true",
                        help="the stacks each agent took when it detected a hang, instead of new ones")
    parser.add_argument("--folded", action="store_true", help="print folded stacks (for flame-graph tools)")
    parser.add_argument("--svg", metavar="FILE", help="also write a flame graph of the merged tree to FILE")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for each host (default 60)")
    parser.set_defaults(func=run)


def pid_list(text: str) -> list[int]:
    """``4242,4243`` as pids (argparse reports a ValueError as an invalid --pid value)."""
    pids = [int(part) for part in text.split(",")]
    if any(pid <= 0 for pid in pids):
        raise ValueError(text)
    return pids


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
                 "dump_seconds": round(r.dump_seconds, 4), "error": r.error or None,
                 "cached": r.cached, "age_seconds": round(r.age_seconds, 3),
                 "next_dump_in_seconds": round(r.next_dump_in_seconds, 3) if r.cached else None}
                for r in reply.ranks
            ],
        )
    if host.snapshot is not None and host.snapshot.hang.level != pb.HANG_LEVEL_UNSPECIFIED:
        hang = host.snapshot.hang
        mine = job_verdicts(host)
        out["hang"] = {
            "level": hang_level(hang.level), "since_unix_ns": hang.since_unix_ns, "explanation": hang.explanation,
            "ranks": [{"rank": v.rank if v.HasField("rank") else None, "pid": v.pid, "level": hang_level(v.level),
                       "explanation": v.explanation} for v in mine],
        }
    return out


def _host_lines(hosts: list[HostStacks]) -> list[str]:
    lines = []
    for host in hosts:
        if host.error:
            lines.append(f"{host.host}: no stacks: {host.error}")
            continue
        if host.reply is None:
            lines.append(f"{host.host}: no ranks here")
            continue
        processes = list(host.reply.ranks)
        lines.append(f"{host.host}: {processes_named(processes) or 'no ranks'}, {len(processes)} processes")
        lines.extend(f"  {who(p)}{f' (pid {p.pid})' if p.HasField('rank') else ''}: {p.error}"
                     for p in processes if p.error)
        cached = [r for r in host.reply.ranks if r.cached]
        if cached:
            lines.append(f"  {cached_note(cached)}")
        verdicts = summarize(job_verdicts(host))
        if verdicts:
            lines.append(f"  {verdicts}")
    return lines


async def _gather(args: argparse.Namespace) -> list[HostStacks]:
    options = connection(args, timeout=args.timeout)
    targets = addresses(args)
    if args.pid and len(targets) > 1:
        raise BadInputError(f"--pid names processes of one host (pids repeat across hosts); {len(targets)} "
                            "hosts given: name one HOST, or none for this host")
    if targets:
        return await gather_stacks(targets, options, not args.incident, args.native, args.timeout, args.job,
                                   args.pid)
    async with local_agent() as address:
        return await gather_stacks([address], options, not args.incident, args.native, args.timeout, args.job,
                                   args.pid)


NO_RANKS = "no ranks on these hosts: no stacks to merge (start the job with `tuiprof run`)"
HANG_EXIT_STATUS = 3


def exit_status(hosts: list[HostStacks]) -> int:
    """3: a hang is reported (what scripts wait for); else 1: a host did not answer; else 0."""
    if any(v.level in (pb.HANG_LEVEL_SUSPECT, pb.HANG_LEVEL_HUNG) for h in hosts for v in job_verdicts(h)):
        return HANG_EXIT_STATUS
    return 0 if all(h.error is None for h in hosts) else 1


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise BadInputError(f"--timeout {args.timeout}: expected a positive number of seconds")
    hosts = asyncio.run(_gather(args))
    report = job_report(hosts, lines=args.lines, native=args.native)
    if report.merged.ranks == 0 and not args.json:
        print("\n".join(_host_lines(hosts) + [f"tuiprof stacks: {NO_RANKS}"]), file=sys.stderr)
        return exit_status(hosts)
    if args.svg:
        try:
            with open(args.svg, "w") as out:
                out.write(flamegraph_svg(report.merged, title=f"tuiprof stacks: {', '.join(h.host for h in hosts)}"))
        except OSError as exc:
            raise BadInputError(f"cannot write --svg {args.svg}: {exc.strerror}") from exc
    if args.json:
        json.dump(document(hosts, report), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.folded:
        sys.stdout.write(printable(folded(report.merged), keep_lines=True))
    else:
        # Frames, thread names and errors are other users' text: escaped again on the way to the terminal.
        text = "\n".join(_host_lines(hosts) + [f"warning: {w}" for w in duplicate_ranks(hosts)]) + "\n\n"
        sys.stdout.write(printable(text + render_text(report), keep_lines=True))
    return exit_status(hosts)
