"""One rank's summary: where its time went (the per-rank half of tuiprof's trace analysis).

The agent runs this on its own ranks' files right after a capture
(``agentd.traces.analysis.summarise``), and the console runs the same code on
files on disk (``tuiprof analyze``, ``tuiprof trace --merge``), so a summary
is the same wherever it was made. Per rank (GPU kernels only, as HTA does): the
union of compute, communication and memcpy/memset kernel intervals, idle =
kernel span − union of all kernels, comm–compute overlap = |comm ∩ compute| ÷
|comm|, top kernels by total time, idle per stream by cause, launch delays, and
the step time (median ``ProfilerStep#`` length, else the median gap between
optimizer steps). Figures that a trace cannot give (no GPU kernels on a
CPU-only build, no steps) are None with the reason, never 0. The cross-rank
part (compute against the median, collective skew) is the console's
(``tuiprof.analysis.trace_summary``).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from itertools import pairwise

# Every spelling Kineto has written: PyTorch 1.8-1.9 used "Kernel", "Memcpy", "Memset",
# "Runtime" and "Operator"; later versions the snake_case names. GPU-side annotations
# (gpu_user_annotation) span kernels and are not kernels; runtime and sync calls
# (cuda_runtime/Runtime, cuda_driver, cuda_sync) are CPU-side.
MEMORY_CATEGORIES = frozenset({"gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
KERNEL_CATEGORIES = frozenset({"kernel", "Kernel"})
GPU_CATEGORIES = KERNEL_CATEGORIES | MEMORY_CATEGORIES
# CPU-side calls that launch GPU work; their ``correlation`` arg names the kernel/memcpy they queued.
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "Runtime", "cuda_driver"})
CPU_OP_CATEGORIES = frozenset({"cpu_op", "Operator"})
NO_GPU_EVENTS = "no GPU kernel, memcpy or memset events in the trace"
TOP = 10
SHORT_KERNEL_US = 10.0  # a kernel shorter than this is mostly launch overhead
KERNEL_WAIT_US = 30.0  # a gap shorter than this between queued kernels is launch overhead (HTA's default)
STEP_MODES = ("all", "complete")

Interval = tuple[float, float]
StreamEvent = tuple[float, float, float | None]  # GPU event start, end, its launch call's start (None: not in the trace)


@dataclass
class RankExtract:
    """What the summary needs from one rank's trace, gathered while merging (µs, shared base)."""

    rank: int | None
    host: str
    pid: int | None
    file: str
    events: int = 0
    gpu_kernels: int = 0
    # compute / communication / memory → (start, end) of each GPU kernel of that kind
    intervals: dict[str, list[Interval]] = field(
        default_factory=lambda: {"compute": [], "communication": [], "memory": []})
    kernel_totals: dict[str, list[float]] = field(default_factory=dict)  # name → [count, total µs]
    cpu_totals: dict[str, list[float]] = field(default_factory=dict)  # cpu_op name → [count, total µs]
    # CPU-only ranks' collectives (c10d:: ops and gloo: annotations) → [count, total µs]
    cpu_collective_totals: dict[str, list[float]] = field(default_factory=dict)
    steps: list[tuple[str, float, float]] = field(default_factory=list)  # ProfilerStep#/Optimizer.step#: name, ts, dur
    window: str = ""  # what was counted, e.g. "steps 1–9 of 10 (ProfilerStep#0–#8)"
    gpu_events_outside: int = 0  # GPU events left out by the --steps window
    launch_delays: list[float] = field(default_factory=list)  # kernel start − its launch call's start, µs
    kernels: int = 0  # GPU kernels (not memcpy/memset) counted
    short_kernels: int = 0  # of which shorter than SHORT_KERNEL_US
    streams: dict[str, list[StreamEvent]] = field(default_factory=dict)  # GPU stream → its counted GPU events
    # step number (``extract.step_windows`` order) → the start of the first GPU event launched during that step
    step_gpu_starts: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StepWindow:
    """The part of a trace the figures count: GPU work launched (CPU ops starting) in [start, end].

    ``--steps all``: the whole trace. ``--steps complete``: the ProfilerStep#
    annotations but the last, which the profiler's stop cuts short (HTA drops
    it by default too); the whole trace when it has no ProfilerStep# or only
    one (HTA filters nothing then either).
    """

    start: float
    end: float
    description: str

    def contains(self, ts: float) -> bool:
        return self.start <= ts <= self.end


def step_window(steps: list[tuple[str, float, float]], mode: str) -> StepWindow:
    """The window ``mode`` ("all" or "complete") selects from a rank's step annotations (name, ts, dur)."""
    profiler = sorted((ts, ts + dur, name) for name, ts, dur in steps if name.startswith("ProfilerStep#"))
    everything = float("-inf"), float("inf")
    if not profiler:
        return StepWindow(*everything, "whole trace (no ProfilerStep# annotations)")
    if mode == "all":
        return StepWindow(*everything, f"whole trace, all {len(profiler)} steps")
    if len(profiler) == 1:  # nothing to drop but the only step: HTA then analyses the whole trace too
        return StepWindow(*everything, f"whole trace, its only step ({profiler[0][2]}) kept as HTA keeps it")
    kept = profiler[:-1]
    first, last = kept[0][2].removeprefix("ProfilerStep"), kept[-1][2].removeprefix("ProfilerStep")
    return StepWindow(kept[0][0], kept[-1][1],
                      f"steps 1–{len(kept)} of {len(profiler)} (ProfilerStep{first}–{last}; the last is cut "
                      "by the profiler's stop)")


def hta_window(steps: list[tuple[str, float, float]], mode: str) -> StepWindow | None:
    """The window HTA 0.5 counts (``--like-hta``) where it filters at all, with two or more ProfilerStep#s
    (None: it counts the whole trace): work launched before the last step's start (its default, as ``complete``),
    or up to the last step's end (``include_last_profiler_step``, as ``all``); from the trace's start either way."""
    profiler = [(ts, ts + dur, name) for name, ts, dur in steps if name.startswith("ProfilerStep#")]
    if len({name for _, _, name in profiler}) < 2:
        return None
    if mode == "all":
        return StepWindow(float("-inf"), max(end for _, end, _ in profiler),
                          f"as HTA: up to the end of the last of {len(profiler)} steps")
    last_start, _, last = max(profiler)
    return StepWindow(float("-inf"), math.nextafter(last_start, float("-inf")),
                      f"as HTA: launched before the last of {len(profiler)} steps ({last})")


@dataclass(frozen=True)
class LaunchStats:
    """CUDA kernel launch delay (kernel start − its launch call's start) and short kernels."""

    kernels: int
    matched: int  # kernels whose launch call is in the trace (paired by correlation id)
    median_delay_us: float | None
    p95_delay_us: float | None
    max_delay_us: float | None
    short_kernels: int  # kernels shorter than SHORT_KERNEL_US
    short_kernel_us: float = SHORT_KERNEL_US


def launch_stats(kernels: int, delays: list[float], short: int) -> LaunchStats:
    if not delays:
        return LaunchStats(kernels, 0, None, None, None, short)
    ordered = sorted(delays)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return LaunchStats(kernels, len(ordered), round(statistics.median(ordered), 3), round(p95, 3),
                       round(ordered[-1], 3), short)


@dataclass(frozen=True)
class StreamIdle:
    """The gaps between consecutive GPU events of one stream, by cause (HTA's idle time breakdown)."""

    stream: str
    host_wait_us: float  # the next event was launched after the previous one ended: the CPU was late
    kernel_wait_us: float  # queued in time, gap under KERNEL_WAIT_US: launch overhead
    other_us: float  # queued in time, longer gap (waits on events or other streams)

    @property
    def total_us(self) -> float:
        return self.host_wait_us + self.kernel_wait_us + self.other_us


def stream_idle(stream: str, events: list[StreamEvent]) -> StreamIdle:
    """Classify each gap (start − the previous event's end, in start order) as HTA does."""
    host = kernel = other = 0.0
    ordered = sorted(events, key=lambda event: event[0])
    for (_, previous_end, _), (start, _, launched) in pairwise(ordered):
        gap = start - previous_end
        if launched is not None and launched > previous_end:
            host += gap
        elif gap < KERNEL_WAIT_US:
            kernel += gap
        else:
            other += gap
    return StreamIdle(stream, round(host, 3), round(kernel, 3), round(other, 3))


@dataclass(frozen=True)
class TimeShare:
    name: str
    count: int
    total_us: float


@dataclass
class RankSummary:
    rank: int | None
    host: str
    pid: int | None
    file: str
    events: int
    gpu_kernels: int
    span_us: float | None = None
    compute_us: float | None = None
    communication_us: float | None = None
    memory_us: float | None = None
    idle_us: float | None = None
    overlap_percent: float | None = None
    compute_vs_median_percent: float | None = None
    step_time_us: float | None = None  # the GPU's step period where there is one, else the CPU-side figure
    steps: int = 0
    step_time_basis: str = ""  # what step_time_us measures
    cpu_step_time_us: float | None = None  # the CPU-side figure alone (ProfilerStep# spans or Optimizer.step# gaps)
    window: str = ""  # what the figures count (--steps)
    gpu_events_outside: int = 0
    launches: LaunchStats | None = None
    idle_by_stream: list[StreamIdle] = field(default_factory=list)  # most idle first
    top_kernels: list[TimeShare] = field(default_factory=list)
    top_cpu_ops: list[TimeShare] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)


def union(intervals: list[Interval]) -> list[Interval]:
    """Sorted, non-overlapping cover of ``intervals``."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def covered(cover: list[Interval]) -> float:
    return sum(end - start for start, end in cover)


def overlap(a: list[Interval], b: list[Interval]) -> float:
    """Length of the intersection of two covers (each sorted and non-overlapping)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            total += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


# GPU kernels that move data between GPUs, by family: NCCL and RCCL (ncclKernel_*, ncclDevKernel_*,
# rcclGenericKernel), MSCCL and MSCCL++, DeepEP's expert-parallel dispatch/combine (deep_ep::intranode/internode[_ll]::*,
# DeepSeek's own dpsk::ep::*), vLLM's custom all-reduce (cross_device_reduce_*) and PyTorch's symmetric-memory
# all-reduce (multimem_*, one_shot_/two_shot_all_reduce). For kernels the profiler did not record as a collective.
COMMUNICATION_KERNELS = re.compile(
    r"nccl|rccl|msccl|(?:deep_ep|\bep)::(?:intranode|internode)|cross_device_reduce|multimem_|"
    r"(?:one|two)_shot_all_reduce", re.IGNORECASE)
# HTA 0.5's rule (hta.utils.utils.NCCL_KERNEL_RE, matched from the name's start): what --like-hta counts.
HTA_COMMUNICATION_KERNEL = re.compile(r"nccl.*Kernel")


def kernel_kind(name: str, category: str, recorded_collective: bool = False, like_hta: bool = False) -> str:
    """communication, memory (memcpy/memset) or compute.

    Communication is what the profiler recorded as a collective (``recorded_collective``: the kernel carries
    Kineto's ``Collective name``, or a collective op launched it), else a collective library's kernel family by
    name. ``like_hta``: HTA's rule alone, a name that starts with ``nccl`` and has ``Kernel`` after it.
    """
    if like_hta:
        communication = HTA_COMMUNICATION_KERNEL.match(name) is not None
    else:
        communication = recorded_collective or COMMUNICATION_KERNELS.search(name) is not None
    if communication:
        return "communication"
    if category in MEMORY_CATEGORIES or name.startswith(("Memcpy", "Memset")):
        return "memory"
    return "compute"


def hta_times(ts: float, dur: float) -> tuple[float, float]:
    """An event's start and duration rounded as HTA rounds float timestamps to whole µs: the start up, the end
    down (so a kernel shorter than a µs can end before it starts, and then counts negative, as in HTA)."""
    start = math.ceil(ts)
    return start, math.floor(ts + dur) - start


def top(totals: dict[str, list[float]]) -> list[TimeShare]:
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:TOP]
    return [TimeShare(name, int(count), round(total, 3)) for name, (count, total) in ranked]


CPU_STEP_BASIS = "CPU-side: median ProfilerStep# span (short when launches run ahead of the GPU)"
OPTIMIZER_STEP_BASIS = "CPU-side: median gap between Optimizer.step# starts"
GPU_STEP_BASIS = "GPU: median gap between consecutive steps' first GPU work"


def _cpu_step_time(annotations: list[tuple[str, float, float]]) -> tuple[float | None, int, str, str]:
    """Median ProfilerStep# length, else the median gap between optimizer steps: (µs, steps, basis, why not)."""
    steps = [dur for name, _, dur in annotations if name.startswith("ProfilerStep#")]
    if steps:
        return statistics.median(steps), len(steps), CPU_STEP_BASIS, ""
    starts = sorted(ts for name, ts, _ in annotations if name.startswith("Optimizer.step#"))
    if len(starts) >= 2:
        return statistics.median(b - a for a, b in pairwise(starts)), len(starts), OPTIMIZER_STEP_BASIS, ""
    return None, len(starts), "", "fewer than two steps in the trace (no ProfilerStep# or Optimizer.step# annotations)"


def gpu_step_period(first_gpu_starts: dict[int, float]) -> float | None:
    """The GPU's step period: the median gap between the first GPU work of step k and of step k+1.

    The CPU's step annotations time the launches: a loop that syncs every N steps
    runs most of its steps ahead of the GPU, so their spans are short and one is
    long. The GPU starts one step's work after the last one's, whatever the CPU did."""
    gaps = [first_gpu_starts[k + 1] - start for k, start in first_gpu_starts.items() if k + 1 in first_gpu_starts]
    return statistics.median(gaps) if gaps else None


def _step_time(summary: RankSummary, extract: RankExtract) -> None:
    cpu, summary.steps, basis, why_not = _cpu_step_time(extract.steps)
    if cpu is None:
        summary.unavailable["step_time_us"] = summary.unavailable["cpu_step_time_us"] = why_not
        return
    summary.cpu_step_time_us = round(cpu, 3)
    gpu = gpu_step_period(extract.step_gpu_starts)
    if gpu is None:
        summary.step_time_us, summary.step_time_basis = summary.cpu_step_time_us, basis
    else:
        summary.step_time_us, summary.step_time_basis = round(gpu, 3), GPU_STEP_BASIS


def summarize_rank(extract: RankExtract) -> RankSummary:
    summary = RankSummary(extract.rank, extract.host, extract.pid, extract.file, extract.events,
                          extract.gpu_kernels)
    _step_time(summary, extract)
    summary.top_cpu_ops = top(extract.cpu_totals)
    summary.window, summary.gpu_events_outside = extract.window, extract.gpu_events_outside
    if extract.kernels:
        summary.launches = launch_stats(extract.kernels, extract.launch_delays, extract.short_kernels)
    if not extract.gpu_kernels:
        why = NO_GPU_EVENTS
        if extract.gpu_events_outside:
            why = f"no GPU events in the counted window ({extract.window}); --steps all counts the whole trace"
        for key in ("span_us", "compute_us", "communication_us", "memory_us", "idle_us", "overlap_percent",
                    "compute_vs_median_percent"):
            summary.unavailable[key] = why
        return summary
    covers = {kind: union(spans) for kind, spans in extract.intervals.items()}
    everything = union([span for cover in covers.values() for span in cover])
    span = everything[-1][1] - everything[0][0]
    summary.span_us = round(span, 3)
    summary.compute_us = round(covered(covers["compute"]), 3)
    summary.communication_us = round(covered(covers["communication"]), 3)
    summary.memory_us = round(covered(covers["memory"]), 3)
    summary.idle_us = round(max(0.0, span - covered(everything)), 3)  # the span less the rounding of either
    if summary.communication_us:
        summary.overlap_percent = round(100.0 * overlap(covers["communication"], covers["compute"])
                                        / summary.communication_us, 2)
    else:
        summary.unavailable["overlap_percent"] = "no communication kernels in the trace"
    summary.top_kernels = top(extract.kernel_totals)
    summary.idle_by_stream = sorted((stream_idle(stream, events) for stream, events in extract.streams.items()),
                                    key=lambda idle: (-idle.total_us, idle.stream))
    return summary


@dataclass
class RankResult:
    """One rank's own summary plus what the cross-rank part needs (small: travels between processes)."""

    summary: RankSummary
    collectives: list[tuple[tuple[str, ...], float]]  # key, start ts
    kernel_totals: dict[str, list[float]]
    unsequenced_collectives: int = 0  # calls whose trace gave no sequence number (matched by order and time)
    collective_totals: dict[str, list[float]] = field(default_factory=dict)  # op → [calls, total µs]
    cpu_totals: dict[str, list[float]] = field(default_factory=dict)  # cpu_op name → [count, inclusive µs]
