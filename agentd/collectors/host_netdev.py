"""NICs: /proc/net/dev's totals and rates, and each NIC's pause-frame counters from its driver (ethtool).

Totals never go down (a counter read lower than before is taken as wrapped, as psutil's
``nowrap`` does). What does not change between samples is not asked again: each NIC's
driver (``/sys/class/net/<nic>/device/driver``), and that a NIC's driver has none of the
pause counters (asked again every ``STATIC_REFRESH_SECONDS``); a NIC that leaves
/proc/net/dev is forgotten.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from agentd.collectors.ethtool import NO_STATISTICS, NOT_SUPPORTED, EthtoolStats
from agentd.collectors.host_devices import DeviceRates, Rate
from agentd.collectors.host_roots import STATIC_REFRESH_SECONDS, HostRoots
from agentd.collectors.readings import Unavailable
from agentd.procfs import OpenProcFile
from agentd.proto import tuiprof_agent_pb2 as pb

# The ethtool statistics dynolog reads per NIC (pause frames sent: PFC storms on RoCE show here).
PAUSE_COUNTERS = ("tx_pause_ctrl_phy", *(f"tx_prio{n}_pause" for n in range(8)),
                  "tx_pause_storm_warning_events", "tx_pause_storm_error_events")


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


def nic_totals(name: str, now: NicCounters) -> pb.NicStats:
    """A NIC's message with its totals (each counter as its ``<counter>_total`` field)."""
    return pb.NicStats(
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


NIC_RATES = (Rate("rx_bytes_per_s", "rx_bytes"), Rate("tx_bytes_per_s", "tx_bytes"))


def pause_counters(stats: dict[str, int] | Unavailable, driver: str) -> dict[str, int] | Unavailable:
    """The PAUSE_COUNTERS among a NIC's ethtool statistics, or why there are none."""
    if isinstance(stats, Unavailable):
        return stats
    chosen = {name: stats[name] for name in PAUSE_COUNTERS if name in stats}
    return chosen or Unavailable(f"the driver ({driver}) has none of the pause counters dynolog reads")


def nic_driver(nic: str, net_root: str) -> str:
    """The kernel driver behind a NIC (its device's ``driver`` link), "virtual NIC" when it has no device."""
    try:
        return os.path.basename(os.readlink(os.path.join(net_root, nic, "device", "driver")))
    except OSError:
        return "virtual NIC"


class NetDevReader:
    """Every NIC of /proc/net/dev: totals, byte rates and pause counters (``HostSnapshot.nics``).

    The pause counters are asked of ``ethtool`` by NIC name, in the agent's own network namespace.
    """

    def __init__(self, roots: HostRoots, ethtool: EthtoolStats) -> None:
        self._net_dev = OpenProcFile(roots.in_proc("net/dev"))
        self._net_root = roots.in_sys("class/net")
        self._ethtool = ethtool
        self._rates = DeviceRates(nic_totals, NIC_RATES)
        self._drivers: dict[str, str] = {}  # NIC -> driver, for the reason a NIC has no pause counters
        self._without_pauses: dict[str, tuple[float, Unavailable]] = {}  # NIC -> when found so, and why

    def read(self, into: pb.HostSnapshot, now: float) -> None:
        readings = parse_net_dev(self._net_dev.read())
        nics = self._rates(readings, now)
        for nic in nics:
            pauses = self._pause_counters(nic.name, now)
            if isinstance(pauses, Unavailable):
                nic.unavailable["ethtool_stats"] = pauses.reason
            else:
                nic.ethtool_stats.extend(pb.NamedCounter(name=key, value=value) for key, value in pauses.items())
        into.nics.extend(nics)
        for known in (self._drivers, self._without_pauses):
            for gone in known.keys() - readings.keys():
                del known[gone]

    def close(self) -> None:
        self._net_dev.close()

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
            driver = self._drivers[nic] = nic_driver(nic, self._net_root)
        return driver
