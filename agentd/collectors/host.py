"""Host metrics from /proc, /sys and ethtool: CPU (all, per core, per NUMA node), load,
uptime, interrupts, memory, NICs (with the driver's pause-frame counters), RDMA ports, disks.

Each /proc file is read once per sample, whole, from a descriptor kept open
(``procfs.OpenProcFile``): /proc/stat (CPU times of all CPUs and each online one,
interrupt totals), /proc/meminfo (memory and swap), /proc/net/dev, /proc/diskstats,
/proc/loadavg (the task count). The figures are the ones psutil gives
(memory "available" as ``free`` shows it, NIC and disk totals that never go down: a
counter read lower than before is taken as wrapped, its old value added, as psutil's
``nowrap`` does), without psutil's second reads and per-call set-up. What does not
change between samples is not read again: the NUMA nodes' CPU lists (read again when
the online CPUs change, and every ``STATIC_REFRESH_SECONDS``), which /proc/diskstats
names are whole disks (decided again when the names change), each NIC's driver,
that a NIC's driver has none of the pause counters (asked again every
``STATIC_REFRESH_SECONDS``; a NIC that leaves /proc/net/dev is forgotten), the RDMA
ports and their counter files (listed again as often, or when one is gone).

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
from typing import Any, Callable, NamedTuple, TypeVar

import psutil

from agentd.collectors.base import Collector
from agentd.collectors.ethtool import NO_STATISTICS, NOT_SUPPORTED, EthtoolStats
from agentd.collectors.readings import COUNTER_RESET, FIRST_SAMPLE, Unavailable, counter_rate, put, put_unavailable
from agentd.procfs import OpenProcFile, read_attribute
from agentd.proto import tuiprof_agent_pb2 as pb

# Static facts (the NUMA nodes' CPU lists, a NIC without pause counters, the RDMA ports and
# their counter files) are read again at least this often, besides when what they depend on changes.
STATIC_REFRESH_SECONDS = 60.0

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
    def from_ticks(cls, ticks: list[str], ticks_per_second: int) -> CpuTimes:
        """A /proc/stat cpu line's numbers (older kernels give fewer columns: the rest are 0)."""
        seconds = [int(tick) / ticks_per_second for tick in ticks[:10]]
        return cls._make(seconds if len(seconds) == 10 else seconds + [0.0] * (10 - len(seconds)))

    @classmethod
    def summed(cls, parts: list[CpuTimes]) -> CpuTimes:
        return cls(*(float(sum(column)) for column in zip(*parts, strict=True))) if parts else cls(*[0.0] * 10)

    def total(self) -> float:
        """All time; guest time is already inside user/nice on Linux, so it is not added again."""
        return sum(self) - self.guest - self.guest_nice


class CpuShares(NamedTuple):
    """Percent of a CPU's time spent per mode over one interval (the modes in CpuTimes' order)."""

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


def cpu_shares(previous: CpuTimes, current: CpuTimes) -> CpuShares | Unavailable:
    """Per-mode percentages between two readings, or the reason there are none."""
    elapsed = current.total() - previous.total()
    if elapsed < 0:
        return Unavailable(COUNTER_RESET)
    if elapsed == 0:
        return Unavailable("no CPU time elapsed between samples")
    shares = [100.0 * (now - then) / elapsed for now, then in zip(current, previous)]
    return CpuShares._make([0.0 if share < 0.0 else 100.0 if share > 100.0 else share for share in shares])


# Per core only the four main modes are kept (the snapshot has one entry per core).
_CORE_SHARE_FIELDS = ("user_percent", "system_percent", "idle_percent", "iowait_percent")
_ALL_SHARE_FIELDS = tuple(f"{mode}_percent" for mode in CpuTimes._fields)
# Per NUMA node, the three modes dynolog reports per node (cpu_{u,s,i}_node<N>).
_NODE_SHARE_FIELDS = ("user_percent", "system_percent", "idle_percent")


def _fill_shares(message: pb.CpuStats | pb.CpuCoreStats | pb.NumaNodeStats, shares: CpuShares | Unavailable,
                 fields: tuple[str, ...]) -> None:
    if isinstance(shares, Unavailable):
        put_unavailable(message, fields, shares.reason)
        return
    for field in fields:
        setattr(message, field, getattr(shares, field))


def uptime_seconds() -> float:
    """Seconds since boot, as /proc/uptime gives them (CLOCK_BOOTTIME, in hundredths; no file read)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 10_000_000 / 100


@dataclasses.dataclass(frozen=True)
class ProcStat:
    """One read of /proc/stat."""

    total: CpuTimes                 # all CPUs
    cpus: dict[int, CpuTimes]       # by CPU number; an offline CPU has no line
    counts: dict[str, int]          # totals of the "intr", "softirq" and "processes" lines, where the kernel has them


def parse_proc_stat(text: str, ticks_per_second: int) -> ProcStat:
    total: CpuTimes | None = None
    cpus: dict[int, CpuTimes] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            total = CpuTimes.from_ticks(rest.split(), ticks_per_second)
        elif name.startswith("cpu") and name[3:].isdigit():
            cpus[int(name[3:])] = CpuTimes.from_ticks(rest.split(), ticks_per_second)
        elif name in ("intr", "softirq", "processes"):
            counts[name] = int(rest.split(None, 1)[0])  # the total; the per-source counts are not needed
    return ProcStat(total if total is not None else CpuTimes.summed(list(cpus.values())), cpus, counts)


_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def read_proc_stat(file: OpenProcFile) -> ProcStat:
    """/proc/stat parsed (an OSError propagates: without it there are no CPU figures at all)."""
    return parse_proc_stat(file.read().decode("ascii"), _TICKS_PER_SECOND)


def memory_stats(meminfo: bytes) -> pb.MemoryStats:
    """Memory and swap from /proc/meminfo's text, as psutil's virtual_memory and swap_memory give them.

    "available" is MemAvailable; where the kernel lacks it or reports 0 (a kernel bug), psutil's
    estimate (what ``free`` shows) is taken; more than the total (a container's distorted view)
    is replaced by MemFree, as ``free`` does. Without swap lines, psutil asks sysinfo(2).
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


class NicCounters(NamedTuple):
    """One NIC's totals from /proc/net/dev."""

    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    rx_errors: int
    tx_errors: int
    rx_drops: int
    tx_drops: int


def parse_net_dev(text: bytes) -> dict[str, NicCounters]:
    """/proc/net/dev: per NIC, receive columns 0-3 (bytes packets errs drop) and transmit columns 8-11."""
    nics = {}
    for line in text.split(b"\n")[2:]:
        name, colon, rest = line.rpartition(b":")
        if not colon:
            continue
        f = rest.split()
        nics[name.strip().decode()] = NicCounters(int(f[0]), int(f[8]), int(f[1]), int(f[9]),
                                                  int(f[2]), int(f[10]), int(f[3]), int(f[11]))
    return nics


class DiskCounters(NamedTuple):
    """One disk's totals from /proc/diskstats."""

    read_bytes: int
    write_bytes: int
    reads: int
    writes: int
    busy_ms: int


SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own sector size


def parse_diskstats(text: bytes) -> dict[str, list[bytes]]:
    """/proc/diskstats: each device's name and its columns after the name (not yet numbers)."""
    devices = {}
    for line in text.split(b"\n"):
        fields = line.split()
        if len(fields) >= 14:  # 2.6+ (partitions too since 4.x); shorter lines are old kernels' partitions
            devices[fields[2].decode()] = fields[3:]
    return devices


def disk_counters(columns: list[bytes]) -> DiskCounters:
    """Reads completed (column 0), sectors read (2), writes completed (4), sectors written (6), ms doing I/O (9)."""
    return DiskCounters(int(columns[2]) * SECTOR_BYTES, int(columns[6]) * SECTOR_BYTES,
                        int(columns[0]), int(columns[4]), int(columns[9]))


CounterTuple = TypeVar("CounterTuple", NicCounters, DiskCounters)


class Unwrapped:
    """Totals that never go down, as psutil's ``nowrap=True`` keeps them.

    A counter read lower than the time before is taken as having wrapped (old drivers'
    32-bit counters): its previous value is added to it from then on. A device that
    disappears forgets what was added to its counters.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, ...]] = {}
        self._added: dict[str, list[int]] = {}

    def __call__(self, readings: dict[str, CounterTuple]) -> dict[str, CounterTuple]:
        result = {}
        for name, now in readings.items():
            added = self._added.get(name)
            before = self._last.get(name)
            if before is not None:
                for index, (value, previous) in enumerate(zip(now, before)):
                    if value < previous:
                        if added is None:
                            added = self._added[name] = [0] * len(now)
                        added[index] += previous
            result[name] = now if added is None else type(now)._make(v + a for v, a in zip(now, added))
        for gone in self._added.keys() - readings.keys():
            del self._added[gone]
        self._last = dict(readings)
        return result


def count_processes(proc: bytes = b"/proc") -> int:
    """How many processes exist: the numeric entries of /proc (what psutil.pids() lists)."""
    return sum(map(bytes.isdigit, os.listdir(proc)))


def read_task_count(file: OpenProcFile) -> int:
    """How many tasks (threads) exist: "0.21 0.30 0.58 4/121 3583" gives 121 (runnable/existing).

    (The load figures themselves come from os.getloadavg(), whose precision is glibc's:
    this file prints them to two decimals.)
    """
    return int(file.read().split()[3].partition(b"/")[2])


class ProcessCount:
    """How many processes exist, listing /proc again only when a task may have come or gone.

    Every task created (process or thread) adds one to /proc/stat's "processes" (forks
    since boot); the kernel's count of tasks (/proc/loadavg) drops only when one is reaped,
    which is when its /proc entry goes. Both read before the last listing and both the
    same now: no task was created or reaped since, so the count still holds.
    """

    def __init__(self) -> None:
        self._counted_at: tuple[int, int] | None = None  # (forks, tasks) read before the last listing
        self._count = 0

    def __call__(self, forks: int | None, tasks: int) -> int:
        """The count, given "processes" of a /proc/stat and the tasks of a /proc/loadavg read just before."""
        if forks is None or (forks, tasks) != self._counted_at:
            self._count = count_processes()
            self._counted_at = None if forks is None else (forks, tasks)
        return self._count


NODE_ROOT = "/sys/devices/system/node"


def parse_cpulist(text: str) -> list[int]:
    """A kernel CPU list such as ``0-3,8-11`` (empty for a node without CPUs)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def read_numa_nodes(root: str = NODE_ROOT) -> dict[int, list[int]] | Unavailable:
    """Each NUMA node's CPUs from ``node<N>/cpulist``; nodes without CPUs (memory-only) are left out."""
    try:
        names = os.listdir(root)
    except OSError as exc:
        return Unavailable(f"the kernel exposes no NUMA nodes: cannot list {root} ({exc.strerror}); "
                           "it is absent when the kernel is built without CONFIG_NUMA")
    nodes: dict[int, list[int]] = {}
    for name in names:
        if not (name.startswith("node") and name[4:].isdigit()):
            continue
        path = os.path.join(root, name, "cpulist")
        try:
            with open(path, encoding="ascii") as file:
                cpus = parse_cpulist(file.read())
        except (OSError, ValueError) as exc:
            return Unavailable(f"cannot read {path}: {exc}")
        if cpus:
            nodes[int(name[4:])] = cpus
    if not nodes:
        return Unavailable(f"the kernel lists no NUMA node with CPUs under {root}")
    return dict(sorted(nodes.items()))


class NodeTimes(NamedTuple):
    """One NUMA node's online CPUs and their summed times."""

    cpus: tuple[int, ...]
    times: CpuTimes


def numa_times(nodes: dict[int, list[int]], stat: ProcStat) -> dict[int, NodeTimes]:
    """Per node, the times of those of its CPUs that /proc/stat lists (the online ones)."""
    result = {}
    for node, cpus in nodes.items():
        online = tuple(cpu for cpu in cpus if cpu in stat.cpus)
        result[node] = NodeTimes(online, CpuTimes.summed([stat.cpus[cpu] for cpu in online]))
    return result


# The ethtool statistics dynolog reads per NIC (pause frames sent: PFC storms on RoCE show here).
PAUSE_COUNTERS = ("tx_pause_ctrl_phy", *(f"tx_prio{n}_pause" for n in range(8)),
                  "tx_pause_storm_warning_events", "tx_pause_storm_error_events")


def pause_counters(stats: dict[str, int] | Unavailable, driver: str) -> dict[str, int] | Unavailable:
    """The PAUSE_COUNTERS among a NIC's ethtool statistics, or why there are none."""
    if isinstance(stats, Unavailable):
        return stats
    chosen = {name: stats[name] for name in PAUSE_COUNTERS if name in stats}
    return chosen or Unavailable(f"the driver ({driver}) has none of the pause counters dynolog reads")


def nic_driver(nic: str, net_root: str = "/sys/class/net") -> str:
    """The kernel driver behind a NIC (its device's ``driver`` link), "virtual NIC" when it has no device."""
    try:
        return os.path.basename(os.readlink(os.path.join(net_root, nic, "device", "driver")))
    except OSError:
        return "virtual NIC"


IB_ROOT = "/sys/class/infiniband"
# Files of hw_counters/ that are settings, not counters (mlx5: how long a read is cached, in ms).
_NOT_COUNTERS = frozenset({"lifespan"})


def _counter_names(directory: str) -> tuple[str, ...]:
    """The counter files of ``directory``, sorted; none when it is absent (e.g. no hw_counters on this driver)."""
    try:
        return tuple(sorted(name for name in os.listdir(directory) if name not in _NOT_COUNTERS))
    except FileNotFoundError:
        return ()


def _netdev_of(device_dir: str) -> str:
    """The network interface of an RDMA device (its PCI function's net/), empty when none."""
    try:
        return min(os.listdir(os.path.join(device_dir, "device", "net")))
    except (OSError, ValueError):
        return ""


@dataclasses.dataclass(frozen=True)
class _RdmaPort:
    """Where one port's counters are, and their names (as listed)."""

    device: str
    port: int
    netdev: str
    directory: str
    counters: tuple[str, ...]
    hw_counters: tuple[str, ...]


class RdmaCounters:
    """Counters of every port of every RDMA device, read as they are (totals since the last reset).

    Which devices, ports and counter files there are is listed again every
    STATIC_REFRESH_SECONDS, or at the next sample when one of the files is gone (a device
    removed); the values are read every sample, each file with one ``read_attribute``.
    """

    def __init__(self, root: str = IB_ROOT) -> None:
        self.root = root
        self._layout: list[_RdmaPort] | str | None = None  # the ports, or why there are none
        self._listed_at = 0.0

    def read(self, now: float) -> pb.RdmaStats:
        if self._layout is None or now - self._listed_at >= STATIC_REFRESH_SECONDS:
            self._layout, self._listed_at = self._list(), now
        if isinstance(self._layout, str):
            return pb.RdmaStats(unavailable_reason=self._layout)
        stats = pb.RdmaStats()
        for known in self._layout:
            port = stats.ports.add(device=known.device, port=known.port, netdev=known.netdev)
            self._read_values(os.path.join(known.directory, "counters"), known.counters, port.counters)
            self._read_values(os.path.join(known.directory, "hw_counters"), known.hw_counters, port.hw_counters)
        return stats

    def _list(self) -> list[_RdmaPort] | str:
        try:
            devices = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return f"no RDMA device: {self.root} is absent (no InfiniBand/RoCE driver loaded)"
        except OSError as exc:
            return f"cannot list {self.root}: {exc.strerror}"
        if not devices:
            return f"no RDMA device: {self.root} is empty"
        ports = []
        for device in devices:
            device_dir = os.path.join(self.root, device)
            netdev = _netdev_of(device_dir)
            try:
                numbers = sorted(int(port) for port in os.listdir(os.path.join(device_dir, "ports")) if port.isdigit())
            except OSError:
                continue  # a device being removed
            for number in numbers:
                directory = os.path.join(device_dir, "ports", str(number))
                ports.append(_RdmaPort(device, number, netdev, directory, _counter_names(os.path.join(directory, "counters")),
                                       _counter_names(os.path.join(directory, "hw_counters"))))
        return ports

    def _read_values(self, directory: str, names: tuple[str, ...], into: Any) -> None:
        """Each counter of ``names`` into the repeated ``into``; an unreadable one says why."""
        for name in names:
            counter = into.add(name=name)
            try:
                counter.value = int(read_attribute(os.path.join(directory, name)))
            except FileNotFoundError as exc:  # the device went: list again next sample
                counter.unavailable["value"] = exc.strerror or str(exc)
                self._layout = None
            except OSError as exc:  # some hw counters answer EINVAL/EOPNOTSUPP on some firmware
                counter.unavailable["value"] = exc.strerror or str(exc)
            except ValueError:
                counter.unavailable["value"] = "not a number"


class _Raw(NamedTuple):
    """One reading of every monotonic counter the rates come from."""

    at: float
    stat: ProcStat
    numa: dict[int, NodeTimes] | Unavailable
    nics: dict[str, NicCounters]
    disks: dict[str, DiskCounters]


def whole_disks(names: list[str], sys_block: str = "/sys/block") -> list[str]:
    """The names that are whole block devices worth reporting (no partitions, loops, RAM disks)."""
    return [
        name
        for name in names
        if os.path.exists(os.path.join(sys_block, name)) and not name.startswith(_IGNORED_DISK_PREFIXES)
    ]


class WholeDisks:
    """The whole disks' counters from /proc/diskstats; which names are whole disks is decided
    again only when the names change (a name's kind cannot change while it is listed)."""

    def __init__(self) -> None:
        self._names: tuple[str, ...] = ()
        self._whole: frozenset[str] = frozenset()

    def __call__(self, devices: dict[str, list[bytes]]) -> dict[str, DiskCounters]:
        names = tuple(devices)
        if names != self._names:
            self._names, self._whole = names, frozenset(whole_disks(sorted(names)))
        return {name: disk_counters(devices[name]) for name in names if name in self._whole}


class NumaNodes:
    """The NUMA nodes' CPU lists, read again only when the online CPUs change (hotplug is what
    changes ``node*/cpulist``) or the last read is STATIC_REFRESH_SECONDS old; a failed read is
    not kept."""

    def __init__(self) -> None:
        self._nodes: dict[int, list[int]] | None = None
        self._online: tuple[int, ...] = ()
        self._read_at = 0.0

    def __call__(self, online: tuple[int, ...], now: float) -> dict[int, list[int]] | Unavailable:
        if self._nodes is None or online != self._online or now - self._read_at >= STATIC_REFRESH_SECONDS:
            nodes = read_numa_nodes()
            if isinstance(nodes, Unavailable):
                self._nodes = None
                return nodes
            self._nodes, self._online, self._read_at = nodes, online, now
        return self._nodes


class HostCollector(Collector):
    """/proc and /sys sampler; one ``collect`` reads every counter once (well under 1 ms)."""

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
        self._rdma = pb.RdmaStats()
        self._ethtool = EthtoolStats()
        self._sampled = False
        self._nic_totals = Unwrapped()
        self._disk_totals = Unwrapped()
        self._whole_disks = WholeDisks()
        self._numa_nodes = NumaNodes()
        self._drivers: dict[str, str] = {}  # NIC -> driver, for the reason a NIC has no pause counters
        self._without_pauses: dict[str, tuple[float, Unavailable]] = {}  # NIC -> when found so, and why
        self._process_count = ProcessCount()
        self._rdma_counters = RdmaCounters()
        self._stat = OpenProcFile("/proc/stat")
        self._meminfo = OpenProcFile("/proc/meminfo")
        self._net_dev = OpenProcFile("/proc/net/dev")
        self._diskstats = OpenProcFile("/proc/diskstats")
        self._loadavg = OpenProcFile("/proc/loadavg")

    def status(self) -> pb.CollectorStatus:
        return pb.CollectorStatus(name=self.name, available=True, interval_seconds=self.interval_seconds)

    def collect(self) -> None:
        raw = self._read()
        previous = self._previous
        cpu = self._cpu_stats(previous, raw)
        memory = memory_stats(self._meminfo.read())
        nics = self._nic_stats(previous, raw)
        disks = self._disk_stats(previous, raw)
        rdma = self._rdma_counters.read(raw.at)
        self._previous = raw
        with self._lock:
            self._cpu, self._memory, self._nics, self._disks, self._rdma = cpu, memory, nics, disks, rdma
            self._sampled = True

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        with self._lock:
            if not self._sampled:
                return
            snapshot.cpu.CopyFrom(self._cpu)
            snapshot.memory.CopyFrom(self._memory)
            snapshot.nics.extend(self._nics)
            snapshot.disks.extend(self._disks)
            snapshot.rdma.CopyFrom(self._rdma)

    def _read(self) -> _Raw:
        nics = self._nic_totals(parse_net_dev(self._net_dev.read()))
        disks = self._disk_totals(self._whole_disks(parse_diskstats(self._diskstats.read())))
        stat = read_proc_stat(self._stat)
        now = self._clock()
        nodes = self._numa_nodes(tuple(stat.cpus), now)
        numa = nodes if isinstance(nodes, Unavailable) else numa_times(nodes, stat)
        return _Raw(at=now, stat=stat, numa=numa, nics=nics, disks=disks)

    def _cpu_stats(self, previous: _Raw | None, raw: _Raw) -> pb.CpuStats:
        cpu = pb.CpuStats()
        stat = raw.stat
        if previous is None:
            _fill_shares(cpu, Unavailable(FIRST_SAMPLE), _ALL_SHARE_FIELDS)
        else:
            _fill_shares(cpu, cpu_shares(previous.stat.total, stat.total), _ALL_SHARE_FIELDS)
        cores, previous_cpus = cpu.cores, previous.stat.cpus if previous else {}
        for number, times in sorted(stat.cpus.items()):
            before = previous_cpus.get(number)
            shares = Unavailable(FIRST_SAMPLE) if before is None else cpu_shares(before, times)
            if isinstance(shares, Unavailable):
                put_unavailable(cores.add(cpu=number), _CORE_SHARE_FIELDS, shares.reason)
            else:  # one add with every field: a proto field set from Python costs a call each
                cores.add(cpu=number, user_percent=shares.user_percent, system_percent=shares.system_percent,
                          idle_percent=shares.idle_percent, iowait_percent=shares.iowait_percent)
        cpu.seconds_total.CopyFrom(pb.CpuModeSeconds(**stat.total._asdict()))
        HostCollector._numa_stats(cpu, previous.numa if previous else None, raw.numa)
        cpu.load1, cpu.load5, cpu.load15 = os.getloadavg()
        cpu.process_count = self._process_count(stat.counts.get("processes"), read_task_count(self._loadavg))
        cpu.uptime_seconds = uptime_seconds()
        for field, line in (("interrupts_total", "intr"), ("softirqs_total", "softirq")):
            put(cpu, field, stat.counts.get(line, Unavailable(f"/proc/stat has no {line} line")))
        return cpu

    @staticmethod
    def _numa_stats(cpu: pb.CpuStats, previous: dict[int, NodeTimes] | Unavailable | None,
                    current: dict[int, NodeTimes] | Unavailable) -> None:
        if isinstance(current, Unavailable):
            cpu.unavailable["numa_nodes"] = current.reason
            return
        for node, now in current.items():
            stats = cpu.numa_nodes.add(node=node, cpus=now.cpus)
            if now.cpus:  # a node whose CPUs are all offline has no time to report (not 0)
                stats.seconds_total.CopyFrom(pb.CpuModeSeconds(**now.times._asdict()))
            before = None if previous is None or isinstance(previous, Unavailable) else previous.get(node)
            if not now.cpus:
                shares: CpuShares | Unavailable = Unavailable("none of the node's CPUs is online")
            elif before is None:
                shares = Unavailable(FIRST_SAMPLE)
            elif before.cpus != now.cpus:
                shares = Unavailable("the node's online CPUs changed since the previous sample")
            else:
                shares = cpu_shares(before.times, now.times)
            _fill_shares(stats, shares, _NODE_SHARE_FIELDS)

    def close(self) -> None:
        self._ethtool.close()
        for file in (self._stat, self._meminfo, self._net_dev, self._diskstats, self._loadavg):
            file.close()

    def _nic_stats(self, previous: _Raw | None, raw: _Raw) -> list[pb.NicStats]:
        seconds = raw.at - previous.at if previous else 0.0
        nics = []
        for name, now in sorted(raw.nics.items()):
            before = previous.nics.get(name) if previous else None
            nic = pb.NicStats(
                name=name,
                rx_bytes_total=now.rx_bytes,
                tx_bytes_total=now.tx_bytes,
                rx_errors_total=now.rx_errors,
                tx_errors_total=now.tx_errors,
                rx_drops_total=now.rx_drops,
                tx_drops_total=now.tx_drops,
                rx_packets_total=now.rx_packets,
                tx_packets_total=now.tx_packets,
            )
            put(nic, "rx_bytes_per_s", counter_rate(before and before.rx_bytes, now.rx_bytes, seconds))
            put(nic, "tx_bytes_per_s", counter_rate(before and before.tx_bytes, now.tx_bytes, seconds))
            pauses = self._pause_counters(name, raw.at)
            if isinstance(pauses, Unavailable):
                nic.unavailable["ethtool_stats"] = pauses.reason
            else:
                nic.ethtool_stats.extend(pb.NamedCounter(name=key, value=value) for key, value in pauses.items())
            nics.append(nic)
        for known in (self._drivers, self._without_pauses):
            for gone in known.keys() - raw.nics.keys():
                del known[gone]
        return nics

    def _pause_counters(self, nic: str, now: float) -> dict[str, int] | Unavailable:
        """The NIC's pause counters; a driver without them is asked again only every STATIC_REFRESH_SECONDS."""
        known = self._without_pauses.get(nic)
        if known is not None and now - known[0] < STATIC_REFRESH_SECONDS:
            return known[1]
        stats = self._ethtool.read(nic, only=PAUSE_COUNTERS)
        pauses = pause_counters(stats, self._driver(nic))
        if isinstance(pauses, Unavailable) and (stats == {} or stats in (NO_STATISTICS, NOT_SUPPORTED)):
            self._without_pauses[nic] = (now, pauses)  # the driver's answer, not a failed read
        return pauses

    def _driver(self, nic: str) -> str:
        """The NIC's driver, looked up once while the NIC stays listed in /proc/net/dev."""
        driver = self._drivers.get(nic)
        if driver is None:
            driver = self._drivers[nic] = nic_driver(nic)
        return driver

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
                busy_seconds_total=now.busy_ms / 1000.0,
                reads_total=now.reads,
                writes_total=now.writes,
            )
            put(disk, "read_bytes_per_s", counter_rate(before and before.read_bytes, now.read_bytes, seconds))
            put(disk, "write_bytes_per_s", counter_rate(before and before.write_bytes, now.write_bytes, seconds))
            put(disk, "read_iops", counter_rate(before and before.reads, now.reads, seconds))
            put(disk, "write_iops", counter_rate(before and before.writes, now.writes, seconds))
            busy_ms_per_s = counter_rate(before and before.busy_ms, now.busy_ms, seconds)
            put(disk, "busy_percent",
                busy_ms_per_s if isinstance(busy_ms_per_s, Unavailable) else min(100.0, busy_ms_per_s / 10.0))
            disks.append(disk)
        return disks
