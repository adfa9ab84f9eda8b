"""Is a rank starved of CPU? Its threads' run-queue delay and its cgroup's quota throttling, per second.

A thread that is runnable but not running waits on a run queue; the kernel sums that
wait per thread in ``/proc/<pid>/task/<tid>/schedstat`` (second field, ns). Summed
over the rank's threads, it grows when other work competes for the rank's CPUs
(busy processes pinned where the rank runs). A cgroup whose CPU quota is spent is
throttled as a whole: ``cpu.stat``'s ``throttled_usec`` in cgroup v2. Both are
counters: the collector turns them into rates between two readings of one rank.
Threads come and go: each thread's delay counts from its previous reading, a new
thread's from zero (it started in the interval), so an exiting thread never makes
the sum go down. A container's ranks share one cgroup: its ``cpu.stat`` is read once
an interval however many of them there are (``CpuStatReads``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Set as AbstractSet

from agentd.collectors.readings import FIRST_SAMPLE, NO_TIME_ELAPSED, Unavailable, counter_rate
from agentd.procfs import line_from, read_attribute

NO_SCHEDSTAT = "/proc/<pid>/task/*/schedstat is not readable (kernel without CONFIG_SCHED_INFO, or the process is gone)"
NO_CGROUP_V2 = "the process's cgroup has no cgroup v2 cpu.stat (cgroup v1 host, or no cpu controller)"


class CpuStatReads:
    """The cgroup v2 ``cpu.stat`` files' ``throttled_usec`` as read this interval, each file once: the ranks
    of one container (one cgroup) share it. ``next_interval`` forgets them."""

    def __init__(self) -> None:
        self._read: dict[str, int | None] = {}

    def next_interval(self) -> None:
        self._read.clear()

    def throttled_us(self, cpu_stat: str) -> int | None:
        """The file's ``throttled_usec`` (None: gone, unreadable, or no such line)."""
        if cpu_stat not in self._read:
            self._read[cpu_stat] = _read_throttled_us(cpu_stat)
        return self._read[cpu_stat]


class SchedReader:
    """One rank process's run-queue delay and CPU throttling, read each interval; its cgroup's ``cpu.stat``
    through ``cpu_stats``, shared with the other ranks' readers."""

    def __init__(self, pid: int, cpu_stats: CpuStatReads, proc: str = "/proc",
                 cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.pid, self.proc, self.cgroup_root, self._cpu_stats = pid, proc, cgroup_root, cpu_stats
        self._delays: dict[int, int] | None = None
        self._throttled_us: int | None = None
        self._cpu_stat: str | None = None  # its path once looked up ("" when there is none)

    def run_delay_seconds_per_s(self, seconds: float, ran: bool, idle_threads: AbstractSet[int]) -> float | Unavailable:
        """The threads' run-queue delay over the interval. ``ran``: whether any of them may have had a CPU in
        it (``pmu.RankCounters.ran``); ``idle_threads``: those that surely had none (``idle_threads`` there).

        The kernel adds a thread's wait to its delay when the thread gets the CPU, so a thread that never ran
        added nothing: its delay is taken as last read, without reading its file, and when no thread ran the
        delay is 0 without even listing them (once a reading stands). A wait also ends when the thread
        leaves a queue without the CPU, moved to another CPU's queue; such a wait is counted in the next
        interval its file is read in, from the last reading, never lost. A thread id is trusted as idle only
        while it was listed at the last reading too (an id the kernel gave to a new thread since would need
        every pid to be handed out within one interval)."""
        if not ran and self._delays and seconds > 0:
            return 0.0
        before = self._delays or {}
        delays = _task_delays(f"{self.proc}/{self.pid}/task",
                              {tid: before[tid] for tid in idle_threads if tid in before})
        if not delays:
            return Unavailable(NO_SCHEDSTAT)
        self._delays = delays
        if not before:
            return Unavailable(FIRST_SAMPLE)
        if seconds <= 0:
            return Unavailable(NO_TIME_ELAPSED)
        return sum(max(0, delay - before.get(tid, 0)) for tid, delay in delays.items()) * 1e-9 / seconds

    def cpu_throttled_seconds_per_s(self, seconds: float) -> float | Unavailable:
        throttled = self._read_throttled_us()
        if throttled is None:
            return Unavailable(NO_CGROUP_V2)
        before, self._throttled_us = self._throttled_us, throttled
        rate = counter_rate(before, throttled, seconds)
        return rate if isinstance(rate, Unavailable) else rate * 1e-6

    def _read_throttled_us(self) -> int | None:
        if self._cpu_stat is None:
            self._cpu_stat = _cpu_stat_path(self.proc, self.pid, self.cgroup_root) or ""
        return self._cpu_stats.throttled_us(self._cpu_stat) if self._cpu_stat else None


def _read_throttled_us(cpu_stat: str) -> int | None:
    try:
        raw = read_attribute(cpu_stat)  # a dozen short lines
    except OSError:
        return None
    at = raw.find(b"\nthrottled_usec ")  # never the first line (usage_usec is)
    if at < 0:
        return None
    try:
        return int(line_from(raw, at + 16))
    except ValueError:
        return None


def _task_delays(task_dir: str, unchanged: Mapping[int, int]) -> dict[int, int]:
    """Each listed thread's run-queue delay (ns), by thread id; {} when none could be read. ``unchanged``: the
    delays of threads known not to have run since they were read, taken as they are."""
    delays = {}
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return {}
    for name in tids:
        try:
            tid = int(name)
            delay = unchanged.get(tid)
            delays[tid] = int(read_attribute(f"{task_dir}/{name}/schedstat").split()[1]) if delay is None else delay
        except (OSError, ValueError, IndexError):
            continue  # the thread exited between the listing and the read
    return delays


def _cpu_stat_path(proc: str, pid: int, cgroup_root: str) -> str | None:
    """The cgroup v2 cpu.stat of the process's cgroup, or None (cgroup v1, gone, unreadable)."""
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, path = line.partition("::")
        if hierarchy == "0":
            candidate = os.path.normpath(f"{cgroup_root}/{path.lstrip('/')}/cpu.stat")
            if candidate.startswith(cgroup_root) and os.path.exists(candidate):
                return candidate
    return None
