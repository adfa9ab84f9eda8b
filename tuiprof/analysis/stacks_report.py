"""What a merged stack tree says, as JSON, as an indented tree, and as folded stacks.

One report shape serves ``tuiprof stacks --json``, its text output, and the
console's export keys, so they never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.stacks import ranksets
from agentd.stacks.collectives import behind, findings
from agentd.stacks.merge import (
    EquivalenceClass,
    Frame,
    MergedStacks,
    Node,
    Suspect,
    equivalence_classes,
    find_suspects,
    merge,
    merge_trees,
    project,
)
from agentd.stacks.wire import collectives_from_ranks, thread_samples, tree_from_proto
from tuiprof.model.stacks import HostStacks


def processes_named(processes: list[pb.RankStacks]) -> str:
    """``ranks [0-3]``, ``pid 4242``, ``ranks [0-3] and pids 4242,4243``: processes by rank, else by pid."""
    numbers = [p.rank for p in processes if p.HasField("rank")]
    pids = [str(pid) for pid in sorted(p.pid for p in processes if not p.HasField("rank"))]
    parts = [f"ranks [{ranksets.fold(numbers)}]"] if numbers else []
    if pids:
        parts.append(f"{'pid' if len(pids) == 1 else 'pids'} {','.join(pids)}")
    return " and ".join(parts)


def cached_note(ranks: list[pb.RankStacks]) -> str:
    """One line for the ranks served their last dump again: how old, and when a new one may be taken."""
    oldest = max(r.age_seconds for r in ranks)
    latest = max(r.next_dump_in_seconds for r in ranks)
    return (f"{processes_named(ranks)}: stacks of their last dump, up to {oldest:.1f} s old (py-spy stops a rank while it "
            f"reads it, so after a dump a rank is left alone for 50× the dump's time); new stacks in {latest:.1f} s")


def frame_of(node: Node) -> Frame:
    """The frame of a node below a thread group's root (only roots are frame-less)."""
    if node.frame is None:
        raise ValueError("a thread group's root has no frame")
    return node.frame


@dataclass(frozen=True)
class StacksReport:
    merged: MergedStacks
    thread: str | None
    classes: list[EquivalenceClass]
    suspects: list[Suspect]


def build_report(
    merged: MergedStacks, collective_findings: dict[int, str] | None = None, thread: str | None = None,
    behind: int = 0,
) -> StacksReport:
    """Classes and suspects of ``thread`` (default: the main thread); ``behind``: see ``find_suspects``."""
    thread = thread or merged.main_thread()
    classes = equivalence_classes(merged, thread)
    return StacksReport(merged, thread, classes, find_suspects(classes, collective_findings, behind, merged.unranked))


def job_report(hosts: list[HostStacks], lines: bool, native: bool) -> StacksReport:
    """The hosts' trees merged with the processes that have no rank number, projected to the wanted
    detail, with collective findings."""
    trees = [tree_from_proto(h.reply.merged) for h in hosts if h.reply is not None]
    merged = project(merge_trees([*trees, _unranked_tree(hosts)]), lines=lines, native=native)
    pids = {(h.host, r.pid) for h in hosts if h.reply is not None for r in h.reply.ranks}
    ranks = [r for h in hosts if h.snapshot is not None for r in h.snapshot.ranks if (h.host, r.pid) in pids]
    collectives = collectives_from_ranks(ranks)
    return build_report(merged, findings(collectives), behind=behind(collectives))


def _unranked_tree(hosts: list[HostStacks]) -> MergedStacks:
    """The processes without a rank number (a job started without ``RANK``), each under a bit above
    every rank number of the job and named by its pid (``pid 4242``; ``node-b pid 4242`` when such
    processes come from several hosts, whose pids may repeat)."""
    replies = [h.reply for h in hosts if h.reply is not None]
    first = max((r.rank + 1 for reply in replies for r in reply.ranks if r.HasField("rank")), default=0)
    processes = [(reply.hostname, r) for reply in replies for r in reply.ranks
                 if not (r.HasField("rank") and r.rank >= 0) and r.threads]
    several_hosts = len({hostname for hostname, _ in processes}) > 1
    samples = []
    names: dict[int, str] = {}
    for bit, (hostname, process) in enumerate(processes, start=first):
        names[bit] = f"{hostname} pid {process.pid}" if several_hosts else f"pid {process.pid}"
        samples.extend(thread_samples(bit, process))
    tree = merge(samples)
    tree.unranked = names
    return tree


def job_verdicts(host: HostStacks) -> list[pb.RankVerdict]:
    """The host's rank verdicts for the processes whose stacks were taken (the chosen job)."""
    pids = {r.pid for r in host.reply.ranks} if host.reply is not None else set()
    return [v for v in host.snapshot.hang.ranks if v.pid in pids] if host.snapshot is not None else []


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


def report_json(report: StacksReport) -> dict[str, Any]:
    """``{"ranks", "thread", "classes", "suspects", "tree"}`` (the documented schema)."""
    return {
        "ranks": report.merged.ranks.bit_count(),
        "thread": report.thread,
        "classes": [
            {
                "ranks": ranksets.fold(c.ranks, report.merged.unranked),
                "count": c.count,
                "leaf": c.leaf.label() if c.leaf else None,
                "where": c.where(),
                "frames": [f.label() for f in c.frames],
            }
            for c in report.classes
        ],
        "suspects": [{"ranks": ranksets.fold(s.ranks, report.merged.unranked), "reason": s.reason}
                     for s in report.suspects],
        "tree": [
            _node_json(report.merged, node, thread)
            for thread, node in sorted(report.merged.threads.items())
        ],
    }


def _node_json(merged: MergedStacks, root: Node, thread: str) -> dict[str, Any]:
    top: dict[str, Any] = {"thread": thread}
    pending = [(root, top)]
    while pending:
        node, out = pending.pop()
        if node.frame is not None:
            f = node.frame
            out.update(function=f.function, file=f.file, line=f.line, native=f.native, label=f.label())
        out.update(
            ranks=ranksets.fold(node.ranks, merged.unranked),
            count=node.ranks.bit_count(),
            missing=ranksets.fold(merged.missing(node), merged.unranked),
        )
        children: list[dict[str, Any]] = []
        out["children"] = children
        for child in node.sorted_children():
            children.append({})
            pending.append((child, children[-1]))
    return top


def render_text(report: StacksReport, max_width: int = 160) -> str:
    """The tree of every thread group, then the classes and the suspects."""
    lines: list[str] = []
    total = report.merged.ranks.bit_count()
    unranked = report.merged.unranked
    for thread, root in sorted(report.merged.threads.items(), key=lambda kv: kv[0] != report.thread):
        lines.append(f"{thread}  [{ranksets.fold_short(root.ranks, unranked=unranked)}] "
                     f"{root.ranks.bit_count()}/{total} ranks")
        pending = _children_last_first(root, "")
        while pending:
            node, indent, last = pending.pop()
            missing = report.merged.missing(node)
            text = (f"{indent}{'└─ ' if last else '├─ '}{frame_of(node).label()}  "
                    f"[{ranksets.fold_short(node.ranks, unranked=unranked)}]")
            if missing:
                text += f"  not: [{ranksets.fold_short(missing, unranked=unranked)}]"
            lines.append(text[:max_width])
            pending.extend(_children_last_first(node, indent + ("   " if last else "│  ")))
        lines.append("")
    lines.append(f"Equivalence classes of {report.thread} (smallest first):")
    for c in report.classes:
        lines.append(f"  {c.count:>5}  [{ranksets.fold_short(c.ranks, unranked=unranked)}]  {c.where()}")
    if report.suspects:
        lines.append("Suspects:")
        lines.extend(f"  {s.reason}" for s in report.suspects)
    else:
        count = len(report.classes)
        lines.append(f"No suspect: no rank stands apart ({count} distinct stack{'' if count == 1 else 's'}).")
    return "\n".join(lines) + "\n"


def _children_last_first(node: Node, indent: str) -> list[tuple[Node, str, bool]]:
    """(child, indent, is-last) in reverse display order, for a pop-from-the-end walk."""
    kids = node.sorted_children()
    return [(child, indent, i == len(kids) - 1) for i, child in enumerate(kids)][::-1]


def folded(merged: MergedStacks) -> str:
    """Folded stacks (``thread;outer;...;inner COUNT``), one line per class, for flame-graph tools."""
    lines = []
    for thread in sorted(merged.threads):
        for c in equivalence_classes(merged, thread):
            parts = [thread, *(f.label() for f in c.frames)]
            lines.append(";".join(p.replace(";", ":") for p in parts) + f" {c.count}")
    return "\n".join(sorted(lines)) + ("\n" if lines else "")
