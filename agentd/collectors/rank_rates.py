"""Per-interval rates of one rank from two readings of its segment (pure functions).

A segment holds cumulative counters per aggregate slot (count, timed count,
total kernel ns, bytes, FLOPs, a log2 latency histogram). Everything here is
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
- Latency percentiles come from the interval's histogram delta: buckets are
  powers of two, a percentile is interpolated inside its bucket (an estimate).
- Latency min/max: exact when the slot's lifetime min/max was set by a call of
  this interval (the hook records the timed count at which it set each);
  otherwise a bound: the interval's lowest/highest bucket edge clamped to the
  lifetime min/max, and ``min_exact``/``max_exact`` say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agentd.proto import tuiprof_agent_pb2 as pb

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


def _bucket_edges(i: int) -> tuple[float, float]:
    return (0.0 if i == 0 else float(2**i)), float(2 ** (i + 1))


def percentile_ns(hist: Sequence[int], q: float) -> float | None:
    """The q-quantile (0..1) of a log2 histogram, interpolated within its bucket."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(hist):
        if n and seen + n >= rank:
            low, high = _bucket_edges(i)
            return low + (high - low) * max(0.0, rank - seen) / n
        seen += n
    return _bucket_edges(len(hist) - 1)[1]


@dataclasses.dataclass(frozen=True)
class Extreme:
    """A slot's lifetime min or max, and whether a call of this interval set it."""

    ns: int | None
    in_interval: bool


def latency(hist_delta: Sequence[int], weighted_ns: int, weighted_timed: int, lifetime_min: Extreme,
            lifetime_max: Extreme) -> pb.LatencyStats:
    """Latency of the interval's timed ops (empty message when none were timed); the mean
    from their weighted sums (an estimate over all calls), the rest per timed op."""
    stats = pb.LatencyStats()
    p50, p99 = percentile_ns(hist_delta, 0.50), percentile_ns(hist_delta, 0.99)
    if weighted_timed <= 0 or p50 is None or p99 is None or min(hist_delta) < 0:
        return stats  # nothing timed; or buckets that went backwards: no interval of one writer's segment
    used = [i for i, n in enumerate(hist_delta) if n]
    low = _bucket_edges(used[0])[0]
    high = _bucket_edges(used[-1])[1]
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


def slot_key(slot) -> tuple:
    return (slot.kind, slot.op, slot.dtype, slot.algo, slot.proto, slot.b, slot.m, slot.n, slot.k, slot.comm_hash)


class SlotDelta:
    """What one slot did between two readings."""

    def __init__(self, now, before) -> None:
        self.slot = now
        self.count = now.count - (before.count if before else 0)
        self.timed = now.timed_count - (before.timed_count if before else 0)
        self.bytes = now.bytes - (before.bytes if before else 0)
        self.flops = now.flops - (before.flops if before else 0)
        self.weighted_timed = now.weighted_timed_count - (before.weighted_timed_count if before else 0)
        self.weighted_ns = now.weighted_total_ns - (before.weighted_total_ns if before else 0)
        self.weighted_bytes = now.weighted_timed_bytes - (before.weighted_timed_bytes if before else 0)
        self.weighted_flops = now.weighted_timed_flops - (before.weighted_timed_flops if before else 0)
        self.hist = [a - (b if before else 0) for a, b in zip(now.hist, before.hist if before else now.hist)]

    def latency(self) -> pb.LatencyStats:
        timed_before = self.slot.timed_count - self.timed
        s = self.slot
        return latency(self.hist, self.weighted_ns, self.weighted_timed,
                       Extreme(s.min_ns, s.min_at_timed is not None and s.min_at_timed > timed_before),
                       Extreme(s.max_ns, s.max_at_timed is not None and s.max_at_timed > timed_before))


def gemm_stats(d: SlotDelta, seconds: float) -> pb.GemmOpStats:
    s = d.slot
    out = pb.GemmOpStats(op=s.op, dtype=s.dtype, shape=f"b={s.b} m={s.m} n={s.n} k={s.k}", count_total=s.count,
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
    out = pb.NcclOpStats(op=s.op, dtype=s.dtype, algorithm=s.algo, protocol=s.proto, comm_hash=f"{s.comm_hash:x}",
                         comm_size=s.nranks, count_total=s.count, count_per_s=d.count / seconds,
                         bytes_total=s.bytes)
    if d.weighted_ns > 0:
        algbw = d.weighted_bytes / (d.weighted_ns * NS)
        out.algbw_bytes_per_s = algbw
        out.busbw_bytes_per_s = algbw * busbw_factor(s.op, s.nranks)
    out.latency.CopyFrom(d.latency())
    return out


def mean_step_seconds(now, before) -> float | None:
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
