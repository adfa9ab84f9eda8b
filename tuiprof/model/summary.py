"""One host reduced to the figures of a cluster-table row (and of filters and sorting).

Computed straight from the wire message, once per snapshot: this is the only
per-snapshot work a console watching a thousand hosts must do for every host.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.protobuf.message import Message

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import hang_level
from tuiprof.model.behaviour import collector_gap, ratio_percent
from tuiprof.model.convert import from_word
from tuiprof.model.messages import HangLevel, SlowdownCause
from tuiprof.model.values import NOT_REPORTED, REASONS_FIELD, Reading, Unavailable, available, first_reason


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
    hang_level: HangLevel


def reading(message: Message, field: str, default_reason: str = NOT_REPORTED) -> Reading:
    """An optional proto field as a number, or Unavailable with the message's reason."""
    if message.HasField(field):
        number: int | float = getattr(message, field)
        return number
    has_reasons = REASONS_FIELD in message.DESCRIPTOR.fields_by_name
    reasons: Mapping[str, str] = getattr(message, REASONS_FIELD) if has_reasons else {}
    return Unavailable(reasons.get(field) or default_reason)


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


def _field(messages: Iterable[Message], field: str, reason: str) -> list[Reading]:
    return [reading(m, field, reason) for m in messages]


def summarize(message: pb.HostSnapshot) -> HostSummary:
    gpus, ranks = message.gpus, message.ranks
    no_gpu = collector_gap(message.collectors, "gpu") or Unavailable("no GPUs on this host")
    no_ranks = collector_gap(message.collectors, "ranks") or Unavailable("no training processes seen")
    host_reason = (collector_gap(message.collectors, "host") or Unavailable(NOT_REPORTED)).reason
    idle = reading(message.cpu, "idle_percent", host_reason)
    used = reading(message.memory, "used_bytes", host_reason)
    total = reading(message.memory, "total_bytes", host_reason)
    busbw = [reading(op, "busbw_bytes_per_s") for rank in ranks for op in rank.nccl]
    return HostSummary(
        cpu_percent=idle if isinstance(idle, Unavailable) else 100.0 - idle,
        memory_percent=ratio_percent(used, total),
        memory_used_bytes=used,
        gpu_count=len(gpus) if gpus else no_gpu,
        gpu_util_mean=_mean(_field(gpus, "utilization_percent", no_gpu.reason), no_gpu),
        gpu_util_min=_min(_field(gpus, "utilization_percent", no_gpu.reason), no_gpu),
        sm_active_mean=_mean(_field(gpus, "sm_active_percent", no_gpu.reason), no_gpu),
        sm_active_min=_min(_field(gpus, "sm_active_percent", no_gpu.reason), no_gpu),
        power_watts=_sum(_field(gpus, "power_watts", no_gpu.reason), no_gpu),
        gpu_memory_used_bytes=_sum(_field(gpus, "memory_used_bytes", no_gpu.reason), no_gpu),
        gpu_memory_total_bytes=_sum(_field(gpus, "memory_total_bytes", no_gpu.reason), no_gpu),
        nccl_busbw_bytes_per_s=_mean(
            busbw, no_ranks if not ranks else Unavailable("no NCCL collectives seen")
        ),
        step_time_seconds=_median(_field(ranks, "step_time_seconds", no_ranks.reason), no_ranks),
        hang_level=from_word(HangLevel, hang_level(message.hang.level)),
    )


@dataclass(frozen=True)
class SlowJob:
    """A job the agents judge slow, as the fleet view's Prometheus has it: its cause, its costliest
    rank's cost per step (``tuiprof_job_slow``, ``tuiprof_rank_slowdown_cost_seconds``)."""

    job_id: str
    cause: SlowdownCause
    cost_seconds: float
