"""A rank's device memory as ``RankStats.device_memory``: the CUDA allocations and copies the hook
library counted (``tuiprof_native/hook/memory_hooks.c``) and PyTorch's caching allocator figures the
startup hook published, from one reading of the segment and the rank's previous one (pure functions).

Copies carry per-second rates over the rank's interval (the first reading's since the segment's
creation, when every counter was zero) and their GPU time estimated from the timed ones: each timed
copy stands for the copies its direction made since the one timed before it (its weight), so the mean
of one copy is ``weighted_ns / weighted_calls`` and all copies' time that mean times their count.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from agentd.collectors.readings import counter_rate, put, put_unavailable
from agentd.proto import tuiprof_agent_pb2 as pb

if TYPE_CHECKING:  # the collector passes the module in: it may be unbuilt (ranks.py says why)
    from tuiprof_native.segment import AllocStats, CopyStats, DeviceMemory

NOT_TIMED = ("none of its copies was timed yet (the hook times the first 32 copies of each direction, then one "
             "in 16, with CUDA events: none free, or no CUDA context on the copying thread)")
_NO_ALLOCATOR = {
    "none": ("no PyTorch caching allocator figures: not a Python job, torch not imported, or no optimizer step "
             "yet (the startup hook reads them at steps)"),
    "no_cuda": "no PyTorch caching allocator figures: this torch is a CPU build (torch.version.cuda is None)",
    "uninitialized": ("no PyTorch caching allocator figures: torch.cuda is not initialized in this process (it "
                      "has not used CUDA yet)"),
}
_COPY_RATES = ("calls_per_s", "bytes_per_s")
ALLOCATOR_FIELDS = ("allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "alloc_retries_total", "ooms_total",
                    "allocator_age_seconds")


def allocator_reason(state: int, native: ModuleType) -> str | None:
    """Why the allocator's figures are missing for ``state`` (``native.ALLOCATOR_*``); None when they are there."""
    if state == native.ALLOCATOR_READ:
        return None
    if state == native.ALLOCATOR_NO_CUDA:
        return _NO_ALLOCATOR["no_cuda"]
    if state == native.ALLOCATOR_UNINITIALIZED:
        return _NO_ALLOCATOR["uninitialized"]
    return _NO_ALLOCATOR["none"]


def device_memory_stats(now: DeviceMemory, before: DeviceMemory | None, seconds: float, now_ns: int,
                        native: ModuleType) -> pb.DeviceMemoryStats:
    """``RankStats.device_memory`` from this reading (``native.DeviceMemory``) and the previous one (None for
    the rank's first reading: rates since the segment's creation)."""
    stats = pb.DeviceMemoryStats(malloc=_allocations(now.malloc), malloc_async=_allocations(now.malloc_async))
    previous = {c.direction: c for c in before.copies} if before is not None else {}
    for copies in now.copies:
        if copies.calls:
            stats.copies.append(_copies(copies, previous.get(copies.direction), seconds))
    reason = allocator_reason(now.allocator_state, native)
    if reason is not None:
        put_unavailable(stats, ALLOCATOR_FIELDS, reason)
        return stats
    stats.allocated_bytes = now.allocated_bytes
    stats.reserved_bytes = now.reserved_bytes
    stats.peak_allocated_bytes = now.peak_allocated_bytes
    stats.alloc_retries_total = now.alloc_retries
    stats.ooms_total = now.ooms
    stats.allocator_age_seconds = max(0.0, (now_ns - now.allocator_read_ns) * 1e-9)
    return stats


def _allocations(a: AllocStats) -> pb.DeviceAllocations:
    return pb.DeviceAllocations(malloc_calls_total=a.malloc_calls, malloc_bytes_total=a.malloc_bytes,
                                free_calls_total=a.free_calls, free_bytes_total=a.free_bytes,
                                free_unknown_size_total=a.free_unknown)


def _copies(now: CopyStats, before: CopyStats | None, seconds: float) -> pb.MemoryCopies:
    out = pb.MemoryCopies(direction=now.direction, calls_total=now.calls, bytes_total=now.bytes,
                          timed_calls_total=now.timed_calls, untimed_total=now.untimed)
    put(out, "calls_per_s", counter_rate(before.calls if before else 0, now.calls, seconds))
    put(out, "bytes_per_s", counter_rate(before.bytes if before else 0, now.bytes, seconds))
    if now.weighted_calls == 0:
        out.unavailable["mean_seconds"] = out.unavailable["seconds_total"] = NOT_TIMED
    else:
        out.mean_seconds = now.weighted_ns / now.weighted_calls * 1e-9
        out.seconds_total = out.mean_seconds * now.calls
    return out


def without_rates(stats: pb.RankStats, reason: str) -> None:
    """A rank not read this interval: its totals stand, its copy rates are not this interval's."""
    for copies in stats.device_memory.copies:
        for field in _COPY_RATES:
            copies.ClearField(field)
            copies.unavailable[field] = reason
