"""Per-interval rates of one rank from two readings of its segment (pure functions).

A segment holds cumulative counters per aggregate slot (count, timed count,
total kernel ns, bytes, FLOPs, latency histograms). Everything here is
the difference of two readings divided by the time between them, so a rank
that did nothing in an interval shows zero rates, and a rank seen for the
first time is compared with its segment's creation (all counters zero).

Definitions (the same as xpu-timer's and nccl-tests'):
- GEMM TFLOPS = FLOPs of the timed GEMMs / their summed kernel time: achieved
  kernel throughput, not FLOPs per wall-clock second.
- Sampling: the hook times every call of a GEMM shape up to its
  ``gemm_timed_first``-th, then 1 in the slot's ``sample_every`` (fixed, or
  chosen per shape from its kernel time). Each timed call is weighted by the
  calls it stands for (1, then those since its previous timed call; a
  Horvitz-Thompson estimate), so TFLOPS, bandwidth and mean latency estimate
  all calls, not the over-represented first ones. Percentiles, min/max and the
  timed counts are per timed call.
  A GEMM slot's first call is not among them: it includes lazy module loading
  (the hook keeps it apart), and is reported as ``first_call_seconds``.
- NCCL algbw = bytes / kernel time, with bytes the nccl-tests "size" (the whole
  buffer for AllGather and ReduceScatter); busbw = algbw x 2(n-1)/n for
  AllReduce, x (n-1)/n for AllGather and ReduceScatter, x 1 otherwise.
- Step time = the median over recent intervals of each interval's mean
  step-to-step time (exact per step while steps are slower than the interval).
- Latency percentiles come from the interval's histogram delta. Each slot has
  log2 buckets and a fine window of FINE_OCTAVES octaves cut into 2^FINE_SUB_BITS
  (64) equal sub-buckets each, placed by the hook where the slot's latencies
  fall (tuiprof_segment.h). The interval's buckets are the fine ones inside the
  window and the log2 ones outside it. A percentile is the nearest-rank one
  (the ceil(q x n)-th smallest call) and is estimated by the middle of the
  bucket that holds it: within 1/128 (0.8 %) of the true value in the window
  (a sub-bucket of [2^e, 2^(e+1)) is 2^e/64 wide), within a factor of 1.5
  outside it. The interval in which the hook placed or moved a window has only
  the calls since then in it: when its fine counts do not add up to the log2
  counts of the window's octaves, that interval uses the log2 buckets alone.
- Latency min/max: exact when the slot's lifetime min/max was set by a call of
  this interval (the hook records the timed count at which it set each);
  otherwise a bound: the interval's lowest/highest bucket edge clamped to the
  lifetime min/max (within 1/64 in the window), and ``min_exact``/``max_exact``
  say so.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

if TYPE_CHECKING:  # the readings' types only: the arithmetic here needs no segment reader
    from tuiprof_native import segment as native

NS = 1e-9


def busbw_factor(op: str, nranks: int) -> float:
    """nccl-tests' bus-bandwidth factor of one collective on ``nranks`` ranks."""
    if nranks <= 0:
        return 1.0
    if op == "AllReduce":
        return 2.0 * (nranks - 1) / nranks
    if op in ("AllGather", "ReduceScatter"):
        return (nranks - 1) / nranks
    return 1.0


class Edges(NamedTuple):
    """A histogram bucket: latencies in [low, high) ns."""

    low: int
    high: int


_U32 = 1 << 32


@functools.cache
def fine_layout() -> tuple[int, int]:
    """The segment layout's (FINE_OCTAVES, FINE_SUB_BITS). Imported on first use, not with this module:
    ranks.py imports it before knowing whether the extension is built (and reports it when not)."""
    from tuiprof_native import segment
    return segment.FINE_OCTAVES, segment.FINE_SUB_BITS


def log2_edges(i: int) -> Edges:
    """Log2 bucket ``i`` of the hook: [2^i, 2^(i+1)) ns, bucket 0 from 0 ns."""
    return Edges(0 if i == 0 else 2**i, 2 ** (i + 1))


def fine_edges(octave: int, index: int) -> Edges:
    """Sub-bucket ``index`` of a fine window whose lowest octave is ``octave``."""
    sub_bits = fine_layout()[1]
    e = octave + (index >> sub_bits)
    width = 2 ** (e - sub_bits)
    low = 2**e + (index & ((1 << sub_bits) - 1)) * width
    return Edges(low, low + width)


class FineCounts(NamedTuple):
    """Fine-window counts from sub-bucket ``start`` on (those before and after are zero)."""

    start: int
    counts: list[int]


class IntervalHistogram:
    """An interval's timed calls by latency bucket, ascending: the log2 buckets below the slot's fine
    window, the window's sub-buckets, the log2 buckets above it; or the log2 buckets alone when no fine
    counts are given or they do not hold every call of the window's octaves (the window was placed or
    moved within the interval). Kept as running sums, bisected in C; a bucket's edges are worked out
    only for the few buckets asked for (the agent does this for every active slot every interval)."""

    def __init__(self, hist: Sequence[int], fine: FineCounts | None, fine_octave: int) -> None:
        top = fine_octave + fine_layout()[0]
        if fine is not None and sum(fine.counts) == sum(hist[fine_octave:top]):
            self._fine_at, self._fine_len, self._fine_start = fine_octave, len(fine.counts), fine.start
            self._octave, self._top = fine_octave, top
            counts = [*hist[:fine_octave], *fine.counts, *hist[top:]]
        else:
            self._fine_at, self._fine_len = len(hist), 0
            counts = list(hist)
        self._cumulative = list(itertools.accumulate(counts))
        self.total = self._cumulative[-1] if counts else 0

    @property
    def uses_fine(self) -> bool:
        return self._fine_len > 0

    def _edges(self, position: int) -> Edges:
        if position < self._fine_at:
            return log2_edges(position)
        position -= self._fine_at
        if position < self._fine_len:
            return fine_edges(self._octave, self._fine_start + position)
        return log2_edges(self._top + position - self._fine_len)

    def percentile_ns(self, q: float) -> float | None:
        """The nearest-rank q-quantile (0..1): the middle of the bucket holding the ceil(q x n)-th
        smallest call; None when there are no calls."""
        if self.total <= 0:
            return None
        rank = max(1, math.ceil(round(q * self.total, 6)))
        low, high = self._edges(bisect.bisect_left(self._cumulative, rank))
        return (low + high) / 2

    def lowest(self) -> Edges:
        """The lowest non-empty bucket (there must be calls)."""
        return self._edges(bisect.bisect_right(self._cumulative, 0))

    def highest(self) -> Edges:
        """The highest non-empty bucket (there must be calls)."""
        return self._edges(bisect.bisect_left(self._cumulative, self.total))


@dataclasses.dataclass(frozen=True)
class Extreme:
    """A slot's lifetime min or max, and whether a call of this interval set it."""

    ns: int | None
    in_interval: bool


def latency(histogram: IntervalHistogram, weighted_ns: int, weighted_timed: int, lifetime_min: Extreme,
            lifetime_max: Extreme) -> pb.LatencyStats:
    """Latency of the interval's timed ops (empty message when none were timed); the mean
    from their weighted sums (an estimate over all calls), the rest per timed op."""
    stats = pb.LatencyStats()
    p50, p99 = histogram.percentile_ns(0.50), histogram.percentile_ns(0.99)
    if weighted_timed <= 0 or p50 is None or p99 is None:
        return stats
    low = histogram.lowest().low
    high = histogram.highest().high
    if lifetime_min.ns is not None:
        low = lifetime_min.ns if lifetime_min.in_interval else max(low, lifetime_min.ns)
        stats.min_exact = lifetime_min.in_interval
    if lifetime_max.ns is not None:
        high = lifetime_max.ns if lifetime_max.in_interval else min(high, lifetime_max.ns)
        stats.max_exact = lifetime_max.in_interval
    stats.avg_seconds = weighted_ns / weighted_timed * NS
    stats.min_seconds = low * NS
    stats.max_seconds = high * NS
    stats.p50_seconds = min(max(p50, low), high) * NS
    stats.p99_seconds = min(max(p99, low), high) * NS
    return stats


SlotKey = tuple[str, str, str, str, str, int, int, int, int, int]
"""What tells one slot of a segment from another: kind, op, dtype, algo, proto, b, m, n, k, communicator."""


def slot_key(slot: native.Slot) -> SlotKey:
    return (slot.kind, slot.op, slot.dtype, slot.algo, slot.proto, slot.b, slot.m, slot.n, slot.k, slot.comm_hash)


def fine_delta(now: native.Slot, before: native.Slot | None) -> FineCounts | None:
    """The fine-window counts of the calls between two readings of a slot (``before`` None: since the
    segment's creation); None without a window. When the hook placed or moved the window in between,
    the counts since then: :class:`IntervalHistogram` uses them only if they hold all of the interval's.
    A reading holds its counts' non-zero span only; a count that wrapped to 0 lies in the older span."""
    if not now.fine_octave:
        return None
    counts = memoryview(now.fine).cast("I").tolist()
    if before is None or before.fine_anchors != now.fine_anchors or not before.fine:
        return FineCounts(now.fine_start, counts)
    old = memoryview(before.fine).cast("I").tolist()
    now_start = now.fine_start if counts else before.fine_start  # an empty span starts anywhere
    start = min(now_start, before.fine_start)
    end = max(now_start + len(counts), before.fine_start + len(old))

    def spread(first: int, values: list[int]) -> list[int]:
        return [0] * (first - start) + values + [0] * (end - first - len(values))

    now_counts, old_counts = spread(now_start, counts), spread(before.fine_start, old)
    return FineCounts(start, [(a - b) % _U32 for a, b in zip(now_counts, old_counts, strict=True)])


class SlotDelta:
    """What one slot did between two readings."""

    def __init__(self, now: native.Slot, before: native.Slot | None) -> None:
        self.slot = now
        self.count = now.count - (before.count if before else 0)
        self.timed = now.timed_count - (before.timed_count if before else 0)
        self.bytes = now.bytes - (before.bytes if before else 0)
        self.flops = now.flops - (before.flops if before else 0)
        self.weighted_timed = now.weighted_timed_count - (before.weighted_timed_count if before else 0)
        self.weighted_ns = now.weighted_total_ns - (before.weighted_total_ns if before else 0)
        self.weighted_bytes = now.weighted_timed_bytes - (before.weighted_timed_bytes if before else 0)
        self.weighted_flops = now.weighted_timed_flops - (before.weighted_timed_flops if before else 0)
        self._before = before

    @functools.cached_property
    def hist(self) -> list[int]:
        before = self._before
        if before is None:
            return list(self.slot.hist)
        return [a - b for a, b in zip(self.slot.hist, before.hist, strict=True)]

    @functools.cached_property
    def fine(self) -> FineCounts | None:
        return fine_delta(self.slot, self._before) if self.timed > 0 else None

    def histogram(self) -> IntervalHistogram:
        return IntervalHistogram(self.hist, self.fine, self.slot.fine_octave)

    def latency(self) -> pb.LatencyStats:
        if self.weighted_timed <= 0:
            return pb.LatencyStats()  # no timed call in the interval (most slots, most intervals): nothing to bucket
        if min(self.hist) < 0:
            return pb.LatencyStats()  # buckets that went backwards: no interval of one writer's segment
        timed_before = self.slot.timed_count - self.timed
        s = self.slot
        return latency(self.histogram(), self.weighted_ns, self.weighted_timed,
                       Extreme(s.min_ns, s.min_at_timed is not None and s.min_at_timed > timed_before),
                       Extreme(s.max_ns, s.max_at_timed is not None and s.max_at_timed > timed_before))


def gemm_stats(d: SlotDelta, seconds: float) -> pb.GemmOpStats:
    s = d.slot
    out = pb.GemmOpStats(op=printable(s.op), dtype=printable(s.dtype), shape=f"b={s.b} m={s.m} n={s.n} k={s.k}", count_total=s.count,
                         count_per_s=d.count / seconds, flops_total=float(s.flops))
    if d.weighted_ns > 0:
        out.tflops = d.weighted_flops / (d.weighted_ns * NS) / 1e12
    out.latency.CopyFrom(d.latency())
    if s.first_call_ns is not None:
        out.first_call_seconds = s.first_call_ns * NS
    out.timed_count_total = s.timed_count
    out.timed_count_interval = d.timed
    out.sample_every = s.sample_every
    return out


def nccl_stats(d: SlotDelta, seconds: float) -> pb.NcclOpStats:
    s = d.slot
    out = pb.NcclOpStats(op=printable(s.op), dtype=printable(s.dtype), algorithm=printable(s.algo),
                         protocol=printable(s.proto), comm_hash=f"{s.comm_hash:x}",
                         comm_size=s.nranks, count_total=s.count, count_per_s=d.count / seconds,
                         bytes_total=s.bytes)
    if d.weighted_ns > 0:
        algbw = d.weighted_bytes / (d.weighted_ns * NS)
        out.algbw_bytes_per_s = algbw
        out.busbw_bytes_per_s = algbw * busbw_factor(s.op, s.nranks)
    out.latency.CopyFrom(d.latency())
    return out


def mean_step_seconds(now: native.Counters, before: native.Counters | None) -> float | None:
    """Mean step-to-step time of the steps finished between two readings of a segment's
    counters (``before`` None: since its creation), None when no step interval ended.

    The hook sums step-to-step intervals; the first step ever closes no interval."""
    steps = now.step_count - (before.step_count if before else 0)
    intervals = steps - (1 if before is None or before.step_count == 0 else 0)
    total_ns = now.step_time_total_ns - (before.step_time_total_ns if before else 0)
    if intervals <= 0 or total_ns < 0:
        return None
    return total_ns / intervals * NS


def total_tflops(deltas: Sequence[SlotDelta]) -> float | None:
    """All timed GEMM FLOPs of the interval over their summed kernel time, each call
    weighted by the calls it stands for."""
    ns = sum(d.weighted_ns for d in deltas)
    return sum(d.weighted_flops for d in deltas) / (ns * NS) / 1e12 if ns > 0 else None
