"""Host metrics from psutil and /proc: CPU, load, uptime, interrupts, memory, NICs, disks.

Rates (CPU percentages, bytes/s, IOPS) are deltas between two consecutive
samples divided by the time between them. The first sample of anything (the
first tick, or a NIC/disk that just appeared) has no previous value, so its
rates are reported unavailable with the reason "first sample", never as 0; a
counter that went backwards (device reset, driver reload) gives "counter reset".
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import TYPE_CHECKING, Callable, NamedTuple

import psutil

from agentd.collectors.base import Collector
from agentd.collectors.readings import COUNTER_RESET, FIRST_SAMPLE, Unavailable, counter_rate, put, put_unavailable
from agentd.proto import tuiprof_agent_pb2 as pb

if TYPE_CHECKING:  # psutil's per-NIC and per-disk counter tuples, as its stubs name them
    from psutil._ntuples import sdiskio, snetio

# Devices that are not disks a user cares about: loop devices, RAM disks,
# compressed swap, floppies. Partitions are excluded separately (only whole
# disks listed in /sys/block are reported, so nothing is counted twice).
_IGNORED_DISK_PREFIXES = ("loop", "ram", "zram", "fd")


class CpuTimes(NamedTuple):
    """The /proc/stat fields that make up one CPU's time, in seconds."""

    user: float
    nice: float
    system: float
    idle: float
    iowait: float
    irq: float
    softirq: float
    steal: float
    guest: float
    guest_nice: float

    @classmethod
    def from_psutil(cls, times: object) -> CpuTimes:
        return cls(*(float(getattr(times, field, 0.0)) for field in cls._fields))

    def total(self) -> float:
        """All time; guest time is already inside user/nice on Linux, so it is not added again."""
        return sum(self) - self.guest - self.guest_nice


@dataclasses.dataclass(frozen=True)
class CpuShares:
    """Percent of a CPU's time spent per mode over one interval."""

    user_percent: float
    system_percent: float
    idle_percent: float
    iowait_percent: float
    nice_percent: float
    irq_percent: float
    softirq_percent: float
    steal_percent: float
    guest_percent: float
    guest_nice_percent: float


def cpu_shares(previous: CpuTimes, current: CpuTimes) -> CpuShares | Unavailable:
    """Per-mode percentages between two readings, or the reason there are none."""
    elapsed = current.total() - previous.total()
    if elapsed < 0:
        return Unavailable(COUNTER_RESET)
    if elapsed == 0:
        return Unavailable("no CPU time elapsed between samples")

    def share(field: str) -> float:
        delta = getattr(current, field) - getattr(previous, field)
        return min(100.0, max(0.0, 100.0 * delta / elapsed))

    return CpuShares(**{f"{mode}_percent": share(mode) for mode in CpuTimes._fields})


def _counter(reading: snetio | sdiskio | None, field: str) -> int | None:
    """A counter of the previous reading, None when there was none."""
    return None if reading is None else getattr(reading, field)


# Per core only the four main modes are kept (the snapshot has one entry per core).
_CORE_SHARE_FIELDS = ("user_percent", "system_percent", "idle_percent", "iowait_percent")
_ALL_SHARE_FIELDS = tuple(f"{mode}_percent" for mode in CpuTimes._fields)


def _fill_shares(message: pb.CpuStats | pb.CpuCoreStats, shares: CpuShares | Unavailable,
                 fields: tuple[str, ...]) -> None:
    if isinstance(shares, Unavailable):
        put_unavailable(message, fields, shares.reason)
        return
    for field in fields:
        setattr(message, field, getattr(shares, field))


def read_uptime(path: str = "/proc/uptime") -> float | Unavailable:
    """Seconds since boot (the first number of /proc/uptime)."""
    try:
        with open(path, encoding="ascii") as file:
            return float(file.read().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        return Unavailable(f"cannot read {path}: {exc}")


def read_interrupt_counts(path: str = "/proc/stat") -> dict[str, int] | Unavailable:
    """The totals of the ``intr`` and ``softirq`` lines of /proc/stat (their first number)."""
    try:
        with open(path, encoding="ascii") as file:
            counts = {words[0]: int(words[1]) for words in (line.split() for line in file)
                      if len(words) > 1 and words[0] in ("intr", "softirq")}
    except (OSError, ValueError) as exc:
        return Unavailable(f"cannot read {path}: {exc}")
    return counts


class _Raw(NamedTuple):
    """One psutil reading of every monotonic counter the rates come from."""

    at: float
    cpu_total: CpuTimes
    cpu_cores: list[CpuTimes]
    nics: dict[str, snetio]
    disks: dict[str, sdiskio]


def whole_disks(names: list[str], sys_block: str = "/sys/block") -> list[str]:
    """The names that are whole block devices worth reporting (no partitions, loops, RAM disks)."""
    return [
        name
        for name in names
        if os.path.exists(os.path.join(sys_block, name)) and not name.startswith(_IGNORED_DISK_PREFIXES)
    ]


class HostCollector(Collector):
    """psutil sampler; one ``collect`` reads every counter once (well under 1 ms)."""

    name = "host"

    def __init__(self, interval_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(interval_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._previous: _Raw | None = None
        self._cpu = pb.CpuStats()
        self._memory = pb.MemoryStats()
        self._nics: list[pb.NicStats] = []
        self._disks: list[pb.DiskStats] = []
        self._sampled = False

    def status(self) -> pb.CollectorStatus:
        return pb.CollectorStatus(name=self.name, available=True, interval_seconds=self.interval_seconds)

    def collect(self) -> None:
        raw = self._read()
        previous = self._previous
        cpu = self._cpu_stats(previous, raw)
        memory = self._memory_stats()
        nics = self._nic_stats(previous, raw)
        disks = self._disk_stats(previous, raw)
        self._previous = raw
        with self._lock:
            self._cpu, self._memory, self._nics, self._disks = cpu, memory, nics, disks
            self._sampled = True

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        with self._lock:
            if not self._sampled:
                return
            snapshot.cpu.CopyFrom(self._cpu)
            snapshot.memory.CopyFrom(self._memory)
            snapshot.nics.extend(self._nics)
            snapshot.disks.extend(self._disks)

    def _read(self) -> _Raw:
        nics = psutil.net_io_counters(pernic=True, nowrap=True)
        disk_counters = psutil.disk_io_counters(perdisk=True, nowrap=True) or {}
        disks = {name: disk_counters[name] for name in whole_disks(sorted(disk_counters))}
        return _Raw(
            at=self._clock(),
            cpu_total=CpuTimes.from_psutil(psutil.cpu_times()),
            cpu_cores=[CpuTimes.from_psutil(times) for times in psutil.cpu_times(percpu=True)],
            nics=nics,
            disks=disks,
        )

    @staticmethod
    def _cpu_stats(previous: _Raw | None, raw: _Raw) -> pb.CpuStats:
        cpu = pb.CpuStats()
        if previous is None:
            _fill_shares(cpu, Unavailable(FIRST_SAMPLE), _ALL_SHARE_FIELDS)
        else:
            _fill_shares(cpu, cpu_shares(previous.cpu_total, raw.cpu_total), _ALL_SHARE_FIELDS)
        for index, times in enumerate(raw.cpu_cores):
            core = cpu.cores.add(cpu=index)
            if previous is None or index >= len(previous.cpu_cores):
                _fill_shares(core, Unavailable(FIRST_SAMPLE), _CORE_SHARE_FIELDS)
            else:
                _fill_shares(core, cpu_shares(previous.cpu_cores[index], times), _CORE_SHARE_FIELDS)
        cpu.seconds_total.CopyFrom(pb.CpuModeSeconds(**raw.cpu_total._asdict()))
        cpu.load1, cpu.load5, cpu.load15 = psutil.getloadavg()
        cpu.process_count = len(psutil.pids())
        put(cpu, "uptime_seconds", read_uptime())
        counts = read_interrupt_counts()
        for field, line in (("interrupts_total", "intr"), ("softirqs_total", "softirq")):
            if isinstance(counts, Unavailable):
                put(cpu, field, counts)
            else:
                put(cpu, field, counts.get(line, Unavailable(f"/proc/stat has no {line} line")))
        return cpu

    @staticmethod
    def _memory_stats() -> pb.MemoryStats:
        virtual = psutil.virtual_memory()
        swap = psutil.swap_memory()
        return pb.MemoryStats(
            total_bytes=virtual.total,
            used_bytes=virtual.total - virtual.available,
            available_bytes=virtual.available,
            swap_total_bytes=swap.total,
            swap_used_bytes=swap.used,
        )

    @staticmethod
    def _nic_stats(previous: _Raw | None, raw: _Raw) -> list[pb.NicStats]:
        seconds = raw.at - previous.at if previous else 0.0
        nics = []
        for name, now in sorted(raw.nics.items()):
            before = previous.nics.get(name) if previous else None
            nic = pb.NicStats(
                name=name,
                rx_bytes_total=now.bytes_recv,
                tx_bytes_total=now.bytes_sent,
                rx_errors_total=now.errin,
                tx_errors_total=now.errout,
                rx_drops_total=now.dropin,
                tx_drops_total=now.dropout,
                rx_packets_total=now.packets_recv,
                tx_packets_total=now.packets_sent,
            )
            for field, counter in (("rx_bytes_per_s", "bytes_recv"), ("tx_bytes_per_s", "bytes_sent")):
                put(nic, field, counter_rate(_counter(before, counter), getattr(now, counter), seconds))
            nics.append(nic)
        return nics

    @staticmethod
    def _disk_stats(previous: _Raw | None, raw: _Raw) -> list[pb.DiskStats]:
        seconds = raw.at - previous.at if previous else 0.0
        disks = []
        for name, now in sorted(raw.disks.items()):
            before = previous.disks.get(name) if previous else None
            disk = pb.DiskStats(
                name=name,
                read_bytes_total=now.read_bytes,
                write_bytes_total=now.write_bytes,
                busy_seconds_total=now.busy_time / 1000.0,
                reads_total=now.read_count,
                writes_total=now.write_count,
            )
            pairs = (
                ("read_bytes_per_s", "read_bytes"),
                ("write_bytes_per_s", "write_bytes"),
                ("read_iops", "read_count"),
                ("write_iops", "write_count"),
            )
            for field, counter in pairs:
                put(disk, field, counter_rate(_counter(before, counter), getattr(now, counter), seconds))
            busy_ms_per_s = counter_rate(_counter(before, "busy_time"), now.busy_time, seconds)
            put(disk, "busy_percent",
                busy_ms_per_s if isinstance(busy_ms_per_s, Unavailable) else min(100.0, busy_ms_per_s / 10.0))
            disks.append(disk)
        return disks
