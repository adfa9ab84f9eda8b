"""Hang verdicts of many ranks in one sentence: identical findings folded over their ranks.

A rank's verdict reads ``rank 6: <finding>`` (``pid 123: …`` without a rank
number). Sixty-four ranks that all say "no optimizer step for 312 s" become
``ranks 0-63: no optimizer step for 312 s``. Used by agentd for a host's
explanation and by ``tuiprof stacks`` for the ranks of one job.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import hang_level
from agentd.stacks import ranksets

LEVELS = (pb.HANG_LEVEL_HUNG, pb.HANG_LEVEL_SUSPECT, pb.HANG_LEVEL_EXITED)
"""The levels a summary names, worst first."""


def who(verdict: pb.RankVerdict | pb.RankStats | pb.RankStacks | pb.TraceTarget) -> str:
    """``rank 3`` when the rank is known, else ``pid 1234``."""
    return rank_or_pid(verdict.rank if verdict.HasField("rank") else None, verdict.pid)


def rank_or_pid(rank: int | None, pid: int) -> str:
    """The one way a process of the job is named: ``rank 3``, or ``pid 1234`` when its rank is unknown."""
    return f"rank {rank}" if rank is not None else f"pid {pid}"


def finding(verdict: pb.RankVerdict) -> str:
    """The verdict's explanation without its ``rank N: `` prefix."""
    return verdict.explanation.removeprefix(f"{who(verdict)}: ")


def summarize(verdicts: Iterable[pb.RankVerdict], levels: Sequence[pb.HangLevel] = LEVELS) -> str:
    """``hung: ranks 0-3: no optimizer step for 7 s; suspect: rank 5: …`` (worst level first)."""
    verdicts = list(verdicts)
    parts = []
    for level in levels:
        groups: dict[str, list[pb.RankVerdict]] = {}
        for verdict in verdicts:
            if verdict.level == level:
                groups.setdefault(finding(verdict), []).append(verdict)
        if groups:
            parts.append(f"{hang_level(level)}: " + " | ".join(_group(text, members) for text, members in groups.items()))
    return "; ".join(parts)


def _group(text: str, members: list[pb.RankVerdict]) -> str:
    ranks = [v.rank for v in members if v.HasField("rank")]
    pids = [str(v.pid) for v in members if not v.HasField("rank")]
    names = []
    if ranks:
        names.append(f"{'rank' if len(ranks) == 1 else 'ranks'} {ranksets.fold_short(ranks, 60)}")
    if pids:
        names.append(f"{'pid' if len(pids) == 1 else 'pids'} {','.join(pids)}")
    return f"{' and '.join(names)}: {text}"
