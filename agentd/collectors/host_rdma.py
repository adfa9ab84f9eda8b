"""RDMA ports: the counters of every port of every RDMA device under /sys/class/infiniband.

Read as they are (totals since the last reset): ``counters/`` (the InfiniBand port counters)
and ``hw_counters/`` (the driver's, e.g. mlx5's congestion notifications).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from agentd.collectors.host_roots import STATIC_REFRESH_SECONDS, HostRoots
from agentd.procfs import read_attribute
from agentd.proto import tuiprof_agent_pb2 as pb

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


class RdmaReader:
    """Counters of every port of every RDMA device (``HostSnapshot.rdma``), or why there are none.

    Which devices, ports and counter files there are is listed again every
    STATIC_REFRESH_SECONDS, or at the next sample when one of the files is gone (a device
    removed); the values are read every sample, each file with one ``read_attribute``.
    """

    def __init__(self, roots: HostRoots) -> None:
        self._root = roots.in_sys("class/infiniband")
        self._layout: list[_RdmaPort] | str | None = None  # the ports, or why there are none
        self._listed_at = 0.0

    def read(self, into: pb.HostSnapshot, now: float) -> None:
        if self._layout is None or now - self._listed_at >= STATIC_REFRESH_SECONDS:
            self._layout, self._listed_at = self._list(), now
        stats = into.rdma
        if isinstance(self._layout, str):
            stats.unavailable_reason = self._layout
            return
        stats.SetInParent()  # present, even with no port
        for known in self._layout:
            port = stats.ports.add(device=known.device, port=known.port, netdev=known.netdev)
            self._read_values(os.path.join(known.directory, "counters"), known.counters, port.counters)
            self._read_values(os.path.join(known.directory, "hw_counters"), known.hw_counters, port.hw_counters)

    def _list(self) -> list[_RdmaPort] | str:
        try:
            devices = sorted(os.listdir(self._root))
        except FileNotFoundError:
            return f"no RDMA device: {self._root} is absent (no InfiniBand/RoCE driver loaded)"
        except OSError as exc:
            return f"cannot list {self._root}: {exc.strerror}"
        if not devices:
            return f"no RDMA device: {self._root} is empty"
        ports = []
        for device in devices:
            device_dir = os.path.join(self._root, device)
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

