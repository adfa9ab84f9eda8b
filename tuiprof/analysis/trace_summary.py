"""Where the time went across ranks, from each rank's result, and the summary as the CLI prints it.

Each rank's own figures (GPU split, overlap, top kernels, idle by stream, step
time) are ``agentd.traces.analysis.summary``'s, made by the agent where the
file is or by ``trace_merge`` on files on disk. Across ranks: for each
collective seen on several ranks, the start skew and the last rank to start it
(the one the others waited for), and each rank's compute time against the
median. Figures that a trace cannot give (no GPU kernels on a CPU-only build,
no steps) are None with the reason, never 0.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

# One rank's part lives on the agent side (the agent summarises its ranks where the files are);
# the names the console's modules and tests use are re-exported here.
from agentd.slowdown.waits import Arrivals, arrivals
from agentd.traces.analysis.summary import (
    NO_GPU_EVENTS, STEP_MODES, TOP, LaunchStats, RankResult, RankSummary, TimeShare, covered, overlap, top, union,
)

__all__ = ["NO_GPU_EVENTS", "STEP_MODES", "CollectiveSkew", "CollectiveStarts", "RankHold", "RankResult", "RankSummary", "TimeShare", "TraceSummary",
           "covered", "overlap", "render_text", "short_name", "summarize", "summary_json", "union"]


@dataclass(frozen=True)
class CollectiveSkew:
    name: str
    group: str
    occurrence: str
    ranks: int
    skew_us: float
    last_rank: int | None


@dataclass
class TraceSummary:
    ranks: list[RankSummary]
    collectives_compared: int
    worst_collectives: list[CollectiveSkew]
    last_starts: dict[str, int]  # rank → how often it was the last to start a collective
    held_up: list[RankHold]  # the ranks that held the others up, longest first
    top_kernels: list[TimeShare]
    collective_matching: str  # how calls were paired across ranks; "" with no collectives


@dataclass
class CollectiveStarts:
    """Each collective's (``trace_collectives.Key``) arrival figures and the rank that started it last, in the
    order the collectives first appear going through the ranks in order; ``calls``: every call of every rank,
    a collective of its own or not."""

    by_key: dict[tuple[str, ...], tuple[Arrivals, int | None]]
    calls: int

    @classmethod
    def of(cls, results: list[RankResult]) -> CollectiveStarts:
        """From each rank's keyed calls (``RankResult.collectives``; results come in rank order: on a tie the
        later rank counts as the last)."""
        starts: dict[tuple[str, ...], tuple[list[float], list[int | None]]] = {}
        for result in results:
            number = result.summary.rank
            for key, ts in result.collectives:
                times, numbers = starts.setdefault(key, ([], []))
                times.append(ts)
                numbers.append(number)
        by_key = {}
        for key, (times, numbers) in starts.items():
            figures = arrivals(times)
            by_key[key] = (figures, numbers[figures.last])
        return cls(by_key, sum(len(r.collectives) for r in results))


@dataclass(frozen=True)
class RankHold:
    """How long one rank, the last to start, held the others up at collectives over the traced window."""

    rank: int | None
    host: str
    collectives: int  # collectives it started last (after the runner-up)
    total_us: float
    per_step_us: float | None  # total over the window's steps; None: the trace has no steps
    step_percent: float | None  # per_step_us against the median rank's step time


def summarize(results: list[RankResult], starts: CollectiveStarts | None = None) -> TraceSummary:
    """The cross-rank picture: compute against the median, collective start skew, job-wide top kernels.

    ``starts``: the collectives' starts when the caller has them already (the reduce of the agents'
    summaries); by default from each result's keyed calls."""
    ranks = [r.summary for r in results]
    computes = [r.compute_us for r in ranks if r.compute_us is not None]
    if computes:
        median = statistics.median(computes)
        for rank in ranks:
            if rank.compute_us is not None and median > 0:
                rank.compute_vs_median_percent = round(100.0 * (rank.compute_us - median) / median, 2)
    if starts is None:
        starts = CollectiveStarts.of(results)
    skews: list[CollectiveSkew] = []
    last_starts: Counter[str] = Counter()
    held: dict[int | None, list[float]] = {}  # rank → [collectives, µs]
    for (group, name, occurrence), (figures, last_rank) in starts.by_key.items():
        if figures.calls < 2:
            continue
        skews.append(CollectiveSkew(name, group, occurrence, figures.calls,
                                    round(figures.latest - figures.earliest, 3), last_rank))
        last_starts[str(last_rank)] += 1
        if figures.held_us > 0:
            entry = held.setdefault(last_rank, [0, 0.0])
            entry[0] += 1
            entry[1] += figures.held_us
    skews.sort(key=lambda s: -s.skew_us)
    job_kernels: dict[str, list[float]] = {}
    for result in results:
        for name, (count, total) in result.kernel_totals.items():
            entry = job_kernels.setdefault(name, [0, 0.0])
            entry[0] += count
            entry[1] += total
    return TraceSummary(ranks, len(skews), skews[:TOP], dict(last_starts.most_common()),
                        _holds(ranks, held), top(job_kernels), _collective_matching(results, starts.calls))


def _holds(ranks: list[RankSummary], held: dict[int | None, list[float]]) -> list[RankHold]:
    """Each rank's hold-ups, per step of the window and against the median rank's step time."""
    steps = max((rank.steps for rank in ranks), default=0)
    step_times = [rank.step_time_us for rank in ranks if rank.step_time_us]
    step_us = statistics.median(step_times) if step_times else None
    hosts = {rank.rank: rank.host for rank in ranks}
    holds = []
    for number, (collectives, total_us) in held.items():
        per_step = total_us / steps if steps else None
        percent = round(100.0 * per_step / step_us, 2) if per_step is not None and step_us else None
        holds.append(RankHold(number, hosts.get(number, ""), int(collectives), round(total_us, 3),
                              None if per_step is None else round(per_step, 3), percent))
    return sorted(holds, key=lambda hold: -hold.total_us)


def _collective_matching(results: list[RankResult], calls: int) -> str:
    unsequenced = sum(r.unsequenced_collectives for r in results)
    if not calls:
        return ""
    if not unsequenced:
        return "by sequence number"
    return (f"{unsequenced} of {calls} collective calls carry no sequence number (Kineto traces do not record "
            "one): paired by order per group and op, GPU kernels only where they overlap in time")


def summary_json(summary: TraceSummary) -> dict[str, Any]:
    return asdict(summary)


SHORT_NAME = 60
TOP_HOLDS = 5  # ranks listed as holding the others up


def short_name(name: str, width: int = SHORT_NAME) -> str:
    """A kernel's C++ signature cut for a terminal line: template arguments as ``<…>``, no
    parameter list, at most ``width`` characters (``--json`` keeps the full name)."""
    text, depth = [], 0
    for char in name:
        if char == "<":
            depth += 1
            if depth == 1:
                text.append("<…>")
        elif char == ">" and depth:
            depth -= 1
        elif not depth:
            text.append(char)
    short = "".join(text)
    if short.endswith(")") and "(" in short:
        short = short[:short.index("(")]
    short = short.removeprefix("void ").strip() or name
    return short if len(short) <= width else short[:width - 1] + "…"


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1000:.2f} ms"


def _launch_text(stats: LaunchStats) -> str:
    short = f"{stats.short_kernels:,} of {stats.kernels:,} kernels shorter than {stats.short_kernel_us:g} µs"
    if stats.median_delay_us is None:
        return f"delay n/a (no kernel's launch call is in the trace); {short}"
    return (f"delay median {stats.median_delay_us:.1f} µs, p95 {stats.p95_delay_us:.1f} µs, max "
            f"{stats.max_delay_us:.1f} µs over {stats.matched:,} kernels; {short}")


def rank_name(rank: int | None, pid: int | None = None) -> str:
    """How text names a trace's rank: its number, else its process, else that it has none."""
    if rank is not None:
        return f"rank {rank}"
    return f"pid {pid}" if pid is not None else "the trace without a rank"


def render_text(summary: TraceSummary) -> str:
    """The summary as the CLI prints it."""
    lines = []
    for r in summary.ranks:
        lines.append(f"{rank_name(r.rank, r.pid)} {'on ' + r.host if r.host else 'in ' + r.file}: {r.events} events; counted: "
                     f"{r.window}, {r.gpu_kernels:,} GPU events"
                     + (f" ({r.gpu_events_outside:,} outside)" if r.gpu_events_outside else ""))
        if r.compute_us is not None:
            overlap_text = "n/a" if r.overlap_percent is None else f"{r.overlap_percent:.1f}%"
            lines.append(f"  GPU span {_us(r.span_us)}: compute {_us(r.compute_us)}, communication "
                         f"{_us(r.communication_us)}, memcpy/memset {_us(r.memory_us)}, idle {_us(r.idle_us)}; "
                         f"comm-compute overlap {overlap_text}")
            if r.compute_vs_median_percent is not None:
                lines.append(f"  compute vs median rank: {r.compute_vs_median_percent:+.1f}%")
        else:
            lines.append(f"  GPU split: n/a ({r.unavailable.get('compute_us')})")
        if r.idle_by_stream:
            lines.append("  idle by stream (host wait / kernel wait / other): " + "; ".join(
                f"{i.stream}: {_us(i.host_wait_us)} / {_us(i.kernel_wait_us)} / {_us(i.other_us)}"
                for i in r.idle_by_stream[:4]))
        if r.launches is not None:
            lines.append(f"  kernel launches: {_launch_text(r.launches)}")
        if r.step_time_us is not None:
            lines.append(f"  step time {_us(r.step_time_us)} ({r.steps} steps; {r.step_time_basis})"
                         + ("" if r.cpu_step_time_us in (None, r.step_time_us)
                            else f"; CPU-side {_us(r.cpu_step_time_us)}"))
        top = r.top_kernels or r.top_cpu_ops
        if top:
            label = "top kernels" if r.top_kernels else "top CPU ops (inclusive)"
            lines.append(f"  {label}: " + ", ".join(f"{short_name(t.name)} {_us(t.total_us)} ×{t.count}" for t in top[:5]))
    if summary.held_up:
        lines.append("held the others up (the last to start a collective, from the runner-up's start to its own):")
        for hold in summary.held_up[:TOP_HOLDS]:
            per_step = "" if hold.per_step_us is None else f", {_us(hold.per_step_us)} a step" + (
                "" if hold.step_percent is None else f" ({hold.step_percent:.1f} % of the step)")
            lines.append(f"  {rank_name(hold.rank)}{' on ' + hold.host if hold.host else ''}: "
                         f"{_us(hold.total_us)} over {hold.collectives} collective{'s' if hold.collectives != 1 else ''}"
                         f"{per_step}")
    if summary.worst_collectives:
        lines.append(f"collectives compared across ranks: {summary.collectives_compared} "
                     f"({summary.collective_matching}); largest start skew:")
        for s in summary.worst_collectives[:5]:
            lines.append(f"  {short_name(s.name)} #{s.occurrence}: {s.skew_us / 1000:.3f} ms, last to start: rank {s.last_rank}")
    return "\n".join(lines) + "\n"
