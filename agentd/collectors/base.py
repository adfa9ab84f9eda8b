"""What every agentd collector is: a sampler on its own interval that fills its part of a snapshot.

The agent runs each collector's ``collect()`` on that collector's own schedule
(its own thread, so a slow NVML call never delays the host metrics) and, once
per agent interval, calls ``fill()`` on every collector to assemble one
``HostSnapshot``. ``fill`` copies the latest finished sample; it never samples.
A collector that cannot work reports it through ``status()`` (available=False
and a reason) and fills nothing: absent, never zero.
"""

from __future__ import annotations

import abc

from agentd.proto import tuiprof_agent_pb2 as pb


class Collector(abc.ABC):
    """One source of metrics (host, gpu, pmu, ranks, ...)."""

    name: str

    def __init__(self, interval_seconds: float) -> None:
        self.interval_seconds = interval_seconds

    @abc.abstractmethod
    def status(self) -> pb.CollectorStatus:
        """Whether this collector works here, and why not when it does not."""

    @abc.abstractmethod
    def collect(self) -> None:
        """Take one sample (called from this collector's own thread)."""

    @abc.abstractmethod
    def fill(self, snapshot: pb.HostSnapshot) -> None:
        """Copy the latest sample into ``snapshot`` (cheap; thread-safe)."""

    def describe(self, info: pb.AgentInfo) -> None:
        """Add what this collector knows about the machine to ``GetInfo`` (GPU list,
        driver/NVML/CUDA versions). Called on every GetInfo: cheap and thread-safe."""

    def close(self) -> None:
        """Release handles (NVML, perf fds, mapped segments)."""
