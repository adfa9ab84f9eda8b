"""CPU: time per mode of all CPUs and of each online one, interrupts, load, processes, uptime.

One read of /proc/stat (CPU times, interrupt totals, tasks created since boot) and one of
/proc/loadavg (load averages, the task count) per sample, each from a descriptor kept open
(``procfs.OpenProcFile``). The load averages are the numbers ``os.getloadavg()`` gives
(glibc reads this same file); uptime is CLOCK_BOOTTIME, as /proc/uptime prints it, without a
file read. A CPU's times are the proto's ``CpuModeSeconds``, whose fields are /proc/stat's
columns in their order.

Shares (percent of a CPU's time per mode) are deltas between two consecutive samples;
the first sample's are unavailable ("first sample"), never 0.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import time
from typing import NamedTuple

from agentd.collectors.host_roots import HostRoots
from agentd.collectors.readings import COUNTER_RESET, FIRST_SAMPLE, Unavailable, put, put_unavailable
from agentd.procfs import OpenProcFile
from agentd.proto import tuiprof_agent_pb2 as pb

# user nice system idle iowait irq softirq steal guest guest_nice: /proc/stat's cpu columns.
CPU_MODES = tuple(field.name for field in pb.CpuModeSeconds.DESCRIPTOR.fields)
# A CPU's seconds per mode as a tuple, in CPU_MODES' order (one C call: the shares of every core need it).
mode_values = operator.attrgetter(*CPU_MODES)


def times_from_ticks(ticks: list[str], ticks_per_second: int) -> pb.CpuModeSeconds:
    """A /proc/stat cpu line's numbers (older kernels give fewer columns: the rest are 0)."""
    # not strict: the modes a kernel leaves out keep the proto's 0
    seconds = {mode: int(tick) / ticks_per_second for mode, tick in zip(CPU_MODES, ticks, strict=False)}
    return pb.CpuModeSeconds(**seconds)


def summed_times(parts: list[pb.CpuModeSeconds]) -> pb.CpuModeSeconds:
    """Several CPUs' times added up per mode (all 0 for none)."""
    if not parts:
        return pb.CpuModeSeconds()
    columns = zip(*map(mode_values, parts), strict=True)
    return pb.CpuModeSeconds(**{mode: float(sum(column)) for mode, column in zip(CPU_MODES, columns, strict=True)})


_GUEST, _GUEST_NICE = CPU_MODES.index("guest"), CPU_MODES.index("guest_nice")


def total_seconds(values: tuple[float, ...]) -> float:
    """All time of ``mode_values``; guest time is already inside user/nice on Linux, so it is not added again."""
    return sum(values) - values[_GUEST] - values[_GUEST_NICE]


class CpuShares(NamedTuple):
    """Percent of a CPU's time spent per mode over one interval (the modes in CPU_MODES' order)."""

    user_percent: float
    nice_percent: float
    system_percent: float
    idle_percent: float
    iowait_percent: float
    irq_percent: float
    softirq_percent: float
    steal_percent: float
    guest_percent: float
    guest_nice_percent: float


def cpu_shares(previous: pb.CpuModeSeconds, current: pb.CpuModeSeconds) -> CpuShares | Unavailable:
    """Per-mode percentages between two readings, or the reason there are none."""
    before, now = mode_values(previous), mode_values(current)
    elapsed = total_seconds(now) - total_seconds(before)
    if elapsed < 0:
        return Unavailable(COUNTER_RESET)
    if elapsed == 0:
        return Unavailable("no CPU time elapsed between samples")
    shares = [100.0 * (later - then) / elapsed for later, then in zip(now, before, strict=True)]
    return CpuShares._make([0.0 if share < 0.0 else 100.0 if share > 100.0 else share for share in shares])


# Per core only the four main modes are kept (the snapshot has one entry per core).
_CORE_SHARE_FIELDS = ("user_percent", "system_percent", "idle_percent", "iowait_percent")
_ALL_SHARE_FIELDS = CpuShares._fields


def fill_shares(message: pb.CpuStats | pb.CpuCoreStats | pb.NumaNodeStats, shares: CpuShares | Unavailable,
                fields: tuple[str, ...]) -> None:
    """``fields`` of ``message`` from ``shares``, or each unavailable with the reason there are none."""
    if isinstance(shares, Unavailable):
        put_unavailable(message, fields, shares.reason)
        return
    for field in fields:
        setattr(message, field, getattr(shares, field))


@dataclasses.dataclass(frozen=True)
class ProcStat:
    """One read of /proc/stat."""

    total: pb.CpuModeSeconds                # all CPUs
    cpus: dict[int, pb.CpuModeSeconds]      # by CPU number; an offline CPU has no line
    counts: dict[str, int]                  # totals of the "intr", "softirq" and "processes" lines, where the kernel has them


def parse_proc_stat(text: str, ticks_per_second: int) -> ProcStat:
    total: pb.CpuModeSeconds | None = None
    cpus: dict[int, pb.CpuModeSeconds] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            total = times_from_ticks(rest.split(), ticks_per_second)
        elif name.startswith("cpu") and name[3:].isdigit():
            cpus[int(name[3:])] = times_from_ticks(rest.split(), ticks_per_second)
        elif name in ("intr", "softirq", "processes"):
            counts[name] = int(rest.split(None, 1)[0])  # the total; the per-source counts are not needed
    return ProcStat(total if total is not None else summed_times(list(cpus.values())), cpus, counts)


_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def read_proc_stat(file: OpenProcFile) -> ProcStat:
    """/proc/stat parsed (an OSError propagates: without it there are no CPU figures at all)."""
    return parse_proc_stat(file.read().decode("ascii"), _TICKS_PER_SECOND)


def fill_cpu_stats(cpu: pb.CpuStats, previous: ProcStat | None, current: ProcStat) -> None:
    """The figures of two consecutive /proc/stat reads: shares of all CPUs and per core, seconds, interrupts."""
    if previous is None:
        fill_shares(cpu, Unavailable(FIRST_SAMPLE), _ALL_SHARE_FIELDS)
    else:
        fill_shares(cpu, cpu_shares(previous.total, current.total), _ALL_SHARE_FIELDS)
    cores, previous_cpus = cpu.cores, previous.cpus if previous else {}
    for number, times in sorted(current.cpus.items()):
        before = previous_cpus.get(number)
        shares = Unavailable(FIRST_SAMPLE) if before is None else cpu_shares(before, times)
        if isinstance(shares, Unavailable):
            put_unavailable(cores.add(cpu=number), _CORE_SHARE_FIELDS, shares.reason)
        else:  # one add with every field: a proto field set from Python costs a call each
            cores.add(cpu=number, user_percent=shares.user_percent, system_percent=shares.system_percent,
                      idle_percent=shares.idle_percent, iowait_percent=shares.iowait_percent)
    cpu.seconds_total.CopyFrom(current.total)
    for field, line in (("interrupts_total", "intr"), ("softirqs_total", "softirq")):
        put(cpu, field, current.counts.get(line, Unavailable(f"/proc/stat has no {line} line")))


def uptime_seconds() -> float:
    """Seconds since boot, as /proc/uptime gives them (CLOCK_BOOTTIME, in hundredths; no file read)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 10_000_000 / 100


class LoadAverage(NamedTuple):
    """/proc/loadavg: "0.21 0.30 0.58 4/121 3583" is loads 0.21, 0.30, 0.58 and 121 tasks (runnable/existing)."""

    load1: float
    load5: float
    load15: float
    tasks: int


def parse_loadavg(text: bytes) -> LoadAverage:
    fields = text.split()
    return LoadAverage(float(fields[0]), float(fields[1]), float(fields[2]), int(fields[3].partition(b"/")[2]))


def count_processes(proc: str) -> int:
    """How many processes exist: the numeric entries of the /proc root (what psutil.pids() lists)."""
    return sum(map(bytes.isdigit, os.listdir(os.fsencode(proc))))


class ProcessCount:
    """How many processes exist, listing /proc again only when a task may have come or gone.

    Every task created (process or thread) adds one to /proc/stat's "processes" (forks
    since boot); the kernel's count of tasks (/proc/loadavg) drops only when one is reaped,
    which is when its /proc entry goes. Both read before the last listing and both the
    same now: no task was created or reaped since, so the count still holds.
    """

    def __init__(self, proc: str) -> None:
        self._proc = proc
        self._counted_at: tuple[int, int] | None = None  # (forks, tasks) read before the last listing
        self._count = 0

    def __call__(self, forks: int | None, tasks: int) -> int:
        """The count, given "processes" of a /proc/stat and the tasks of a /proc/loadavg read just before."""
        if forks is None or (forks, tasks) != self._counted_at:
            self._count = count_processes(self._proc)
            self._counted_at = None if forks is None else (forks, tasks)
        return self._count


class CpuReader:
    """CPU figures (``HostSnapshot.cpu``, but for its NUMA nodes: ``NumaReader`` adds those)."""

    def __init__(self, roots: HostRoots) -> None:
        self._stat = OpenProcFile(roots.in_proc("stat"))
        self._loadavg = OpenProcFile(roots.in_proc("loadavg"))
        self._process_count = ProcessCount(roots.proc)
        self._previous: ProcStat | None = None

    def read(self, into: pb.HostSnapshot) -> ProcStat:
        """Fill ``into.cpu``; returns the /proc/stat read, for the NUMA reader."""
        stat = read_proc_stat(self._stat)
        cpu = into.cpu
        fill_cpu_stats(cpu, self._previous, stat)
        load = parse_loadavg(self._loadavg.read())
        cpu.load1, cpu.load5, cpu.load15 = load.load1, load.load5, load.load15
        cpu.process_count = self._process_count(stat.counts.get("processes"), load.tasks)
        cpu.uptime_seconds = uptime_seconds()
        self._previous = stat
        return stat

    def close(self) -> None:
        self._stat.close()
        self._loadavg.close()
