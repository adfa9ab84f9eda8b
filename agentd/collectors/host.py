"""Host metrics from /proc, /sys and ethtool, one reader per area, as node_exporter splits them.

| reader | reads | fills |
|---|---|---|
| ``host_cpu.CpuReader`` | /proc/stat, /proc/loadavg, the /proc listing | ``cpu`` (all CPUs, each core, load, processes, uptime, interrupts) |
| ``host_numa.NumaReader`` | /sys/devices/system/node, with the CPU reader's /proc/stat | ``cpu.numa_nodes`` |
| ``host_memory.MemoryReader`` | /proc/meminfo | ``memory`` |
| ``host_netdev.NetDevReader`` | /proc/net/dev, /sys/class/net, ethtool | ``nics`` |
| ``host_diskstats.DiskStatsReader`` | /proc/diskstats, /sys/block | ``disks`` |
| ``host_rdma.RdmaReader`` | /sys/class/infiniband | ``rdma`` |

Every reader takes the /proc and /sys roots it reads (``host_roots.HostRoots``), keeps what
it needs of its previous reading, and fills its part of one ``HostSnapshot`` per sample.
Each /proc file is read once per sample, whole, from a descriptor kept open; what does not
change between samples is not read again (each reader says what it keeps).

Rates (CPU percentages, bytes/s, IOPS) are deltas between two consecutive samples divided
by the time between them (one clock reading per sample, for every reader). The first sample
of anything (the first tick, or a NIC/disk that just appeared) has no previous value, so
its rates are reported unavailable with the reason "first sample", never as 0; a counter
that went backwards (device reset, driver reload) gives "counter reset".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from agentd.collectors.base import Collector
from agentd.collectors.ethtool import EthtoolStats
from agentd.collectors.host_cpu import CpuReader
from agentd.collectors.host_diskstats import DiskStatsReader
from agentd.collectors.host_memory import MemoryReader
from agentd.collectors.host_netdev import NetDevReader
from agentd.collectors.host_numa import NumaReader
from agentd.collectors.host_rdma import RdmaReader
from agentd.collectors.host_roots import HostRoots
from agentd.proto import tuiprof_agent_pb2 as pb


class HostCollector(Collector):
    """The host's readers composed; one ``collect`` reads every counter once (well under 1 ms)."""

    name = "host"

    def __init__(self, interval_seconds: float, clock: Callable[[], float] = time.monotonic,
                 roots: HostRoots = HostRoots()) -> None:
        super().__init__(interval_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: pb.HostSnapshot | None = None  # the parts of the last sample
        self._ethtool = EthtoolStats()
        self._cpu = CpuReader(roots)
        self._numa = NumaReader(roots)
        self._memory = MemoryReader(roots)
        self._netdev = NetDevReader(roots, self._ethtool)
        self._diskstats = DiskStatsReader(roots)
        self._rdma = RdmaReader(roots)

    def status(self) -> pb.CollectorStatus:
        return pb.CollectorStatus(name=self.name, available=True, interval_seconds=self.interval_seconds)

    def collect(self) -> None:
        sample = pb.HostSnapshot()
        now = self._clock()
        stat = self._cpu.read(sample)  # first: without /proc/stat the sample fails (an OSError)
        self._numa.read(sample, stat, now)
        self._memory.read(sample)
        self._netdev.read(sample, now)
        self._diskstats.read(sample, now)
        self._rdma.read(sample, now)
        with self._lock:
            self._latest = sample

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        with self._lock:
            if self._latest is not None:
                snapshot.MergeFrom(self._latest)

    def close(self) -> None:
        self._ethtool.close()
        for reader in (self._cpu, self._memory, self._netdev, self._diskstats):
            reader.close()
