"""What changed between two captures of one job (A: before, B: after), like HTA's TraceDiff, job-wide.

Inputs are each side's per-rank results (``trace_merge`` → ``RankResult``).
Ranks are paired by rank number (two single-rank captures are paired whatever
their numbers). Reported: the job's GPU time per category (compute,
communication, memcpy/memset, idle; summed over the paired ranks), each
paired rank's step time and split (which ranks got slower), each rank's
collectives by op (calls, total and mean time per call: which collectives got
slower), and the kernels — or, for CPU-only traces, the CPU ops — whose total
time changed most. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tuiprof.analysis.trace_summary import RankResult, RankSummary, rank_name, short_name

TOP = 10
CATEGORIES = (("compute", "compute_us"), ("communication", "communication_us"), ("memcpy/memset", "memory_us"),
              ("idle", "idle_us"))


@dataclass(frozen=True)
class Change:
    """One figure in A and in B (None: the side has no such figure, with the reason in the owner)."""

    a: float | None
    b: float | None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else round(self.b - self.a, 3)

    @property
    def percent(self) -> float | None:
        delta = self.delta
        return None if delta is None or not self.a else round(100.0 * delta / self.a, 2)


@dataclass(frozen=True)
class TimeChange:
    """A named kernel, CPU op or collective: calls and total µs on each side."""

    name: str
    rank: int | None  # None: summed over the job
    calls: Change
    total_us: Change

    @property
    def mean_us(self) -> Change:
        def mean(total: float | None, calls: float | None) -> float | None:
            return None if not calls or total is None else round(total / calls, 3)
        return Change(mean(self.total_us.a, self.calls.a), mean(self.total_us.b, self.calls.b))


@dataclass(frozen=True)
class RankChange:
    rank: int | None
    a_file: str
    b_file: str
    step_time_us: Change
    span_us: Change
    categories: dict[str, Change]

    @property
    def slowdown_us(self) -> float:
        """What orders the ranks: the step time's change, else the GPU span's (0 when neither is known)."""
        return self.step_time_us.delta if self.step_time_us.delta is not None else (self.span_us.delta or 0.0)


@dataclass
class TraceDiff:
    a_ranks: int
    b_ranks: int
    categories: dict[str, Change]  # job-wide, paired ranks only
    ranks: list[RankChange]  # most slowed first
    collectives: list[TimeChange]  # per rank and op, largest change of total time first
    kernels: list[TimeChange]  # job-wide, largest change first
    kernels_are: str  # "GPU kernels" or "CPU ops (inclusive)" when neither side has GPU kernels
    pairing: list[str] = field(default_factory=list)  # ranks seen on one side only, or paired across numbers


def _pairs(a: list[RankResult], b: list[RankResult]) -> tuple[list[tuple[RankResult, RankResult]], list[str]]:
    if len(a) == 1 and len(b) == 1:
        x, y = a[0].summary, b[0].summary
        note = [] if x.rank == y.rank else [f"one rank on each side: A's {rank_name(x.rank, x.pid)} compared with B's {rank_name(y.rank, y.pid)}"]
        return [(a[0], b[0])], note
    by_rank = {r.summary.rank: r for r in b}
    pairs, unpaired = [], []
    for result in a:
        other = by_rank.pop(result.summary.rank, None)
        if other is None:
            unpaired.append(f"{rank_name(result.summary.rank)} only in A ({result.summary.file})")
        else:
            pairs.append((result, other))
    unpaired += [f"{rank_name(r.summary.rank)} only in B ({r.summary.file})" for r in by_rank.values()]
    return pairs, unpaired


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known), 3) if known else None


def _totals_changes(a: dict[str, list[float]], b: dict[str, list[float]], rank: int | None) -> list[TimeChange]:
    changes = []
    for name in a.keys() | b.keys():
        calls_a, total_a = a.get(name, (0, 0.0))
        calls_b, total_b = b.get(name, (0, 0.0))
        changes.append(TimeChange(name, rank, Change(calls_a, calls_b), Change(round(total_a, 3), round(total_b, 3))))
    return changes


def _job_totals(results: list[RankResult], attribute: str) -> dict[str, list[float]]:
    job: dict[str, list[float]] = {}
    for result in results:
        for name, (calls, total) in getattr(result, attribute).items():
            entry = job.setdefault(name, [0, 0.0])
            entry[0] += calls
            entry[1] += total
    return job


def _largest(changes: list[TimeChange]) -> list[TimeChange]:
    return sorted(changes, key=lambda c: (-abs(c.total_us.delta or 0.0), c.name))[:TOP]


def _rank_change(a: RankSummary, b: RankSummary) -> RankChange:
    return RankChange(b.rank if b.rank is not None else a.rank, a.file, b.file,
                      Change(a.step_time_us, b.step_time_us), Change(a.span_us, b.span_us),
                      {label: Change(getattr(a, key), getattr(b, key)) for label, key in CATEGORIES})


def diff(a: list[RankResult], b: list[RankResult]) -> TraceDiff:
    pairs, pairing = _pairs(a, b)
    ranks = sorted((_rank_change(x.summary, y.summary) for x, y in pairs), key=lambda r: -r.slowdown_us)
    categories = {label: Change(_sum([getattr(x.summary, key) for x, _ in pairs]),
                                _sum([getattr(y.summary, key) for _, y in pairs]))
                  for label, key in CATEGORIES}
    collectives = _largest([change for x, y in pairs
                            for change in _totals_changes(x.collective_totals, y.collective_totals,
                                                          y.summary.rank if y.summary.rank is not None
                                                          else x.summary.rank)])
    paired_a, paired_b = [x for x, _ in pairs], [y for _, y in pairs]
    on_gpu = any(r.kernel_totals for r in paired_a + paired_b)
    attribute = "kernel_totals" if on_gpu else "cpu_totals"
    kernels = _largest(_totals_changes(_job_totals(paired_a, attribute), _job_totals(paired_b, attribute), None))
    return TraceDiff(len(a), len(b), categories, ranks, collectives, kernels,
                     "GPU kernels" if on_gpu else "CPU ops (inclusive)", pairing)


def diff_json(result: TraceDiff) -> dict[str, Any]:
    """``asdict`` plus each change's delta, percent and (for named times) mean per call."""
    def change(c: Change) -> dict[str, Any]:
        return {"a": c.a, "b": c.b, "delta": c.delta, "percent": c.percent}

    def named(t: TimeChange) -> dict[str, Any]:
        return {"name": t.name, "rank": t.rank, "calls": change(t.calls), "total_us": change(t.total_us),
                "mean_us": change(t.mean_us)}

    document = asdict(result)
    document["categories"] = {label: change(c) for label, c in result.categories.items()}
    document["ranks"] = [{"rank": r.rank, "a_file": r.a_file, "b_file": r.b_file,
                          "step_time_us": change(r.step_time_us), "span_us": change(r.span_us),
                          "categories": {label: change(c) for label, c in r.categories.items()}}
                         for r in result.ranks]
    document["collectives"] = [named(t) for t in result.collectives]
    document["kernels"] = [named(t) for t in result.kernels]
    return document


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1000:.2f} ms"


def _change_text(c: Change) -> str:
    if c.delta is None:
        return f"{_ms(c.a)} → {_ms(c.b)}"
    percent = "" if c.percent is None else f", {c.percent:+.1f}%"
    return f"{_ms(c.a)} → {_ms(c.b)} ({c.delta / 1000:+.2f} ms{percent})"


def render_diff(result: TraceDiff) -> str:
    lines = [f"A: {result.a_ranks} rank(s) → B: {result.b_ranks} rank(s)"]
    lines += [f"  {note}" for note in result.pairing]
    if any(c.a is not None or c.b is not None for c in result.categories.values()):
        lines.append("job GPU time: " + "; ".join(f"{label} {_change_text(c)}"
                                                  for label, c in result.categories.items()))
    else:
        lines.append("job GPU time: n/a (no GPU kernel, memcpy or memset events on either side)")
    lines.append("ranks, most slowed first:")
    for r in result.ranks:
        lines.append(f"  {rank_name(r.rank)}: step time {_change_text(r.step_time_us)}")
        if r.span_us.a is not None or r.span_us.b is not None:
            lines.append(f"    GPU span {_change_text(r.span_us)}; " + ", ".join(
                f"{label} {_change_text(c)}" for label, c in r.categories.items()))
    if result.collectives:
        lines.append("collectives, largest change first (per rank):")
        for t in result.collectives:
            lines.append(f"  {rank_name(t.rank)} {short_name(t.name)}: {t.calls.a:.0f} → {t.calls.b:.0f} calls, total "
                         f"{_change_text(t.total_us)}, mean {_change_text(t.mean_us)}")
    if result.kernels:
        lines.append(f"{result.kernels_are}, largest change first (job):")
        for t in result.kernels:
            lines.append(f"  {short_name(t.name)}: ×{t.calls.a:.0f} → ×{t.calls.b:.0f}, {_change_text(t.total_us)}")
    return "\n".join(lines) + "\n"
