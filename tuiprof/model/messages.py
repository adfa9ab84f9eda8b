"""The proto's messages as the console's frozen dataclasses. GENERATED: do not edit.

Made by ``python -m tuiprof.model.generate`` from agentd/proto/tuiprof_agent.proto
(see that module for the rules); behaviour comes from ``tuiprof.model.behaviour``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from tuiprof.model import behaviour
from tuiprof.model.convert import NestedOnFirstRead
from tuiprof.model.values import Reading, Unavailable


class RankState(StrEnum):
    """``tuiprof.v1.RankState``, each value as its word."""

    UNSPECIFIED = ""
    RUNNING = "running"
    EXITED = "exited"
    STOPPED = "stopped"
    ZOMBIE = "zombie"
    DISK_SLEEP = "disk-sleep"


class HangLevel(StrEnum):
    """``tuiprof.v1.HangLevel``, each value as its word."""

    UNSPECIFIED = ""
    OK = "ok"
    SUSPECT = "suspect"
    HUNG = "hung"
    EXITED = "exited"


class SlowdownCause(StrEnum):
    """``tuiprof.v1.SlowdownCause``, each value as its word."""

    UNSPECIFIED = ""
    GPU_SLOWER = "gpu_slower"
    GPU_CONTENTION = "gpu_contention"
    INPUT_PIPELINE = "input_pipeline"
    CPU_STARVED = "cpu_starved"
    GC_PAUSES = "gc_pauses"
    SLOW_COMMUNICATION = "slow_communication"
    STOPPED = "stopped"
    UNKNOWN = "unknown"


class TraceTargetState(StrEnum):
    """``tuiprof.v1.TraceTargetState``, each value as its word."""

    UNSPECIFIED = ""
    WAITING = "waiting"
    SENT = "sent"
    WRITTEN = "written"
    BUSY = "busy"
    REFUSED = "refused"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """``tuiprof.v1.CollectorStatus``."""

    name: str
    available: bool
    reason: str
    interval_seconds: float


@dataclass(frozen=True, slots=True)
class CpuCoreStats(behaviour.CpuCoreStatsMixin):
    """``tuiprof.v1.CpuCoreStats``."""

    cpu: int
    user_percent: Reading
    system_percent: Reading
    idle_percent: Reading
    iowait_percent: Reading


@dataclass(frozen=True, slots=True)
class CpuModeSeconds:
    """``tuiprof.v1.CpuModeSeconds``."""

    user: float
    nice: float
    system: float
    idle: float
    iowait: float
    irq: float
    softirq: float
    steal: float
    guest: float
    guest_nice: float


@dataclass(frozen=True, slots=True)
class NumaNodeStats(NestedOnFirstRead):
    """``tuiprof.v1.NumaNodeStats``."""

    node: int
    cpus: tuple[int, ...]
    user_percent: Reading
    system_percent: Reading
    idle_percent: Reading
    seconds_total: CpuModeSeconds
    NESTED: ClassVar[dict[str, type]] = {"seconds_total": CpuModeSeconds}


@dataclass(frozen=True, slots=True)
class CpuStats(behaviour.CpuStatsMixin, NestedOnFirstRead):
    """``tuiprof.v1.CpuStats``."""

    user_percent: Reading
    system_percent: Reading
    idle_percent: Reading
    iowait_percent: Reading
    load1: Reading
    load5: Reading
    load15: Reading
    process_count: Reading
    cores: tuple[CpuCoreStats, ...]
    nice_percent: Reading
    irq_percent: Reading
    softirq_percent: Reading
    steal_percent: Reading
    guest_percent: Reading
    guest_nice_percent: Reading
    uptime_seconds: Reading
    seconds_total: CpuModeSeconds
    interrupts_total: Reading
    softirqs_total: Reading
    numa_nodes: tuple[NumaNodeStats, ...]
    NESTED: ClassVar[dict[str, type]] = {"cores": CpuCoreStats, "seconds_total": CpuModeSeconds, "numa_nodes": NumaNodeStats}


@dataclass(frozen=True, slots=True)
class MemoryStats(behaviour.MemoryStatsMixin):
    """``tuiprof.v1.MemoryStats``."""

    total_bytes: Reading
    used_bytes: Reading
    available_bytes: Reading
    swap_total_bytes: Reading
    swap_used_bytes: Reading


@dataclass(frozen=True, slots=True)
class NamedCounter:
    """``tuiprof.v1.NamedCounter``."""

    name: str
    value: Reading


@dataclass(frozen=True, slots=True)
class NicStats(NestedOnFirstRead):
    """``tuiprof.v1.NicStats``."""

    name: str
    rx_bytes_per_s: Reading
    tx_bytes_per_s: Reading
    rx_bytes_total: Reading
    tx_bytes_total: Reading
    rx_errors_total: Reading
    tx_errors_total: Reading
    rx_drops_total: Reading
    tx_drops_total: Reading
    rx_packets_total: Reading
    tx_packets_total: Reading
    ethtool_stats: tuple[NamedCounter, ...]
    NESTED: ClassVar[dict[str, type]] = {"ethtool_stats": NamedCounter}


@dataclass(frozen=True, slots=True)
class DiskStats:
    """``tuiprof.v1.DiskStats``."""

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
class Container(behaviour.ContainerMixin):
    """``tuiprof.v1.Container``."""

    runtime: str
    id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    slurm_job_id: str
    slurm_step: str
    own_mount_namespace: bool


@dataclass(frozen=True, slots=True)
class GpuProcess(behaviour.GpuProcessMixin, NestedOnFirstRead):
    """``tuiprof.v1.GpuProcess``."""

    pid: int
    name: str
    used_memory_bytes: Reading
    user: str | Unavailable
    command: str | Unavailable
    sm_percent: Reading
    uid: Reading
    pid_in_container: Reading
    container: Container
    cpu_percent: Reading
    resident_memory_bytes: Reading
    start_time_unix_seconds: Reading
    NESTED: ClassVar[dict[str, type]] = {"container": Container}


@dataclass(frozen=True, slots=True)
class GpuStats(NestedOnFirstRead):
    """``tuiprof.v1.GpuStats``."""

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
    minor_number: Reading
    nvml_failed_queries: Reading
    processes_age_seconds: Reading
    processes_interval_seconds: Reading
    NESTED: ClassVar[dict[str, type]] = {"processes": GpuProcess}


@dataclass(frozen=True, slots=True)
class PmuStats:
    """``tuiprof.v1.PmuStats``."""

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
class LatencyStats:
    """``tuiprof.v1.LatencyStats``."""

    avg_seconds: Reading
    min_seconds: Reading
    max_seconds: Reading
    p50_seconds: Reading
    p99_seconds: Reading
    min_exact: bool
    max_exact: bool


@dataclass(frozen=True, slots=True)
class GemmOpStats(NestedOnFirstRead):
    """``tuiprof.v1.GemmOpStats``."""

    op: str
    dtype: str
    shape: str
    count_total: int
    count_per_s: float
    tflops: Reading
    flops_total: float
    latency: LatencyStats
    first_call_seconds: Reading
    timed_count_total: int
    timed_count_interval: int
    sample_every: int
    NESTED: ClassVar[dict[str, type]] = {"latency": LatencyStats}


@dataclass(frozen=True, slots=True)
class NcclOpStats(NestedOnFirstRead):
    """``tuiprof.v1.NcclOpStats``."""

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
    latency: LatencyStats
    NESTED: ClassVar[dict[str, type]] = {"latency": LatencyStats}


@dataclass(frozen=True, slots=True)
class InflightOp:
    """``tuiprof.v1.InflightOp``."""

    kind: str
    op: str
    comm_hash: str
    sequence: int
    age_seconds: float
    stream: int


@dataclass(frozen=True, slots=True)
class ProcessGroupProgress:
    """``tuiprof.v1.ProcessGroupProgress``."""

    id: str
    last_enqueued: int
    last_completed: int


@dataclass(frozen=True, slots=True)
class HookHealth:
    """``tuiprof.v1.HookHealth``."""

    cuda_timing: bool
    nccl_plugin: bool
    nccl_gpu_timers: bool
    gemm_untimed_total: int
    nccl_untimed_total: int
    dropped_records_total: int
    slot_overflow_total: int
    nccl_channel_shortfall_total: int
    nccl_late_channels_total: int
    pending: int
    inactive_reason: str
    gemm_timed_first_calls: int
    gemm_sample_every: int
    nccl_api_fallback: bool
    nccl_api_events: bool
    gemm_sample_max: int
    stale_inflight_total: int
    nccl_profiler_api: int
    nccl_profiler_chain: str


@dataclass(frozen=True, slots=True)
class CollectiveArrivals:
    """``tuiprof.v1.CollectiveArrivals``."""

    comm: str
    sequence: tuple[int, ...]
    start_unix_ns: tuple[int, ...]
    enqueued: bool


@dataclass(frozen=True, slots=True)
class FunctionTiming:
    """``tuiprof.v1.FunctionTiming``."""

    name: str
    calls_total: int
    seconds_total: float
    max_seconds: float
    calls_per_s: Reading
    seconds_per_s: Reading


@dataclass(frozen=True, slots=True)
class DeviceAllocations:
    """``tuiprof.v1.DeviceAllocations``."""

    malloc_calls_total: int
    malloc_bytes_total: int
    free_calls_total: int
    free_bytes_total: int
    free_unknown_size_total: int


@dataclass(frozen=True, slots=True)
class MemoryCopies:
    """``tuiprof.v1.MemoryCopies``."""

    direction: str
    calls_total: int
    bytes_total: int
    calls_per_s: Reading
    bytes_per_s: Reading
    timed_calls_total: int
    untimed_total: int
    mean_seconds: Reading
    seconds_total: Reading


@dataclass(frozen=True, slots=True)
class DeviceMemoryStats(NestedOnFirstRead):
    """``tuiprof.v1.DeviceMemoryStats``."""

    malloc: DeviceAllocations
    malloc_async: DeviceAllocations
    copies: tuple[MemoryCopies, ...]
    allocated_bytes: Reading
    reserved_bytes: Reading
    peak_allocated_bytes: Reading
    alloc_retries_total: Reading
    ooms_total: Reading
    allocator_age_seconds: Reading
    NESTED: ClassVar[dict[str, type]] = {"malloc": DeviceAllocations, "malloc_async": DeviceAllocations, "copies": MemoryCopies}


@dataclass(frozen=True, slots=True)
class FunctionTimingOutcome:
    """``tuiprof.v1.FunctionTimingOutcome``."""

    serial: int
    acknowledged: bool
    problems: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class RankStats(behaviour.RankStatsMixin, NestedOnFirstRead):
    """``tuiprof.v1.RankStats``."""

    pid: int
    rank: Reading
    local_rank: Reading
    world_size: Reading
    job_id: str
    state: RankState
    exit_code: Reading
    exit_signal: Reading
    heartbeat_age_seconds: float
    step_count: int
    step_time_seconds: Reading
    gemm_tflops: Reading
    gemm: tuple[GemmOpStats, ...]
    nccl: tuple[NcclOpStats, ...]
    inflight: tuple[InflightOp, ...]
    gc_pause_seconds_per_s: Reading
    dataloader_wait_seconds_per_s: Reading
    pmu: PmuStats
    exception: str
    process_groups: tuple[ProcessGroupProgress, ...]
    hook: HookHealth
    uid: Reading
    interval_seconds: Reading
    arrivals: tuple[CollectiveArrivals, ...]
    step_ends_unix_ns: tuple[int, ...]
    run_delay_seconds_per_s: Reading
    cpu_throttled_seconds_per_s: Reading
    pid_in_container: Reading
    container: Container
    functions: tuple[FunctionTiming, ...]
    device_memory: DeviceMemoryStats
    function_request: FunctionTimingOutcome
    functions_waiting: tuple[str, ...]
    NESTED: ClassVar[dict[str, type]] = {"gemm": GemmOpStats, "nccl": NcclOpStats, "inflight": InflightOp, "pmu": PmuStats, "process_groups": ProcessGroupProgress, "hook": HookHealth, "arrivals": CollectiveArrivals, "container": Container, "functions": FunctionTiming, "device_memory": DeviceMemoryStats, "function_request": FunctionTimingOutcome}
    ENUMS: ClassVar[dict[str, type[StrEnum]]] = {"state": RankState}


@dataclass(frozen=True, slots=True)
class RankVerdict(behaviour.RankVerdictMixin):
    """``tuiprof.v1.RankVerdict``."""

    pid: int
    rank: Reading
    level: HangLevel
    explanation: str
    ENUMS: ClassVar[dict[str, type[StrEnum]]] = {"level": HangLevel}


@dataclass(frozen=True, slots=True)
class HangStatus(NestedOnFirstRead):
    """``tuiprof.v1.HangStatus``."""

    level: HangLevel
    since_unix_ns: int
    explanation: str
    ranks: tuple[RankVerdict, ...]
    NESTED: ClassVar[dict[str, type]] = {"ranks": RankVerdict}
    ENUMS: ClassVar[dict[str, type[StrEnum]]] = {"level": HangLevel}


@dataclass(frozen=True, slots=True)
class RankSegmentsRefused:
    """``tuiprof.v1.RankSegmentsRefused``."""

    reason: str
    files: int


@dataclass(frozen=True, slots=True)
class RdmaPortStats(NestedOnFirstRead):
    """``tuiprof.v1.RdmaPortStats``."""

    device: str
    port: int
    netdev: str
    counters: tuple[NamedCounter, ...]
    hw_counters: tuple[NamedCounter, ...]
    NESTED: ClassVar[dict[str, type]] = {"counters": NamedCounter, "hw_counters": NamedCounter}


@dataclass(frozen=True, slots=True)
class RdmaStats(NestedOnFirstRead):
    """``tuiprof.v1.RdmaStats``."""

    ports: tuple[RdmaPortStats, ...]
    unavailable_reason: str
    NESTED: ClassVar[dict[str, type]] = {"ports": RdmaPortStats}


@dataclass(frozen=True, slots=True)
class RankOpsDropped:
    """``tuiprof.v1.RankOpsDropped``."""

    uid: int
    ops: int
    reason: str


@dataclass(frozen=True, slots=True)
class RankCost:
    """``tuiprof.v1.RankCost``."""

    pid: int
    rank: Reading
    host: str
    gpu: Reading
    cost_seconds: float
    cost_percent: float


@dataclass(frozen=True, slots=True)
class JobSlowdown(NestedOnFirstRead):
    """``tuiprof.v1.JobSlowdown``."""

    job_id: str
    slow: bool
    cause: SlowdownCause
    culprits: tuple[RankCost, ...]
    ranks: tuple[RankCost, ...]
    evidence: tuple[str, ...]
    unchecked: tuple[str, ...]
    step_seconds: Reading
    baseline_step_seconds: Reading
    cost_seconds: float
    cost_percent: float
    since_unix_ns: int
    NESTED: ClassVar[dict[str, type]] = {"culprits": RankCost, "ranks": RankCost}
    ENUMS: ClassVar[dict[str, type[StrEnum]]] = {"cause": SlowdownCause}


@dataclass(frozen=True, slots=True)
class NvmlCalls:
    """``tuiprof.v1.NvmlCalls``."""

    function: str
    calls: int


@dataclass(frozen=True, slots=True)
class HostSnapshot(behaviour.HostSnapshotMixin, NestedOnFirstRead):
    """``tuiprof.v1.HostSnapshot``."""

    hostname: str
    timestamp_unix_ns: int
    sequence: int
    collectors: tuple[CollectorStatus, ...]
    cpu: CpuStats
    memory: MemoryStats
    nics: tuple[NicStats, ...]
    disks: tuple[DiskStats, ...]
    gpus: tuple[GpuStats, ...]
    pmu: PmuStats
    ranks: tuple[RankStats, ...]
    hang: HangStatus
    rank_segments_refused: tuple[RankSegmentsRefused, ...]
    rdma: RdmaStats
    rank_ops_dropped: tuple[RankOpsDropped, ...]
    slowdowns: tuple[JobSlowdown, ...]
    nvml_calls: tuple[NvmlCalls, ...]
    NESTED: ClassVar[dict[str, type]] = {"collectors": CollectorStatus, "cpu": CpuStats, "memory": MemoryStats, "nics": NicStats, "disks": DiskStats, "gpus": GpuStats, "pmu": PmuStats, "ranks": RankStats, "hang": HangStatus, "rank_segments_refused": RankSegmentsRefused, "rdma": RdmaStats, "rank_ops_dropped": RankOpsDropped, "slowdowns": JobSlowdown, "nvml_calls": NvmlCalls}


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """``tuiprof.v1.GpuInfo``."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int
    architecture: str
    gpm_supported: bool


@dataclass(frozen=True, slots=True)
class AgentInfo(behaviour.AgentInfoMixin, NestedOnFirstRead):
    """``tuiprof.v1.AgentInfo``."""

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
    collectors: tuple[CollectorStatus, ...]
    trace_dir: str
    kineto_socket_dir: str
    kineto_socket_dir_reason: str
    NESTED: ClassVar[dict[str, type]] = {"gpus": GpuInfo, "collectors": CollectorStatus}


@dataclass(frozen=True, slots=True)
class CollectiveTimings:
    """``tuiprof.v1.CollectiveTimings``."""

    group: str
    op: str
    on_gpu: bool
    seq: tuple[int, ...]
    start_us: tuple[float, ...]
    end_us: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class RankTraceSummary(NestedOnFirstRead):
    """``tuiprof.v1.RankTraceSummary``."""

    result_json: str
    base_time_ns: int
    collectives: tuple[CollectiveTimings, ...]
    error: str
    seconds: float
    NESTED: ClassVar[dict[str, type]] = {"collectives": CollectiveTimings}


@dataclass(frozen=True, slots=True)
class TraceTarget(behaviour.TraceTargetMixin, NestedOnFirstRead):
    """``tuiprof.v1.TraceTarget``."""

    host: str
    pid: int
    rank: Reading
    state: TraceTargetState
    file: str
    reason: str
    summary: RankTraceSummary
    NESTED: ClassVar[dict[str, type]] = {"summary": RankTraceSummary}
    ENUMS: ClassVar[dict[str, type[StrEnum]]] = {"state": TraceTargetState}
