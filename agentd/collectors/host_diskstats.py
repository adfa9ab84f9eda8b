"""Disks: /proc/diskstats' totals and rates of the whole disks listed in /sys/block.

Partitions are left out (only whole disks are in /sys/block, so nothing is counted twice),
and so are loop devices, RAM disks, compressed swap and floppies. Which names are whole
disks is decided again only when /proc/diskstats' names change. Totals never go down (a
counter read lower than before is taken as wrapped, as psutil's ``nowrap`` does).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from agentd.collectors.host_devices import DeviceRates, Rate
from agentd.collectors.host_roots import HostRoots
from agentd.procfs import OpenProcFile
from agentd.proto import tuiprof_agent_pb2 as pb

# Devices that are not disks a user cares about: loop devices, RAM disks,
# compressed swap, floppies.
_IGNORED_DISK_PREFIXES = ("loop", "ram", "zram", "fd")

SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own sector size


class DiskCounters(NamedTuple):
    """One disk's totals from /proc/diskstats."""

    read_bytes: int
    write_bytes: int
    reads: int
    writes: int
    busy_ms: int


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


def whole_disks(names: list[str], sys_block: str) -> list[str]:
    """The names that are whole block devices worth reporting (no partitions, loops, RAM disks)."""
    return [
        name
        for name in names
        if os.path.exists(os.path.join(sys_block, name)) and not name.startswith(_IGNORED_DISK_PREFIXES)
    ]


class WholeDisks:
    """The whole disks' counters from /proc/diskstats; which names are whole disks is decided
    again only when the names change (a name's kind cannot change while it is listed)."""

    def __init__(self, sys_block: str) -> None:
        self._sys_block = sys_block
        self._names: tuple[str, ...] = ()
        self._whole: frozenset[str] = frozenset()

    def __call__(self, devices: dict[str, list[bytes]]) -> dict[str, DiskCounters]:
        names = tuple(devices)
        if names != self._names:
            self._names, self._whole = names, frozenset(whole_disks(sorted(names), self._sys_block))
        return {name: disk_counters(devices[name]) for name in names if name in self._whole}


def disk_totals(name: str, now: DiskCounters) -> pb.DiskStats:
    """A disk's message with its totals."""
    return pb.DiskStats(
        name=name,
        read_bytes_total=now.read_bytes,
        write_bytes_total=now.write_bytes,
        busy_seconds_total=now.busy_ms / 1000.0,
        reads_total=now.reads,
        writes_total=now.writes,
    )


def _busy_percent(busy_ms_per_s: float) -> float:
    return min(100.0, busy_ms_per_s / 10.0)


DISK_RATES = (
    Rate("read_bytes_per_s", "read_bytes"),
    Rate("write_bytes_per_s", "write_bytes"),
    Rate("read_iops", "reads"),
    Rate("write_iops", "writes"),
    Rate("busy_percent", "busy_ms", _busy_percent),
)


class DiskStatsReader:
    """Every whole disk of /proc/diskstats: totals, byte rates, IOPS and busy percent (``HostSnapshot.disks``)."""

    def __init__(self, roots: HostRoots) -> None:
        self._diskstats = OpenProcFile(roots.in_proc("diskstats"))
        self._whole_disks = WholeDisks(roots.in_sys("block"))
        self._rates = DeviceRates(disk_totals, DISK_RATES)

    def read(self, into: pb.HostSnapshot, now: float) -> None:
        into.disks.extend(self._rates(self._whole_disks(parse_diskstats(self._diskstats.read())), now))

    def close(self) -> None:
        self._diskstats.close()
