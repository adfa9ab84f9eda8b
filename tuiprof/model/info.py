"""Immutable agent info (``pb.AgentInfo``): versions, GPUs, collectors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.model import convert
from tuiprof.model.snapshot import CollectorState


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int
    architecture: str
    gpm_supported: bool


@dataclass(frozen=True, slots=True)
class AgentInfo:
    hostname: str
    agent_version: str
    python_version: str
    kernel_release: str
    cpu_count: int
    memory_total_bytes: int
    boot_time_unix_ns: int
    interval_seconds: float
    driver_version: str
    nvml_version: str
    cuda_driver_version: str
    gpus: tuple[GpuInfo, ...]
    collectors: tuple[CollectorState, ...]
    trace_dir: str
    NESTED: ClassVar[dict[str, type]] = {"gpus": GpuInfo, "collectors": CollectorState}

    @classmethod
    def from_proto(cls, msg: pb.AgentInfo) -> "AgentInfo":
        return convert.from_proto(cls, msg)

    def to_json(self) -> dict[str, Any]:
        return convert.to_json(self)
