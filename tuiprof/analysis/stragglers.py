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
    group_size: int
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
            verdicts.append(Verdict(sample, median, len(members), far))
    verdicts.sort(key=lambda v: (not v.straggler, -v.ratio))
    return verdicts
