"""Memory and swap from one read of /proc/meminfo, the figures psutil gives."""

from __future__ import annotations

import psutil

from agentd.collectors.host_roots import HostRoots
from agentd.procfs import OpenProcFile
from agentd.proto import tuiprof_agent_pb2 as pb


def memory_stats(meminfo: bytes) -> pb.MemoryStats:
    """Memory and swap from /proc/meminfo's text, as psutil's virtual_memory and swap_memory give them.

    "available" is MemAvailable; where the kernel lacks it or reports 0 (a kernel bug), psutil's
    estimate (what ``free`` shows) is taken; more than the total (a container's distorted view)
    is replaced by MemFree, as ``free`` does. Without swap lines, psutil asks sysinfo(2).
    (Those two fallbacks, for old kernels, read the agent's own /proc, whatever the root.)
    """
    total = _meminfo_required(meminfo, b"MemTotal:")
    available = _meminfo_bytes(meminfo, b"MemAvailable:") or psutil.virtual_memory().available
    if available > total:
        available = _meminfo_required(meminfo, b"MemFree:")
    swap_total, swap_free = _meminfo_bytes(meminfo, b"SwapTotal:"), _meminfo_bytes(meminfo, b"SwapFree:")
    if swap_total is not None and swap_free is not None:
        swap_used = swap_total - swap_free
    else:
        swap = psutil.swap_memory()
        swap_total, swap_used = swap.total, swap.used
    return pb.MemoryStats(total_bytes=total, used_bytes=total - available, available_bytes=available,
                          swap_total_bytes=swap_total, swap_used_bytes=swap_used)


def _meminfo_bytes(meminfo: bytes, name: bytes) -> int | None:
    """The value of one /proc/meminfo line ("Name:   123 kB") in bytes, None when there is no such line."""
    if meminfo.startswith(name):
        start = 0
    else:
        start = meminfo.find(b"\n" + name) + 1
        if start == 0:
            return None
    end = meminfo.find(b"\n", start)
    return int(meminfo[start + len(name):end if end >= 0 else None].split()[0]) * 1024


def _meminfo_required(meminfo: bytes, name: bytes) -> int:
    """A /proc/meminfo line every kernel has (sysinfo(2) gives them too); ValueError without it."""
    value = _meminfo_bytes(meminfo, name)
    if value is None:
        raise ValueError(f"/proc/meminfo has no {name.decode()} line")
    return value


class MemoryReader:
    """Memory and swap (``HostSnapshot.memory``)."""

    def __init__(self, roots: HostRoots) -> None:
        self._meminfo = OpenProcFile(roots.in_proc("meminfo"))

    def read(self, into: pb.HostSnapshot) -> None:
        into.memory.CopyFrom(memory_stats(self._meminfo.read()))

    def close(self) -> None:
        self._meminfo.close()
