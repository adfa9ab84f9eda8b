"""CPU time per NUMA node: each node's CPUs from /sys/devices/system/node, their times from /proc/stat.

The nodes' CPU lists are read again only when the online CPUs change (hotplug is what
changes ``node*/cpulist``) or every ``STATIC_REFRESH_SECONDS``. The three modes dynolog
reports per node (``cpu_{u,s,i}_node<N>``) are kept.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from agentd.collectors.host_cpu import CpuShares, ProcStat, cpu_shares, fill_shares, summed_times
from agentd.collectors.host_roots import STATIC_REFRESH_SECONDS, HostRoots
from agentd.collectors.readings import FIRST_SAMPLE, Unavailable
from agentd.proto import tuiprof_agent_pb2 as pb

_NODE_SHARE_FIELDS = ("user_percent", "system_percent", "idle_percent")


def parse_cpulist(text: str) -> list[int]:
    """A kernel CPU list such as ``0-3,8-11`` (empty for a node without CPUs)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def read_numa_nodes(root: str) -> dict[int, list[int]] | Unavailable:
    """Each NUMA node's CPUs from ``<root>/node<N>/cpulist``; nodes without CPUs (memory-only) are left out."""
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
    times: pb.CpuModeSeconds


def numa_times(nodes: dict[int, list[int]], stat: ProcStat) -> dict[int, NodeTimes]:
    """Per node, the times of those of its CPUs that /proc/stat lists (the online ones)."""
    result = {}
    for node, cpus in nodes.items():
        online = tuple(cpu for cpu in cpus if cpu in stat.cpus)
        result[node] = NodeTimes(online, summed_times([stat.cpus[cpu] for cpu in online]))
    return result


def fill_numa_nodes(cpu: pb.CpuStats, previous: dict[int, NodeTimes] | Unavailable | None,
                    current: dict[int, NodeTimes] | Unavailable) -> None:
    """``cpu.numa_nodes``: each node's CPUs, times and shares since ``previous``, or why there are none."""
    if isinstance(current, Unavailable):
        cpu.unavailable["numa_nodes"] = current.reason
        return
    for node, now in current.items():
        stats = cpu.numa_nodes.add(node=node, cpus=now.cpus)
        if now.cpus:  # a node whose CPUs are all offline has no time to report (not 0)
            stats.seconds_total.CopyFrom(now.times)
        before = None if previous is None or isinstance(previous, Unavailable) else previous.get(node)
        if not now.cpus:
            shares: CpuShares | Unavailable = Unavailable("none of the node's CPUs is online")
        elif before is None:
            shares = Unavailable(FIRST_SAMPLE)
        elif before.cpus != now.cpus:
            shares = Unavailable("the node's online CPUs changed since the previous sample")
        else:
            shares = cpu_shares(before.times, now.times)
        fill_shares(stats, shares, _NODE_SHARE_FIELDS)


class NumaNodes:
    """The NUMA nodes' CPU lists, read again only when the online CPUs change (hotplug is what
    changes ``node*/cpulist``) or the last read is STATIC_REFRESH_SECONDS old; a failed read is
    not kept."""

    def __init__(self, root: str) -> None:
        self._root = root
        self._nodes: dict[int, list[int]] | None = None
        self._online: tuple[int, ...] = ()
        self._read_at = 0.0

    def __call__(self, online: tuple[int, ...], now: float) -> dict[int, list[int]] | Unavailable:
        if self._nodes is None or online != self._online or now - self._read_at >= STATIC_REFRESH_SECONDS:
            nodes = read_numa_nodes(self._root)
            if isinstance(nodes, Unavailable):
                self._nodes = None
                return nodes
            self._nodes, self._online, self._read_at = nodes, online, now
        return self._nodes


class NumaReader:
    """CPU time and shares per NUMA node (``CpuStats.numa_nodes``), from the CPU reader's /proc/stat."""

    def __init__(self, roots: HostRoots) -> None:
        self._nodes = NumaNodes(roots.in_sys("devices/system/node"))
        self._previous: dict[int, NodeTimes] | Unavailable | None = None

    def read(self, into: pb.HostSnapshot, stat: ProcStat, now: float) -> None:
        nodes = self._nodes(tuple(stat.cpus), now)
        current = nodes if isinstance(nodes, Unavailable) else numa_times(nodes, stat)
        fill_numa_nodes(into.cpu, self._previous, current)
        self._previous = current
