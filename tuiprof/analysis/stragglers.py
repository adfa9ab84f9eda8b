"""Straggler candidates: ranks whose GEMM or collective latency sits far from the job's median.

Samples are grouped by job and by what they measure (kind and op signature); within a group a
sample is a straggler when it exceeds the median by ``ratio`` AND by ``mads``
median absolute deviations (the second test keeps a tight group's noise quiet;
with a zero MAD only the ratio applies). Groups smaller than ``min_group`` get no
verdict: with two ranks there is no "far from the others".
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tuiprof.analysis.trace_summary import TraceSummary


@dataclass(frozen=True, slots=True)
class OpSample:
    host: str
    job: str
    """The rank's job id: ranks are compared only with ranks of their own job."""
    rank: str
    """Rank label, e.g. ``rank 3``."""
    kind: str
    """``gemm`` or ``nccl``."""
    op: str
    """What is compared: op name plus dtype/shape or message size class."""
    latency_seconds: float


@dataclass(frozen=True, slots=True)
class Verdict:
    sample: OpSample
    group_median_seconds: float
    straggler: bool

    @property
    def ratio(self) -> float:
        """Latency relative to the group's median (1.0 = typical)."""
        median = self.group_median_seconds
        return self.sample.latency_seconds / median if median > 0 else float("inf")


def judge(
    samples: Iterable[OpSample], ratio: float = 1.5, mads: float = 3.0, min_group: int = 3
) -> list[Verdict]:
    """A verdict for every sample in a group of at least ``min_group``; slowest first."""
    groups: dict[tuple[str, str, str], list[OpSample]] = defaultdict(list)
    for sample in samples:
        groups[(sample.job, sample.kind, sample.op)].append(sample)
    verdicts: list[Verdict] = []
    for members in groups.values():
        if len(members) < min_group:
            continue
        latencies = [s.latency_seconds for s in members]
        median = statistics.median(latencies)
        mad = statistics.median(abs(x - median) for x in latencies)
        for sample in members:
            excess = sample.latency_seconds - median
            far = sample.latency_seconds > median * ratio and (mad == 0 or excess > mads * mad)
            verdicts.append(Verdict(sample, median, far))
    verdicts.sort(key=lambda v: (not v.straggler, -v.ratio))
    return verdicts


@dataclass(frozen=True)
class TraceStraggler:
    """A rank a trace summary points at, and why (or the typical rank to compare it with)."""

    rank: int | None
    host: str
    file: str
    why: str


def trace_stragglers(summary: TraceSummary) -> list[TraceStraggler]:
    """The ranks worth a closer look in a capture, and one typical rank to compare them with.

    Stragglers: the rank that held the others up longest (``TraceSummary.held_up``:
    at each collective it started last, the time from the runner-up's start to its
    own), and any rank whose GPU compute time ``judge`` finds far above the median.
    The typical rank is the one least often last whose compute is closest to the
    median. Nothing when the summary points at no one.
    """
    ranks = {rank.rank: rank for rank in summary.ranks}
    picked: dict[int | None, str] = {}
    if summary.held_up and len(ranks) > 1 and summary.held_up[0].rank in ranks:
        hold = summary.held_up[0]
        picked[hold.rank] = (f"the others waited {hold.total_us / 1000:.1f} ms for it (last to start "
                             f"{summary.last_starts.get(str(hold.rank), 0)} of {summary.collectives_compared} "
                             "collectives compared)")
    samples = [OpSample(r.host, "", str(r.rank), "trace", "GPU compute", r.compute_us / 1e6)
               for r in summary.ranks if r.compute_us is not None]
    for verdict in judge(samples):
        if verdict.straggler:
            rank = int(verdict.sample.rank) if verdict.sample.rank != "None" else None
            note = f"GPU compute {verdict.ratio:.2f}× the median rank's"
            picked[rank] = f"{picked[rank]}; {note}" if rank in picked else note
    if not picked:
        return []
    others = [r for r in summary.ranks if r.rank not in picked]
    typical = min(others, key=lambda r: (summary.last_starts.get(str(r.rank), 0), abs(r.compute_vs_median_percent or 0),
                                         r.rank or 0), default=None)
    chosen = [TraceStraggler(rank, ranks[rank].host, ranks[rank].file, why) for rank, why in picked.items()]
    if typical is not None:
        chosen.append(TraceStraggler(typical.rank, typical.host, typical.file, "a typical rank to compare with"))
    return chosen
