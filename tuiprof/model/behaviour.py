"""Hand-written behaviour of the generated model classes (``tuiprof.model.messages``).

The generator makes ``<Message>`` derive from ``<Message>Mixin`` when this module
defines one. Mixins hold properties and methods only (``__slots__ = ()``); the
fields they read are declared here for type checking and come from the proto.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agentd.containers import short_id
from agentd.stacks.verdicts import rank_or_pid
from tuiprof.model import convert
from tuiprof.model.values import Reading, Unavailable

if TYPE_CHECKING:
    from agentd.proto import tuiprof_agent_pb2 as pb
    from tuiprof.model.messages import (
        AgentInfo, CollectorStatus, Container, HookHealth, HostSnapshot, InflightOp, ProcessGroupProgress,
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


class ContainerMixin:
    __slots__ = ()
    runtime: str
    id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    slurm_job_id: str
    slurm_step: str
    own_mount_namespace: bool

    @property
    def label(self) -> str:
        """``pod team-a/trainer-2``, ``docker 0123456789ab``, ``job 42.0``, or those joined with
        `` · `` (a container in a job); ``container`` for a mount namespace of its own that no
        runtime named; "" for none of them."""
        parts = []
        if self.pod_uid:
            parts.append("pod " + ("/".join(name for name in (self.pod_namespace, self.pod_name) if name)
                                   or self.pod_uid[:8]))
        elif self.id:
            parts.append(f"{self.runtime} {short_id(self.id)}")
        elif self.own_mount_namespace:
            parts.append("container")
        if self.slurm_job_id:
            parts.append(f"job {self.slurm_job_id}" + (f".{self.slurm_step}" if self.slurm_step else ""))
        return " · ".join(parts)


class _Placed:
    """A process that may run in a container, pod or SLURM job (``agentd.containers``)."""

    __slots__ = ()
    pid_in_container: Reading
    container: Container

    @property
    def where(self) -> str:
        """Where it runs and its pid in there, ``pod team-a/trainer-2, pid 57``; "" on the host itself."""
        parts = [self.container.label] if self.container.label else []
        if not isinstance(self.pid_in_container, Unavailable):
            parts.append(f"pid {int(self.pid_in_container)}")
        return ", ".join(parts)


class GpuProcessMixin(_Placed):
    __slots__ = ()


class RankVerdictMixin(_Labelled):
    __slots__ = ()


class TraceTargetMixin(_Labelled):
    __slots__ = ()


class RankStatsMixin(_Labelled, _Placed):
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
