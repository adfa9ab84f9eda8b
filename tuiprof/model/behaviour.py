"""Hand-written behaviour of the generated model classes (``tuiprof.model.messages``).

The generator makes ``<Message>`` derive from ``<Message>Mixin`` when this module
defines one. Mixins hold properties and methods only (``__slots__ = ()``); the
fields they read are declared here for type checking and come from the proto.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agentd.stacks.verdicts import rank_or_pid
from tuiprof.model import convert
from tuiprof.model.values import Reading, Unavailable

if TYPE_CHECKING:
    from agentd.proto import tuiprof_agent_pb2 as pb
    from tuiprof.model.messages import (
        AgentInfo, CollectorStatus, HookHealth, HostSnapshot, InflightOp, ProcessGroupProgress,
    )

SECTION_COLLECTORS = {
    "cpu": "host", "memory": "host", "nics": "host", "disks": "host",
    "gpus": "gpu", "pmu": "pmu", "ranks": "ranks", "hang": "hang",
}
"""Which collector fills each section of a snapshot."""


def busy(idle_percent: Reading) -> Reading:
    """CPU time not idle, in percent."""
    return idle_percent if isinstance(idle_percent, Unavailable) else 100.0 - idle_percent


def ratio_percent(part: Reading, whole: Reading) -> Reading:
    """``part`` as a percentage of ``whole``; unavailable when either is."""
    if isinstance(part, Unavailable):
        return part
    if isinstance(whole, Unavailable):
        return whole
    if whole == 0:
        return Unavailable("total is zero")
    return 100.0 * part / whole


def collector_gap(collectors: Iterable[Any], name: str) -> Unavailable | None:
    """Why collector ``name`` left its section empty (None when it ran).

    Works on the proto's ``CollectorStatus`` list and on the model's.
    """
    state = next((c for c in collectors if c.name == name), None)
    if state is None:
        return Unavailable(f"the agent has no {name} collector")
    if not state.available:
        return Unavailable(state.reason or f"{name} collector unavailable")
    return None


def has_rates(message: pb.HostSnapshot) -> bool:
    """Whether per-second rates are filled in (the agent needs two samples for them)."""
    return message.cpu.HasField("idle_percent")


class CpuCoreStatsMixin:
    __slots__ = ()
    idle_percent: Reading

    @property
    def busy_percent(self) -> Reading:
        return busy(self.idle_percent)


class CpuStatsMixin(CpuCoreStatsMixin):
    __slots__ = ()


class MemoryStatsMixin:
    __slots__ = ()
    used_bytes: Reading
    total_bytes: Reading

    @property
    def used_percent(self) -> Reading:
        return ratio_percent(self.used_bytes, self.total_bytes)


class _Labelled:
    """A process of the job, named by ``agentd.stacks.verdicts.rank_or_pid``."""

    __slots__ = ()
    pid: int
    rank: Reading

    @property
    def rank_number(self) -> int | None:
        """The rank, None when unknown."""
        return None if isinstance(self.rank, Unavailable) else int(self.rank)

    @property
    def label(self) -> str:
        """``rank 3`` when the rank is known, else ``pid 1234``."""
        return rank_or_pid(self.rank_number, self.pid)


class RankVerdictMixin(_Labelled):
    __slots__ = ()


class TraceTargetMixin(_Labelled):
    __slots__ = ()


class RankStatsMixin(_Labelled):
    __slots__ = ()
    inflight: tuple[InflightOp, ...]
    hook: HookHealth
    process_groups: tuple[ProcessGroupProgress, ...]

    @property
    def oldest_inflight(self) -> InflightOp | None:
        return max(self.inflight, key=lambda op: op.age_seconds, default=None)


class HostSnapshotMixin:
    __slots__ = ()
    collectors: tuple[CollectorStatus, ...]

    @classmethod
    def from_proto(cls, msg: pb.HostSnapshot) -> HostSnapshot:
        """The model of ``msg``; a section whose collector could not run carries that collector's reason."""
        down = {c.name: c.reason or f"{c.name} collector unavailable" for c in msg.collectors if not c.available}
        section_reasons = {
            section: down[collector]
            for section, collector in SECTION_COLLECTORS.items()
            if collector in down
        }
        return convert.from_proto(cls, msg, section_reasons=section_reasons)  # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        return convert.to_json(self)

    def missing(self, collector: str) -> Unavailable | None:
        """Why a collector's section is empty, or None when it ran."""
        return collector_gap(self.collectors, collector)


class AgentInfoMixin:
    __slots__ = ()

    @classmethod
    def from_proto(cls, msg: pb.AgentInfo) -> AgentInfo:
        return convert.from_proto(cls, msg)  # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        return convert.to_json(self)
