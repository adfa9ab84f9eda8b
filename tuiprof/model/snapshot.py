"""Immutable host snapshots, built from ``pb.HostSnapshot`` (field names as in the proto).

Every optional proto reading is a ``Reading``: a number, or an ``Unavailable`` with
the agent's reason. Lists are tuples, so snapshots can be shared between the client
task and the UI without copies or locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable
from typing import Any, ClassVar

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.model import convert
from tuiprof.model.values import Reading, Unavailable


@dataclass(frozen=True, slots=True)
class CollectorState:
    name: str
    available: bool
    reason: str
    interval_seconds: float


@dataclass(frozen=True, slots=True)
class CpuCore:
    cpu: int
    user_percent: Reading
    system_percent: Reading
    idle_percent: Reading
    iowait_percent: Reading

    @property
    def busy_percent(self) -> Reading:
        return busy(self.idle_percent)


@dataclass(frozen=True, slots=True)
class Cpu:
    user_percent: Reading
    system_percent: Reading
    idle_percent: Reading
    iowait_percent: Reading
    load1: Reading
    load5: Reading
    load15: Reading
    process_count: Reading
    cores: tuple[CpuCore, ...]
    NESTED: ClassVar[dict[str, type]] = {"cores": CpuCore}

    @property
    def busy_percent(self) -> Reading:
        return busy(self.idle_percent)


def busy(idle_percent: Reading) -> Reading:
    """CPU time not idle, in percent."""
    return idle_percent if isinstance(idle_percent, Unavailable) else 100.0 - idle_percent


@dataclass(frozen=True, slots=True)
class Memory:
    total_bytes: Reading
    used_bytes: Reading
    available_bytes: Reading
    swap_total_bytes: Reading
    swap_used_bytes: Reading

    @property
    def used_percent(self) -> Reading:
        return ratio_percent(self.used_bytes, self.total_bytes)


def ratio_percent(part: Reading, whole: Reading) -> Reading:
    """``part`` as a percentage of ``whole``; unavailable when either is."""
    if isinstance(part, Unavailable):
        return part
    if isinstance(whole, Unavailable):
        return whole
    if whole == 0:
        return Unavailable("total is zero")
    return 100.0 * part / whole


@dataclass(frozen=True, slots=True)
class Nic:
    name: str
    rx_bytes_per_s: Reading
    tx_bytes_per_s: Reading
    rx_bytes_total: Reading
    tx_bytes_total: Reading
    rx_errors_total: Reading
    tx_errors_total: Reading
    rx_drops_total: Reading
    tx_drops_total: Reading


@dataclass(frozen=True, slots=True)
class Disk:
    name: str
    read_bytes_per_s: Reading
    write_bytes_per_s: Reading
    read_iops: Reading
    write_iops: Reading
    read_bytes_total: Reading
    write_bytes_total: Reading
    busy_seconds_total: Reading
    busy_percent: Reading
    reads_total: Reading
    writes_total: Reading


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    name: str
    used_memory_bytes: Reading


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    utilization_percent: Reading
    memory_utilization_percent: Reading
    memory_used_bytes: Reading
    memory_total_bytes: Reading
    power_watts: Reading
    power_limit_watts: Reading
    temperature_celsius: Reading
    sm_clock_hz: Reading
    memory_clock_hz: Reading
    clock_event_reasons_mask: Reading
    clock_event_reasons: tuple[str, ...]
    ecc_corrected_total: Reading
    ecc_uncorrected_total: Reading
    nvlink_rx_bytes_per_s: Reading
    nvlink_tx_bytes_per_s: Reading
    nvlink_rx_bytes_total: Reading
    nvlink_tx_bytes_total: Reading
    pcie_rx_bytes_per_s: Reading
    pcie_tx_bytes_per_s: Reading
    sm_active_percent: Reading
    sm_occupancy_percent: Reading
    tensor_active_percent: Reading
    dram_active_percent: Reading
    fp16_active_percent: Reading
    fp32_active_percent: Reading
    fp64_active_percent: Reading
    gpm_window_seconds: Reading
    processes: tuple[GpuProcess, ...]
    graphics_active_percent: Reading
    gpm_nvlink_rx_bytes_per_s: Reading
    gpm_nvlink_tx_bytes_per_s: Reading
    NESTED: ClassVar[dict[str, type]] = {"processes": GpuProcess}


@dataclass(frozen=True, slots=True)
class Pmu:
    scope: str
    hardware_available: bool
    hardware_reason: str
    mips: Reading
    mega_cycles_per_s: Reading
    ipc: Reading
    cache_misses_per_s: Reading
    cache_miss_percent: Reading
    branch_misses_per_s: Reading
    task_clock_cpus: Reading
    context_switches_per_s: Reading
    page_faults_per_s: Reading
    cpu_migrations_per_s: Reading


@dataclass(frozen=True, slots=True)
class Latency:
    avg_seconds: Reading
    min_seconds: Reading
    max_seconds: Reading
    p50_seconds: Reading
    p99_seconds: Reading


@dataclass(frozen=True, slots=True)
class GemmOp:
    op: str
    dtype: str
    shape: str
    count_total: int
    count_per_s: float
    tflops: Reading
    flops_total: float
    latency: Latency
    NESTED: ClassVar[dict[str, type]] = {"latency": Latency}


@dataclass(frozen=True, slots=True)
class NcclOp:
    op: str
    dtype: str
    algorithm: str
    protocol: str
    comm_hash: str
    comm_size: int
    count_total: int
    count_per_s: float
    bytes_total: int
    algbw_bytes_per_s: Reading
    busbw_bytes_per_s: Reading
    latency: Latency
    NESTED: ClassVar[dict[str, type]] = {"latency": Latency}


@dataclass(frozen=True, slots=True)
class Inflight:
    kind: str
    op: str
    comm_hash: str
    sequence: int
    age_seconds: float
    stream: int


@dataclass(frozen=True, slots=True)
class Rank:
    pid: int
    rank: Reading
    local_rank: Reading
    world_size: Reading
    job_id: str
    state: str
    exit_code: Reading
    exit_signal: Reading
    heartbeat_age_seconds: float
    step_count: int
    step_time_seconds: Reading
    gemm_tflops: Reading
    gemm: tuple[GemmOp, ...]
    nccl: tuple[NcclOp, ...]
    inflight: tuple[Inflight, ...]
    gc_pause_seconds_per_s: Reading
    dataloader_wait_seconds_per_s: Reading
    pmu: Pmu
    exception: str
    NESTED: ClassVar[dict[str, type]] = {
        "gemm": GemmOp, "nccl": NcclOp, "inflight": Inflight, "pmu": Pmu,
    }

    @property
    def label(self) -> str:
        """``rank 3`` when the rank is known, else ``pid 1234``."""
        return f"pid {self.pid}" if isinstance(self.rank, Unavailable) else f"rank {self.rank}"

    @property
    def oldest_inflight(self) -> Inflight | None:
        return max(self.inflight, key=lambda op: op.age_seconds, default=None)


@dataclass(frozen=True, slots=True)
class RankVerdict:
    pid: int
    rank: Reading
    level: str
    explanation: str


@dataclass(frozen=True, slots=True)
class Hang:
    level: str
    since_unix_ns: int
    explanation: str
    ranks: tuple[RankVerdict, ...]
    NESTED: ClassVar[dict[str, type]] = {"ranks": RankVerdict}


SECTION_COLLECTORS = {
    "cpu": "host", "memory": "host", "nics": "host", "disks": "host",
    "gpus": "gpu", "pmu": "pmu", "ranks": "ranks", "hang": "hang",
}
"""Which collector fills each section of a snapshot."""


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    hostname: str
    timestamp_unix_ns: int
    sequence: int
    collectors: tuple[CollectorState, ...]
    cpu: Cpu
    memory: Memory
    nics: tuple[Nic, ...]
    disks: tuple[Disk, ...]
    gpus: tuple[Gpu, ...]
    pmu: Pmu
    ranks: tuple[Rank, ...]
    hang: Hang
    NESTED: ClassVar[dict[str, type]] = {
        "collectors": CollectorState, "cpu": Cpu, "memory": Memory, "nics": Nic,
        "disks": Disk, "gpus": Gpu, "pmu": Pmu, "ranks": Rank, "hang": Hang,
    }

    @classmethod
    def from_proto(cls, msg: pb.HostSnapshot) -> "HostSnapshot":
        down = {c.name: c.reason or f"{c.name} collector unavailable" for c in msg.collectors if not c.available}
        section_reasons = {
            section: down[collector]
            for section, collector in SECTION_COLLECTORS.items()
            if collector in down
        }
        return convert.from_proto(cls, msg, section_reasons=section_reasons)

    def to_json(self) -> dict[str, Any]:
        return convert.to_json(self)

    def missing(self, collector: str) -> Unavailable | None:
        """Why a collector's section is empty, or None when it ran."""
        return collector_gap(self.collectors, collector)


def collector_gap(collectors: Iterable[Any], name: str) -> Unavailable | None:
    """Why collector ``name`` left its section empty (None when it ran).

    Works on the proto's ``CollectorStatus`` list and on ``CollectorState`` tuples.
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
