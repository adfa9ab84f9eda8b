"""What every agentd collector is: a sampler on its own interval that fills its part of a snapshot.

The agent runs each collector's ``collect()`` on that collector's own schedule
(its own thread, so a slow NVML call never delays the host metrics) and, once
per agent interval, calls ``fill()`` on every collector to assemble one
``HostSnapshot``. ``fill`` copies the latest finished sample; it never samples.

A collector whose samples are deltas of cumulative counters (the ranks'
operations) is instead sampled by the snapshot tick itself
(``clocked_by_snapshots``): one ``collect()`` right before each snapshot, so
each published interval holds exactly what happened since the previous one.
On its own timer, two samples between two snapshots would lose the first
one's delta, and a snapshot between no new samples would repeat a delta.
A collector that cannot work reports it through ``status()`` (available=False
and a reason) and fills nothing: absent, never zero.
"""

from __future__ import annotations

import abc

from agentd.proto import tuiprof_agent_pb2 as pb


class Collector(abc.ABC):
    """One source of metrics (host, gpu, pmu, ranks, ...)."""

    name: str
    # Sampled once per snapshot, by the snapshot tick, instead of on its own thread.
    clocked_by_snapshots: bool = False

    def __init__(self, interval_seconds: float) -> None:
        self.interval_seconds = interval_seconds

    @abc.abstractmethod
    def status(self) -> pb.CollectorStatus:
        """Whether this collector works here, and why not when it does not."""

    @abc.abstractmethod
    def collect(self) -> None:
        """Take one sample (called from this collector's own thread, or the snapshot tick's)."""

    @abc.abstractmethod
    def fill(self, snapshot: pb.HostSnapshot) -> None:
        """Copy the latest sample into ``snapshot`` (cheap; thread-safe)."""

    def describe(self, info: pb.AgentInfo) -> None:  # noqa: B027 (optional: most collectors add nothing)
        """Add what this collector knows about the machine to ``GetInfo`` (GPU list,
        driver/NVML/CUDA versions). Called on every GetInfo: cheap and thread-safe."""

    def close(self) -> None:  # noqa: B027 (optional: most collectors hold nothing)
        """Release handles (NVML, perf fds, mapped segments)."""
