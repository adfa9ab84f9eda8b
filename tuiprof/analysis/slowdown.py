"""Slow jobs across every watched host: the agents' verdict code, fed with all their ranks at once.

Each agent judges the ranks of its own host (``HostSnapshot.slowdowns``). A job
on several hosts needs its collectives joined across them: ``ClusterSlowdowns``
runs the same judge (``agentd.slowdown.verdict``) over the latest snapshot of
every host, once per console refresh, each host's arrivals once. The banner
line and the ``--json`` object come from here too, so the console, ``status``
and a replay phrase a slow job the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import slowdown_cause
from agentd.slowdown.feeds import RankFeed, from_snapshot
from agentd.slowdown.verdict import SlowdownJudge
from agentd.stacks import ranksets
from tuiprof.model.cluster import HostState
from tuiprof.model.summary import SlowJob


class ClusterSlowdowns:
    """One judge over all hosts; ``observe`` once per refresh with the hosts' latest state."""

    def __init__(self) -> None:
        self._now = 0.0
        self._judge = SlowdownJudge(clock=lambda: self._now)
        self._fed: dict[str, int] = {}  # address → the snapshot sequence whose arrivals were judged
        self.verdicts: list[pb.JobSlowdown] = []

    def observe(self, hosts: Iterable[HostState], now: float) -> list[pb.JobSlowdown]:
        """Every job's verdict (jobs of two ranks or more), by job id; kept in ``verdicts``."""
        self._now = now
        feeds: list[RankFeed] = []
        for state in hosts:
            message = state.message
            if message is None or not state.reachable:
                continue
            fresh = self._fed.get(state.address) != message.sequence
            self._fed[state.address] = message.sequence
            feeds += from_snapshot(message, with_arrivals=fresh)
        self.verdicts = self._judge.observe(feeds)
        return self.verdicts


@dataclass(frozen=True)
class SlowBanner:
    text: str


def slow_banner(verdicts: Iterable[pb.JobSlowdown]) -> SlowBanner | None:
    """The one line over the cluster table: the costliest slow job, who it waits for, why, and how many
    other jobs are slow; None when none is."""
    slow = sorted((v for v in verdicts if v.slow), key=lambda v: -v.cost_percent)
    if not slow:
        return None
    worst = slow[0]
    parts = [f"SLOW job {worst.job_id or '(no job id)'}: {slowdown_cause(worst.cause).replace('_', ' ')}"]
    if worst.culprits:
        parts.append(f"waits for {culprits_text(worst.culprits)}")
    parts.append(f"costs {worst.cost_seconds * 1e3:.1f} ms a step ({worst.cost_percent:.0f} %)")
    if worst.evidence:
        parts.append(worst.evidence[-1])
    if len(slow) > 1:
        parts.append(f"{len(slow) - 1} more slow job{'s' if len(slow) > 2 else ''}")
    parts.append("press n for its ranks' ops")
    return SlowBanner(" — ".join(parts))


def fleet_slow_banner(jobs: Sequence[SlowJob]) -> SlowBanner | None:
    """The line over the fleet view: the costliest slow jobs as Prometheus has the agents' verdicts."""
    if not jobs:
        return None
    named = "; ".join(f"{job.job_id or '(no job id)'}: {job.cause.replace('_', ' ') or 'cause not exported'}, "
                      f"its costliest rank {job.cost_seconds * 1e3:.1f} ms a step" for job in jobs)
    return SlowBanner(f"SLOW jobs (Prometheus, each judged on its hosts): {named} — press n for their ranks' ops")


def culprits_text(culprits: Iterable[pb.RankCost]) -> str:
    """``rank 3 (node2 GPU 3)``, or ``ranks 3,5 on node2`` for several on one host."""
    by_host: dict[str, list[pb.RankCost]] = {}
    for cost in culprits:
        by_host.setdefault(cost.host, []).append(cost)
    parts = []
    for host, costs in by_host.items():
        if len(costs) == 1:
            (cost,) = costs
            who = f"rank {cost.rank}" if cost.HasField("rank") else f"pid {cost.pid}"
            where = f"{host} GPU {cost.gpu}" if cost.HasField("gpu") else host
            parts.append(f"{who} ({where})")
        else:
            ranks = [c.rank for c in costs if c.HasField("rank")]
            pids = [str(c.pid) for c in costs if not c.HasField("rank")]
            named = ([f"ranks {ranksets.fold_short(ranks, 40)}"] if ranks else []) + ([f"pids {','.join(pids)}"]
                                                                                       if pids else [])
            parts.append(f"{' and '.join(named)} on {host}")
    return "; ".join(parts)


def slowdown_json(verdict: pb.JobSlowdown | None) -> dict[str, Any] | None:
    """The ``slowdown`` object of a job in ``tuiprof status --json``; None when the job is healthy."""
    if verdict is None or not verdict.slow:
        return None
    return {
        "ranks": [_cost_json(c) for c in verdict.culprits],
        "hosts": sorted({c.host for c in verdict.culprits}),
        "cost_ms": round(verdict.cost_seconds * 1e3, 3),
        "cost_percent": round(verdict.cost_percent, 2),
        "cause": slowdown_cause(verdict.cause),
        "evidence": list(verdict.evidence),
        "unchecked": list(verdict.unchecked),
        "step_ms": round(verdict.step_seconds * 1e3, 3) if verdict.HasField("step_seconds") else None,
        "baseline_step_ms": (round(verdict.baseline_step_seconds * 1e3, 3)
                             if verdict.HasField("baseline_step_seconds") else None),
        "since_unix_ns": verdict.since_unix_ns,
    }


def _cost_json(cost: pb.RankCost) -> dict[str, Any]:
    return {"rank": cost.rank if cost.HasField("rank") else None, "pid": cost.pid, "host": cost.host,
            "gpu": cost.gpu if cost.HasField("gpu") else None,
            "cost_ms": round(cost.cost_seconds * 1e3, 3), "cost_percent": round(cost.cost_percent, 2)}


def jobs_of_agents(messages: Iterable[pb.HostSnapshot]) -> dict[str, pb.JobSlowdown]:
    """Per job, the agents' own verdicts as one: the slow one costliest, else any. Each agent judges its
    host alone: a job across hosts is named where its late rank has healthy peers on the same host."""
    jobs: dict[str, pb.JobSlowdown] = {}
    for message in messages:
        for verdict in message.slowdowns:
            kept = jobs.get(verdict.job_id)
            if kept is None or (verdict.slow, verdict.cost_percent) > (kept.slow, kept.cost_percent):
                jobs[verdict.job_id] = verdict
    return jobs
