"""One host reduced to the figures of a cluster-table row (and of filters and sorting)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tuiprof.model.snapshot import HostSnapshot
from tuiprof.model.values import Reading, Unavailable, available, first_reason


@dataclass(frozen=True, slots=True)
class HostSummary:
    cpu_percent: Reading
    memory_percent: Reading
    memory_used_bytes: Reading
    gpu_count: Reading
    gpu_util_mean: Reading
    gpu_util_min: Reading
    sm_active_mean: Reading
    sm_active_min: Reading
    power_watts: Reading
    gpu_memory_used_bytes: Reading
    gpu_memory_total_bytes: Reading
    nccl_busbw_bytes_per_s: Reading
    step_time_seconds: Reading
    hang_level: str


def _mean(values: list[Reading], empty: Unavailable) -> Reading:
    numbers = available(values)
    return statistics.fmean(numbers) if numbers else first_reason(values, empty.reason)


def _min(values: list[Reading], empty: Unavailable) -> Reading:
    numbers = available(values)
    return min(numbers) if numbers else first_reason(values, empty.reason)


def _sum(values: list[Reading], empty: Unavailable) -> Reading:
    """The sum, unavailable unless every term is known (a partial sum would mislead)."""
    numbers = available(values)
    if values and len(numbers) == len(values):
        return sum(numbers)
    return first_reason(values, empty.reason)


def _median(values: list[Reading], empty: Unavailable) -> Reading:
    numbers = available(values)
    return statistics.median(numbers) if numbers else first_reason(values, empty.reason)


def summarize(snapshot: HostSnapshot) -> HostSummary:
    gpus = snapshot.gpus
    no_gpu = snapshot.missing("gpu") or Unavailable("no GPUs on this host")
    no_ranks = snapshot.missing("ranks") or Unavailable("no training processes seen")
    ranks = snapshot.ranks
    busbw = [op.busbw_bytes_per_s for rank in ranks for op in rank.nccl]
    return HostSummary(
        cpu_percent=snapshot.cpu.busy_percent,
        memory_percent=snapshot.memory.used_percent,
        memory_used_bytes=snapshot.memory.used_bytes,
        gpu_count=len(gpus) if gpus else no_gpu,
        gpu_util_mean=_mean([g.utilization_percent for g in gpus], no_gpu),
        gpu_util_min=_min([g.utilization_percent for g in gpus], no_gpu),
        sm_active_mean=_mean([g.sm_active_percent for g in gpus], no_gpu),
        sm_active_min=_min([g.sm_active_percent for g in gpus], no_gpu),
        power_watts=_sum([g.power_watts for g in gpus], no_gpu),
        gpu_memory_used_bytes=_sum([g.memory_used_bytes for g in gpus], no_gpu),
        gpu_memory_total_bytes=_sum([g.memory_total_bytes for g in gpus], no_gpu),
        nccl_busbw_bytes_per_s=_mean(
            busbw, no_ranks if not ranks else Unavailable("no NCCL collectives seen")
        ),
        step_time_seconds=_median([r.step_time_seconds for r in ranks], no_ranks),
        hang_level=snapshot.hang.level,
    )
