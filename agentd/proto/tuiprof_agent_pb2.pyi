from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RANK_STATE_UNSPECIFIED: _ClassVar[RankState]
    RANK_STATE_RUNNING: _ClassVar[RankState]
    RANK_STATE_EXITED: _ClassVar[RankState]
    RANK_STATE_STOPPED: _ClassVar[RankState]
    RANK_STATE_ZOMBIE: _ClassVar[RankState]
    RANK_STATE_DISK_SLEEP: _ClassVar[RankState]

class HangLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HANG_LEVEL_UNSPECIFIED: _ClassVar[HangLevel]
    HANG_LEVEL_OK: _ClassVar[HangLevel]
    HANG_LEVEL_SUSPECT: _ClassVar[HangLevel]
    HANG_LEVEL_HUNG: _ClassVar[HangLevel]
    HANG_LEVEL_EXITED: _ClassVar[HangLevel]

class SlowdownCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SLOWDOWN_CAUSE_UNSPECIFIED: _ClassVar[SlowdownCause]
    SLOWDOWN_CAUSE_GPU_SLOWER: _ClassVar[SlowdownCause]
    SLOWDOWN_CAUSE_GPU_CONTENTION: _ClassVar[SlowdownCause]
    SLOWDOWN_CAUSE_INPUT_PIPELINE: _ClassVar[SlowdownCause]
    SLOWDOWN_CAUSE_CPU_STARVED: _ClassVar[SlowdownCause]
    SLOWDOWN_CAUSE_GC_PAUSES: _ClassVar[SlowdownCause]
    SLOWDOWN_CAUSE_SLOW_COMMUNICATION: _ClassVar[SlowdownCause]
    SLOWDOWN_CAUSE_STOPPED: _ClassVar[SlowdownCause]
    SLOWDOWN_CAUSE_UNKNOWN: _ClassVar[SlowdownCause]

class TraceTargetState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRACE_TARGET_STATE_UNSPECIFIED: _ClassVar[TraceTargetState]
    TRACE_TARGET_STATE_WAITING: _ClassVar[TraceTargetState]
    TRACE_TARGET_STATE_SENT: _ClassVar[TraceTargetState]
    TRACE_TARGET_STATE_WRITTEN: _ClassVar[TraceTargetState]
    TRACE_TARGET_STATE_BUSY: _ClassVar[TraceTargetState]
    TRACE_TARGET_STATE_REFUSED: _ClassVar[TraceTargetState]
    TRACE_TARGET_STATE_FAILED: _ClassVar[TraceTargetState]
RANK_STATE_UNSPECIFIED: RankState
RANK_STATE_RUNNING: RankState
RANK_STATE_EXITED: RankState
RANK_STATE_STOPPED: RankState
RANK_STATE_ZOMBIE: RankState
RANK_STATE_DISK_SLEEP: RankState
HANG_LEVEL_UNSPECIFIED: HangLevel
HANG_LEVEL_OK: HangLevel
HANG_LEVEL_SUSPECT: HangLevel
HANG_LEVEL_HUNG: HangLevel
HANG_LEVEL_EXITED: HangLevel
SLOWDOWN_CAUSE_UNSPECIFIED: SlowdownCause
SLOWDOWN_CAUSE_GPU_SLOWER: SlowdownCause
SLOWDOWN_CAUSE_GPU_CONTENTION: SlowdownCause
SLOWDOWN_CAUSE_INPUT_PIPELINE: SlowdownCause
SLOWDOWN_CAUSE_CPU_STARVED: SlowdownCause
SLOWDOWN_CAUSE_GC_PAUSES: SlowdownCause
SLOWDOWN_CAUSE_SLOW_COMMUNICATION: SlowdownCause
SLOWDOWN_CAUSE_STOPPED: SlowdownCause
SLOWDOWN_CAUSE_UNKNOWN: SlowdownCause
TRACE_TARGET_STATE_UNSPECIFIED: TraceTargetState
TRACE_TARGET_STATE_WAITING: TraceTargetState
TRACE_TARGET_STATE_SENT: TraceTargetState
TRACE_TARGET_STATE_WRITTEN: TraceTargetState
TRACE_TARGET_STATE_BUSY: TraceTargetState
TRACE_TARGET_STATE_REFUSED: TraceTargetState
TRACE_TARGET_STATE_FAILED: TraceTargetState
WORD_FIELD_NUMBER: _ClassVar[int]
word: _descriptor.FieldDescriptor

class GetInfoRequest(_message.Message):
    __slots__ = ("kineto_socket_dir",)
    KINETO_SOCKET_DIR_FIELD_NUMBER: _ClassVar[int]
    kineto_socket_dir: bool
    def __init__(self, kineto_socket_dir: _Optional[bool] = ...) -> None: ...

class CollectorStatus(_message.Message):
    __slots__ = ("name", "available", "reason", "interval_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    available: bool
    reason: str
    interval_seconds: float
    def __init__(self, name: _Optional[str] = ..., available: _Optional[bool] = ..., reason: _Optional[str] = ..., interval_seconds: _Optional[float] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "name", "uuid", "pci_bus_id", "memory_total_bytes", "architecture", "gpm_supported")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    GPM_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int
    architecture: str
    gpm_supported: bool
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., uuid: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., architecture: _Optional[str] = ..., gpm_supported: _Optional[bool] = ...) -> None: ...

class AgentInfo(_message.Message):
    __slots__ = ("hostname", "agent_version", "python_version", "kernel_release", "cpu_count", "memory_total_bytes", "boot_time_unix_ns", "interval_seconds", "driver_version", "nvml_version", "cuda_driver_version", "gpus", "collectors", "trace_dir", "kineto_socket_dir", "kineto_socket_dir_reason")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PYTHON_VERSION_FIELD_NUMBER: _ClassVar[int]
    KERNEL_RELEASE_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    BOOT_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    NVML_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    COLLECTORS_FIELD_NUMBER: _ClassVar[int]
    TRACE_DIR_FIELD_NUMBER: _ClassVar[int]
    KINETO_SOCKET_DIR_FIELD_NUMBER: _ClassVar[int]
    KINETO_SOCKET_DIR_REASON_FIELD_NUMBER: _ClassVar[int]
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
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    collectors: _containers.RepeatedCompositeFieldContainer[CollectorStatus]
    trace_dir: str
    kineto_socket_dir: str
    kineto_socket_dir_reason: str
    def __init__(self, hostname: _Optional[str] = ..., agent_version: _Optional[str] = ..., python_version: _Optional[str] = ..., kernel_release: _Optional[str] = ..., cpu_count: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., boot_time_unix_ns: _Optional[int] = ..., interval_seconds: _Optional[float] = ..., driver_version: _Optional[str] = ..., nvml_version: _Optional[str] = ..., cuda_driver_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., collectors: _Optional[_Iterable[_Union[CollectorStatus, _Mapping]]] = ..., trace_dir: _Optional[str] = ..., kineto_socket_dir: _Optional[str] = ..., kineto_socket_dir_reason: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("interval_ms",)
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    def __init__(self, interval_ms: _Optional[int] = ...) -> None: ...

class HostSnapshot(_message.Message):
    __slots__ = ("hostname", "timestamp_unix_ns", "sequence", "collectors", "cpu", "memory", "nics", "disks", "gpus", "pmu", "ranks", "hang", "rank_segments_refused", "rdma", "rank_ops_dropped", "slowdowns", "nvml_calls")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    COLLECTORS_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    PMU_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    HANG_FIELD_NUMBER: _ClassVar[int]
    RANK_SEGMENTS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    RDMA_FIELD_NUMBER: _ClassVar[int]
    RANK_OPS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    SLOWDOWNS_FIELD_NUMBER: _ClassVar[int]
    NVML_CALLS_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    timestamp_unix_ns: int
    sequence: int
    collectors: _containers.RepeatedCompositeFieldContainer[CollectorStatus]
    cpu: CpuStats
    memory: MemoryStats
    nics: _containers.RepeatedCompositeFieldContainer[NicStats]
    disks: _containers.RepeatedCompositeFieldContainer[DiskStats]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuStats]
    pmu: PmuStats
    ranks: _containers.RepeatedCompositeFieldContainer[RankStats]
    hang: HangStatus
    rank_segments_refused: _containers.RepeatedCompositeFieldContainer[RankSegmentsRefused]
    rdma: RdmaStats
    rank_ops_dropped: _containers.RepeatedCompositeFieldContainer[RankOpsDropped]
    slowdowns: _containers.RepeatedCompositeFieldContainer[JobSlowdown]
    nvml_calls: _containers.RepeatedCompositeFieldContainer[NvmlCalls]
    def __init__(self, hostname: _Optional[str] = ..., timestamp_unix_ns: _Optional[int] = ..., sequence: _Optional[int] = ..., collectors: _Optional[_Iterable[_Union[CollectorStatus, _Mapping]]] = ..., cpu: _Optional[_Union[CpuStats, _Mapping]] = ..., memory: _Optional[_Union[MemoryStats, _Mapping]] = ..., nics: _Optional[_Iterable[_Union[NicStats, _Mapping]]] = ..., disks: _Optional[_Iterable[_Union[DiskStats, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[GpuStats, _Mapping]]] = ..., pmu: _Optional[_Union[PmuStats, _Mapping]] = ..., ranks: _Optional[_Iterable[_Union[RankStats, _Mapping]]] = ..., hang: _Optional[_Union[HangStatus, _Mapping]] = ..., rank_segments_refused: _Optional[_Iterable[_Union[RankSegmentsRefused, _Mapping]]] = ..., rdma: _Optional[_Union[RdmaStats, _Mapping]] = ..., rank_ops_dropped: _Optional[_Iterable[_Union[RankOpsDropped, _Mapping]]] = ..., slowdowns: _Optional[_Iterable[_Union[JobSlowdown, _Mapping]]] = ..., nvml_calls: _Optional[_Iterable[_Union[NvmlCalls, _Mapping]]] = ...) -> None: ...

class NvmlCalls(_message.Message):
    __slots__ = ("function", "calls")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    function: str
    calls: int
    def __init__(self, function: _Optional[str] = ..., calls: _Optional[int] = ...) -> None: ...

class RankSegmentsRefused(_message.Message):
    __slots__ = ("reason", "files")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    reason: str
    files: int
    def __init__(self, reason: _Optional[str] = ..., files: _Optional[int] = ...) -> None: ...

class RankOpsDropped(_message.Message):
    __slots__ = ("uid", "ops", "reason")
    UID_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    uid: int
    ops: int
    reason: str
    def __init__(self, uid: _Optional[int] = ..., ops: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class CpuCoreStats(_message.Message):
    __slots__ = ("cpu", "user_percent", "system_percent", "idle_percent", "iowait_percent", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CPU_FIELD_NUMBER: _ClassVar[int]
    USER_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PERCENT_FIELD_NUMBER: _ClassVar[int]
    IDLE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    IOWAIT_PERCENT_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    cpu: int
    user_percent: float
    system_percent: float
    idle_percent: float
    iowait_percent: float
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, cpu: _Optional[int] = ..., user_percent: _Optional[float] = ..., system_percent: _Optional[float] = ..., idle_percent: _Optional[float] = ..., iowait_percent: _Optional[float] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CpuStats(_message.Message):
    __slots__ = ("user_percent", "system_percent", "idle_percent", "iowait_percent", "load1", "load5", "load15", "process_count", "cores", "nice_percent", "irq_percent", "softirq_percent", "steal_percent", "guest_percent", "guest_nice_percent", "uptime_seconds", "seconds_total", "interrupts_total", "softirqs_total", "numa_nodes", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    USER_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PERCENT_FIELD_NUMBER: _ClassVar[int]
    IDLE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    IOWAIT_PERCENT_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    LOAD5_FIELD_NUMBER: _ClassVar[int]
    LOAD15_FIELD_NUMBER: _ClassVar[int]
    PROCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    NICE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    IRQ_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SOFTIRQ_PERCENT_FIELD_NUMBER: _ClassVar[int]
    STEAL_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GUEST_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GUEST_NICE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SOFTIRQS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODES_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    user_percent: float
    system_percent: float
    idle_percent: float
    iowait_percent: float
    load1: float
    load5: float
    load15: float
    process_count: int
    cores: _containers.RepeatedCompositeFieldContainer[CpuCoreStats]
    nice_percent: float
    irq_percent: float
    softirq_percent: float
    steal_percent: float
    guest_percent: float
    guest_nice_percent: float
    uptime_seconds: float
    seconds_total: CpuModeSeconds
    interrupts_total: int
    softirqs_total: int
    numa_nodes: _containers.RepeatedCompositeFieldContainer[NumaNodeStats]
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, user_percent: _Optional[float] = ..., system_percent: _Optional[float] = ..., idle_percent: _Optional[float] = ..., iowait_percent: _Optional[float] = ..., load1: _Optional[float] = ..., load5: _Optional[float] = ..., load15: _Optional[float] = ..., process_count: _Optional[int] = ..., cores: _Optional[_Iterable[_Union[CpuCoreStats, _Mapping]]] = ..., nice_percent: _Optional[float] = ..., irq_percent: _Optional[float] = ..., softirq_percent: _Optional[float] = ..., steal_percent: _Optional[float] = ..., guest_percent: _Optional[float] = ..., guest_nice_percent: _Optional[float] = ..., uptime_seconds: _Optional[float] = ..., seconds_total: _Optional[_Union[CpuModeSeconds, _Mapping]] = ..., interrupts_total: _Optional[int] = ..., softirqs_total: _Optional[int] = ..., numa_nodes: _Optional[_Iterable[_Union[NumaNodeStats, _Mapping]]] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NumaNodeStats(_message.Message):
    __slots__ = ("node", "cpus", "user_percent", "system_percent", "idle_percent", "seconds_total", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    USER_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PERCENT_FIELD_NUMBER: _ClassVar[int]
    IDLE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    node: int
    cpus: _containers.RepeatedScalarFieldContainer[int]
    user_percent: float
    system_percent: float
    idle_percent: float
    seconds_total: CpuModeSeconds
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, node: _Optional[int] = ..., cpus: _Optional[_Iterable[int]] = ..., user_percent: _Optional[float] = ..., system_percent: _Optional[float] = ..., idle_percent: _Optional[float] = ..., seconds_total: _Optional[_Union[CpuModeSeconds, _Mapping]] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RdmaStats(_message.Message):
    __slots__ = ("ports", "unavailable_reason")
    PORTS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    ports: _containers.RepeatedCompositeFieldContainer[RdmaPortStats]
    unavailable_reason: str
    def __init__(self, ports: _Optional[_Iterable[_Union[RdmaPortStats, _Mapping]]] = ..., unavailable_reason: _Optional[str] = ...) -> None: ...

class RdmaPortStats(_message.Message):
    __slots__ = ("device", "port", "netdev", "counters", "hw_counters")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    HW_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    device: str
    port: int
    netdev: str
    counters: _containers.RepeatedCompositeFieldContainer[NamedCounter]
    hw_counters: _containers.RepeatedCompositeFieldContainer[NamedCounter]
    def __init__(self, device: _Optional[str] = ..., port: _Optional[int] = ..., netdev: _Optional[str] = ..., counters: _Optional[_Iterable[_Union[NamedCounter, _Mapping]]] = ..., hw_counters: _Optional[_Iterable[_Union[NamedCounter, _Mapping]]] = ...) -> None: ...

class NamedCounter(_message.Message):
    __slots__ = ("name", "value", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: int
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., value: _Optional[int] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CpuModeSeconds(_message.Message):
    __slots__ = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
    USER_FIELD_NUMBER: _ClassVar[int]
    NICE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    IOWAIT_FIELD_NUMBER: _ClassVar[int]
    IRQ_FIELD_NUMBER: _ClassVar[int]
    SOFTIRQ_FIELD_NUMBER: _ClassVar[int]
    STEAL_FIELD_NUMBER: _ClassVar[int]
    GUEST_FIELD_NUMBER: _ClassVar[int]
    GUEST_NICE_FIELD_NUMBER: _ClassVar[int]
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
    def __init__(self, user: _Optional[float] = ..., nice: _Optional[float] = ..., system: _Optional[float] = ..., idle: _Optional[float] = ..., iowait: _Optional[float] = ..., irq: _Optional[float] = ..., softirq: _Optional[float] = ..., steal: _Optional[float] = ..., guest: _Optional[float] = ..., guest_nice: _Optional[float] = ...) -> None: ...

class MemoryStats(_message.Message):
    __slots__ = ("total_bytes", "used_bytes", "available_bytes", "swap_total_bytes", "swap_used_bytes", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SWAP_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SWAP_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    total_bytes: int
    used_bytes: int
    available_bytes: int
    swap_total_bytes: int
    swap_used_bytes: int
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, total_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., available_bytes: _Optional[int] = ..., swap_total_bytes: _Optional[int] = ..., swap_used_bytes: _Optional[int] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NicStats(_message.Message):
    __slots__ = ("name", "rx_bytes_per_s", "tx_bytes_per_s", "rx_bytes_total", "tx_bytes_total", "rx_errors_total", "tx_errors_total", "rx_drops_total", "tx_drops_total", "rx_packets_total", "tx_packets_total", "ethtool_stats", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RX_ERRORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TX_ERRORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RX_DROPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TX_DROPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RX_PACKETS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TX_PACKETS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ETHTOOL_STATS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    rx_bytes_per_s: float
    tx_bytes_per_s: float
    rx_bytes_total: int
    tx_bytes_total: int
    rx_errors_total: int
    tx_errors_total: int
    rx_drops_total: int
    tx_drops_total: int
    rx_packets_total: int
    tx_packets_total: int
    ethtool_stats: _containers.RepeatedCompositeFieldContainer[NamedCounter]
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., rx_bytes_per_s: _Optional[float] = ..., tx_bytes_per_s: _Optional[float] = ..., rx_bytes_total: _Optional[int] = ..., tx_bytes_total: _Optional[int] = ..., rx_errors_total: _Optional[int] = ..., tx_errors_total: _Optional[int] = ..., rx_drops_total: _Optional[int] = ..., tx_drops_total: _Optional[int] = ..., rx_packets_total: _Optional[int] = ..., tx_packets_total: _Optional[int] = ..., ethtool_stats: _Optional[_Iterable[_Union[NamedCounter, _Mapping]]] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DiskStats(_message.Message):
    __slots__ = ("name", "read_bytes_per_s", "write_bytes_per_s", "read_iops", "write_iops", "read_bytes_total", "write_bytes_total", "busy_seconds_total", "busy_percent", "reads_total", "writes_total", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    READ_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    WRITE_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    READ_IOPS_FIELD_NUMBER: _ClassVar[int]
    WRITE_IOPS_FIELD_NUMBER: _ClassVar[int]
    READ_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WRITE_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BUSY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    READS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WRITES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    read_bytes_per_s: float
    write_bytes_per_s: float
    read_iops: float
    write_iops: float
    read_bytes_total: int
    write_bytes_total: int
    busy_seconds_total: float
    busy_percent: float
    reads_total: int
    writes_total: int
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., read_bytes_per_s: _Optional[float] = ..., write_bytes_per_s: _Optional[float] = ..., read_iops: _Optional[float] = ..., write_iops: _Optional[float] = ..., read_bytes_total: _Optional[int] = ..., write_bytes_total: _Optional[int] = ..., busy_seconds_total: _Optional[float] = ..., busy_percent: _Optional[float] = ..., reads_total: _Optional[int] = ..., writes_total: _Optional[int] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GpuProcess(_message.Message):
    __slots__ = ("pid", "name", "used_memory_bytes", "user", "command", "sm_percent", "uid", "pid_in_container", "container", "cpu_percent", "resident_memory_bytes", "start_time_unix_seconds")
    PID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    SM_PERCENT_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    PID_IN_CONTAINER_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    START_TIME_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    name: str
    used_memory_bytes: int
    user: str
    command: str
    sm_percent: float
    uid: int
    pid_in_container: int
    container: Container
    cpu_percent: float
    resident_memory_bytes: int
    start_time_unix_seconds: float
    def __init__(self, pid: _Optional[int] = ..., name: _Optional[str] = ..., used_memory_bytes: _Optional[int] = ..., user: _Optional[str] = ..., command: _Optional[str] = ..., sm_percent: _Optional[float] = ..., uid: _Optional[int] = ..., pid_in_container: _Optional[int] = ..., container: _Optional[_Union[Container, _Mapping]] = ..., cpu_percent: _Optional[float] = ..., resident_memory_bytes: _Optional[int] = ..., start_time_unix_seconds: _Optional[float] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("runtime", "id", "pod_uid", "pod_name", "pod_namespace", "slurm_job_id", "slurm_step", "own_mount_namespace")
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SLURM_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SLURM_STEP_FIELD_NUMBER: _ClassVar[int]
    OWN_MOUNT_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    runtime: str
    id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    slurm_job_id: str
    slurm_step: str
    own_mount_namespace: bool
    def __init__(self, runtime: _Optional[str] = ..., id: _Optional[str] = ..., pod_uid: _Optional[str] = ..., pod_name: _Optional[str] = ..., pod_namespace: _Optional[str] = ..., slurm_job_id: _Optional[str] = ..., slurm_step: _Optional[str] = ..., own_mount_namespace: _Optional[bool] = ...) -> None: ...

class GpuStats(_message.Message):
    __slots__ = ("index", "name", "uuid", "pci_bus_id", "utilization_percent", "memory_utilization_percent", "memory_used_bytes", "memory_total_bytes", "power_watts", "power_limit_watts", "temperature_celsius", "sm_clock_hz", "memory_clock_hz", "clock_event_reasons_mask", "clock_event_reasons", "ecc_corrected_total", "ecc_uncorrected_total", "nvlink_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_total", "nvlink_tx_bytes_total", "pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s", "sm_active_percent", "sm_occupancy_percent", "tensor_active_percent", "dram_active_percent", "fp16_active_percent", "fp32_active_percent", "fp64_active_percent", "gpm_window_seconds", "processes", "graphics_active_percent", "gpm_nvlink_rx_bytes_per_s", "gpm_nvlink_tx_bytes_per_s", "minor_number", "nvml_failed_queries", "processes_age_seconds", "processes_interval_seconds", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_WATTS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_CELSIUS_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_HZ_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CLOCK_HZ_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_MASK_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NVLINK_RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    NVLINK_TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    NVLINK_RX_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NVLINK_TX_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PCIE_RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PCIE_TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    SM_ACTIVE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SM_OCCUPANCY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ACTIVE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    DRAM_ACTIVE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    FP16_ACTIVE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    FP32_ACTIVE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    FP64_ACTIVE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GPM_WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    GRAPHICS_ACTIVE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GPM_NVLINK_RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    GPM_NVLINK_TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    MINOR_NUMBER_FIELD_NUMBER: _ClassVar[int]
    NVML_FAILED_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    utilization_percent: float
    memory_utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float
    power_limit_watts: float
    temperature_celsius: float
    sm_clock_hz: float
    memory_clock_hz: float
    clock_event_reasons_mask: int
    clock_event_reasons: _containers.RepeatedScalarFieldContainer[str]
    ecc_corrected_total: int
    ecc_uncorrected_total: int
    nvlink_rx_bytes_per_s: float
    nvlink_tx_bytes_per_s: float
    nvlink_rx_bytes_total: int
    nvlink_tx_bytes_total: int
    pcie_rx_bytes_per_s: float
    pcie_tx_bytes_per_s: float
    sm_active_percent: float
    sm_occupancy_percent: float
    tensor_active_percent: float
    dram_active_percent: float
    fp16_active_percent: float
    fp32_active_percent: float
    fp64_active_percent: float
    gpm_window_seconds: float
    processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    graphics_active_percent: float
    gpm_nvlink_rx_bytes_per_s: float
    gpm_nvlink_tx_bytes_per_s: float
    minor_number: int
    nvml_failed_queries: int
    processes_age_seconds: float
    processes_interval_seconds: float
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., uuid: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., utilization_percent: _Optional[float] = ..., memory_utilization_percent: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., power_watts: _Optional[float] = ..., power_limit_watts: _Optional[float] = ..., temperature_celsius: _Optional[float] = ..., sm_clock_hz: _Optional[float] = ..., memory_clock_hz: _Optional[float] = ..., clock_event_reasons_mask: _Optional[int] = ..., clock_event_reasons: _Optional[_Iterable[str]] = ..., ecc_corrected_total: _Optional[int] = ..., ecc_uncorrected_total: _Optional[int] = ..., nvlink_rx_bytes_per_s: _Optional[float] = ..., nvlink_tx_bytes_per_s: _Optional[float] = ..., nvlink_rx_bytes_total: _Optional[int] = ..., nvlink_tx_bytes_total: _Optional[int] = ..., pcie_rx_bytes_per_s: _Optional[float] = ..., pcie_tx_bytes_per_s: _Optional[float] = ..., sm_active_percent: _Optional[float] = ..., sm_occupancy_percent: _Optional[float] = ..., tensor_active_percent: _Optional[float] = ..., dram_active_percent: _Optional[float] = ..., fp16_active_percent: _Optional[float] = ..., fp32_active_percent: _Optional[float] = ..., fp64_active_percent: _Optional[float] = ..., gpm_window_seconds: _Optional[float] = ..., processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ..., graphics_active_percent: _Optional[float] = ..., gpm_nvlink_rx_bytes_per_s: _Optional[float] = ..., gpm_nvlink_tx_bytes_per_s: _Optional[float] = ..., minor_number: _Optional[int] = ..., nvml_failed_queries: _Optional[int] = ..., processes_age_seconds: _Optional[float] = ..., processes_interval_seconds: _Optional[float] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PmuStats(_message.Message):
    __slots__ = ("scope", "hardware_available", "hardware_reason", "mips", "mega_cycles_per_s", "ipc", "cache_misses_per_s", "cache_miss_percent", "branch_misses_per_s", "task_clock_cpus", "context_switches_per_s", "page_faults_per_s", "cpu_migrations_per_s", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_REASON_FIELD_NUMBER: _ClassVar[int]
    MIPS_FIELD_NUMBER: _ClassVar[int]
    MEGA_CYCLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISSES_PER_S_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISS_PERCENT_FIELD_NUMBER: _ClassVar[int]
    BRANCH_MISSES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TASK_CLOCK_CPUS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SWITCHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    PAGE_FAULTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CPU_MIGRATIONS_PER_S_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    scope: str
    hardware_available: bool
    hardware_reason: str
    mips: float
    mega_cycles_per_s: float
    ipc: float
    cache_misses_per_s: float
    cache_miss_percent: float
    branch_misses_per_s: float
    task_clock_cpus: float
    context_switches_per_s: float
    page_faults_per_s: float
    cpu_migrations_per_s: float
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, scope: _Optional[str] = ..., hardware_available: _Optional[bool] = ..., hardware_reason: _Optional[str] = ..., mips: _Optional[float] = ..., mega_cycles_per_s: _Optional[float] = ..., ipc: _Optional[float] = ..., cache_misses_per_s: _Optional[float] = ..., cache_miss_percent: _Optional[float] = ..., branch_misses_per_s: _Optional[float] = ..., task_clock_cpus: _Optional[float] = ..., context_switches_per_s: _Optional[float] = ..., page_faults_per_s: _Optional[float] = ..., cpu_migrations_per_s: _Optional[float] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class LatencyStats(_message.Message):
    __slots__ = ("avg_seconds", "min_seconds", "max_seconds", "p50_seconds", "p99_seconds", "min_exact", "max_exact")
    AVG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MIN_EXACT_FIELD_NUMBER: _ClassVar[int]
    MAX_EXACT_FIELD_NUMBER: _ClassVar[int]
    avg_seconds: float
    min_seconds: float
    max_seconds: float
    p50_seconds: float
    p99_seconds: float
    min_exact: bool
    max_exact: bool
    def __init__(self, avg_seconds: _Optional[float] = ..., min_seconds: _Optional[float] = ..., max_seconds: _Optional[float] = ..., p50_seconds: _Optional[float] = ..., p99_seconds: _Optional[float] = ..., min_exact: _Optional[bool] = ..., max_exact: _Optional[bool] = ...) -> None: ...

class GemmOpStats(_message.Message):
    __slots__ = ("op", "dtype", "shape", "count_total", "count_per_s", "tflops", "flops_total", "latency", "first_call_seconds", "timed_count_total", "timed_count_interval", "sample_every")
    OP_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    COUNT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COUNT_PER_S_FIELD_NUMBER: _ClassVar[int]
    TFLOPS_FIELD_NUMBER: _ClassVar[int]
    FLOPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    FIRST_CALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIMED_COUNT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TIMED_COUNT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_EVERY_FIELD_NUMBER: _ClassVar[int]
    op: str
    dtype: str
    shape: str
    count_total: int
    count_per_s: float
    tflops: float
    flops_total: float
    latency: LatencyStats
    first_call_seconds: float
    timed_count_total: int
    timed_count_interval: int
    sample_every: int
    def __init__(self, op: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[str] = ..., count_total: _Optional[int] = ..., count_per_s: _Optional[float] = ..., tflops: _Optional[float] = ..., flops_total: _Optional[float] = ..., latency: _Optional[_Union[LatencyStats, _Mapping]] = ..., first_call_seconds: _Optional[float] = ..., timed_count_total: _Optional[int] = ..., timed_count_interval: _Optional[int] = ..., sample_every: _Optional[int] = ...) -> None: ...

class NcclOpStats(_message.Message):
    __slots__ = ("op", "dtype", "algorithm", "protocol", "comm_hash", "comm_size", "count_total", "count_per_s", "bytes_total", "algbw_bytes_per_s", "busbw_bytes_per_s", "latency")
    OP_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    COMM_HASH_FIELD_NUMBER: _ClassVar[int]
    COMM_SIZE_FIELD_NUMBER: _ClassVar[int]
    COUNT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COUNT_PER_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ALGBW_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    BUSBW_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    op: str
    dtype: str
    algorithm: str
    protocol: str
    comm_hash: str
    comm_size: int
    count_total: int
    count_per_s: float
    bytes_total: int
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    latency: LatencyStats
    def __init__(self, op: _Optional[str] = ..., dtype: _Optional[str] = ..., algorithm: _Optional[str] = ..., protocol: _Optional[str] = ..., comm_hash: _Optional[str] = ..., comm_size: _Optional[int] = ..., count_total: _Optional[int] = ..., count_per_s: _Optional[float] = ..., bytes_total: _Optional[int] = ..., algbw_bytes_per_s: _Optional[float] = ..., busbw_bytes_per_s: _Optional[float] = ..., latency: _Optional[_Union[LatencyStats, _Mapping]] = ...) -> None: ...

class InflightOp(_message.Message):
    __slots__ = ("kind", "op", "comm_hash", "sequence", "age_seconds", "stream")
    KIND_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    COMM_HASH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    kind: str
    op: str
    comm_hash: str
    sequence: int
    age_seconds: float
    stream: int
    def __init__(self, kind: _Optional[str] = ..., op: _Optional[str] = ..., comm_hash: _Optional[str] = ..., sequence: _Optional[int] = ..., age_seconds: _Optional[float] = ..., stream: _Optional[int] = ...) -> None: ...

class RankStats(_message.Message):
    __slots__ = ("pid", "rank", "local_rank", "world_size", "job_id", "state", "exit_code", "exit_signal", "heartbeat_age_seconds", "step_count", "step_time_seconds", "gemm_tflops", "gemm", "nccl", "inflight", "gc_pause_seconds_per_s", "dataloader_wait_seconds_per_s", "pmu", "exception", "process_groups", "hook", "uid", "interval_seconds", "arrivals", "step_ends_unix_ns", "run_delay_seconds_per_s", "cpu_throttled_seconds_per_s", "pid_in_container", "container", "functions", "unavailable", "device_memory", "function_request", "functions_waiting")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEP_COUNT_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GEMM_TFLOPS_FIELD_NUMBER: _ClassVar[int]
    GEMM_FIELD_NUMBER: _ClassVar[int]
    NCCL_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    GC_PAUSE_SECONDS_PER_S_FIELD_NUMBER: _ClassVar[int]
    DATALOADER_WAIT_SECONDS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PMU_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_FIELD_NUMBER: _ClassVar[int]
    PROCESS_GROUPS_FIELD_NUMBER: _ClassVar[int]
    HOOK_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ARRIVALS_FIELD_NUMBER: _ClassVar[int]
    STEP_ENDS_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    RUN_DELAY_SECONDS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CPU_THROTTLED_SECONDS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PID_IN_CONTAINER_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_REQUEST_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_WAITING_FIELD_NUMBER: _ClassVar[int]
    pid: int
    rank: int
    local_rank: int
    world_size: int
    job_id: str
    state: RankState
    exit_code: int
    exit_signal: int
    heartbeat_age_seconds: float
    step_count: int
    step_time_seconds: float
    gemm_tflops: float
    gemm: _containers.RepeatedCompositeFieldContainer[GemmOpStats]
    nccl: _containers.RepeatedCompositeFieldContainer[NcclOpStats]
    inflight: _containers.RepeatedCompositeFieldContainer[InflightOp]
    gc_pause_seconds_per_s: float
    dataloader_wait_seconds_per_s: float
    pmu: PmuStats
    exception: str
    process_groups: _containers.RepeatedCompositeFieldContainer[ProcessGroupProgress]
    hook: HookHealth
    uid: int
    interval_seconds: float
    arrivals: _containers.RepeatedCompositeFieldContainer[CollectiveArrivals]
    step_ends_unix_ns: _containers.RepeatedScalarFieldContainer[int]
    run_delay_seconds_per_s: float
    cpu_throttled_seconds_per_s: float
    pid_in_container: int
    container: Container
    functions: _containers.RepeatedCompositeFieldContainer[FunctionTiming]
    unavailable: _containers.ScalarMap[str, str]
    device_memory: DeviceMemoryStats
    function_request: FunctionTimingOutcome
    functions_waiting: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pid: _Optional[int] = ..., rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., world_size: _Optional[int] = ..., job_id: _Optional[str] = ..., state: _Optional[_Union[RankState, str]] = ..., exit_code: _Optional[int] = ..., exit_signal: _Optional[int] = ..., heartbeat_age_seconds: _Optional[float] = ..., step_count: _Optional[int] = ..., step_time_seconds: _Optional[float] = ..., gemm_tflops: _Optional[float] = ..., gemm: _Optional[_Iterable[_Union[GemmOpStats, _Mapping]]] = ..., nccl: _Optional[_Iterable[_Union[NcclOpStats, _Mapping]]] = ..., inflight: _Optional[_Iterable[_Union[InflightOp, _Mapping]]] = ..., gc_pause_seconds_per_s: _Optional[float] = ..., dataloader_wait_seconds_per_s: _Optional[float] = ..., pmu: _Optional[_Union[PmuStats, _Mapping]] = ..., exception: _Optional[str] = ..., process_groups: _Optional[_Iterable[_Union[ProcessGroupProgress, _Mapping]]] = ..., hook: _Optional[_Union[HookHealth, _Mapping]] = ..., uid: _Optional[int] = ..., interval_seconds: _Optional[float] = ..., arrivals: _Optional[_Iterable[_Union[CollectiveArrivals, _Mapping]]] = ..., step_ends_unix_ns: _Optional[_Iterable[int]] = ..., run_delay_seconds_per_s: _Optional[float] = ..., cpu_throttled_seconds_per_s: _Optional[float] = ..., pid_in_container: _Optional[int] = ..., container: _Optional[_Union[Container, _Mapping]] = ..., functions: _Optional[_Iterable[_Union[FunctionTiming, _Mapping]]] = ..., unavailable: _Optional[_Mapping[str, str]] = ..., device_memory: _Optional[_Union[DeviceMemoryStats, _Mapping]] = ..., function_request: _Optional[_Union[FunctionTimingOutcome, _Mapping]] = ..., functions_waiting: _Optional[_Iterable[str]] = ...) -> None: ...

class DeviceMemoryStats(_message.Message):
    __slots__ = ("malloc", "malloc_async", "copies", "allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "alloc_retries_total", "ooms_total", "allocator_age_seconds", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MALLOC_FIELD_NUMBER: _ClassVar[int]
    MALLOC_ASYNC_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOC_RETRIES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    OOMS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ALLOCATOR_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    malloc: DeviceAllocations
    malloc_async: DeviceAllocations
    copies: _containers.RepeatedCompositeFieldContainer[MemoryCopies]
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    alloc_retries_total: int
    ooms_total: int
    allocator_age_seconds: float
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, malloc: _Optional[_Union[DeviceAllocations, _Mapping]] = ..., malloc_async: _Optional[_Union[DeviceAllocations, _Mapping]] = ..., copies: _Optional[_Iterable[_Union[MemoryCopies, _Mapping]]] = ..., allocated_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., peak_allocated_bytes: _Optional[int] = ..., alloc_retries_total: _Optional[int] = ..., ooms_total: _Optional[int] = ..., allocator_age_seconds: _Optional[float] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DeviceAllocations(_message.Message):
    __slots__ = ("malloc_calls_total", "malloc_bytes_total", "free_calls_total", "free_bytes_total", "free_unknown_size_total")
    MALLOC_CALLS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MALLOC_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FREE_CALLS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FREE_UNKNOWN_SIZE_TOTAL_FIELD_NUMBER: _ClassVar[int]
    malloc_calls_total: int
    malloc_bytes_total: int
    free_calls_total: int
    free_bytes_total: int
    free_unknown_size_total: int
    def __init__(self, malloc_calls_total: _Optional[int] = ..., malloc_bytes_total: _Optional[int] = ..., free_calls_total: _Optional[int] = ..., free_bytes_total: _Optional[int] = ..., free_unknown_size_total: _Optional[int] = ...) -> None: ...

class MemoryCopies(_message.Message):
    __slots__ = ("direction", "calls_total", "bytes_total", "calls_per_s", "bytes_per_s", "timed_calls_total", "untimed_total", "mean_seconds", "seconds_total", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    CALLS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CALLS_PER_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TIMED_CALLS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UNTIMED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEAN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    direction: str
    calls_total: int
    bytes_total: int
    calls_per_s: float
    bytes_per_s: float
    timed_calls_total: int
    untimed_total: int
    mean_seconds: float
    seconds_total: float
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, direction: _Optional[str] = ..., calls_total: _Optional[int] = ..., bytes_total: _Optional[int] = ..., calls_per_s: _Optional[float] = ..., bytes_per_s: _Optional[float] = ..., timed_calls_total: _Optional[int] = ..., untimed_total: _Optional[int] = ..., mean_seconds: _Optional[float] = ..., seconds_total: _Optional[float] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class FunctionTiming(_message.Message):
    __slots__ = ("name", "calls_total", "seconds_total", "max_seconds", "calls_per_s", "seconds_per_s", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    CALLS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MAX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CALLS_PER_S_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_S_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    calls_total: int
    seconds_total: float
    max_seconds: float
    calls_per_s: float
    seconds_per_s: float
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., calls_total: _Optional[int] = ..., seconds_total: _Optional[float] = ..., max_seconds: _Optional[float] = ..., calls_per_s: _Optional[float] = ..., seconds_per_s: _Optional[float] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CollectiveArrivals(_message.Message):
    __slots__ = ("comm", "sequence", "start_unix_ns", "enqueued")
    COMM_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    comm: str
    sequence: _containers.RepeatedScalarFieldContainer[int]
    start_unix_ns: _containers.RepeatedScalarFieldContainer[int]
    enqueued: bool
    def __init__(self, comm: _Optional[str] = ..., sequence: _Optional[_Iterable[int]] = ..., start_unix_ns: _Optional[_Iterable[int]] = ..., enqueued: _Optional[bool] = ...) -> None: ...

class HookHealth(_message.Message):
    __slots__ = ("cuda_timing", "nccl_plugin", "nccl_gpu_timers", "gemm_untimed_total", "nccl_untimed_total", "dropped_records_total", "slot_overflow_total", "nccl_channel_shortfall_total", "nccl_late_channels_total", "pending", "inactive_reason", "gemm_timed_first_calls", "gemm_sample_every", "nccl_api_fallback", "nccl_api_events", "gemm_sample_max", "stale_inflight_total", "nccl_profiler_api", "nccl_profiler_chain")
    CUDA_TIMING_FIELD_NUMBER: _ClassVar[int]
    NCCL_PLUGIN_FIELD_NUMBER: _ClassVar[int]
    NCCL_GPU_TIMERS_FIELD_NUMBER: _ClassVar[int]
    GEMM_UNTIMED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NCCL_UNTIMED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DROPPED_RECORDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SLOT_OVERFLOW_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NCCL_CHANNEL_SHORTFALL_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NCCL_LATE_CHANNELS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_REASON_FIELD_NUMBER: _ClassVar[int]
    GEMM_TIMED_FIRST_CALLS_FIELD_NUMBER: _ClassVar[int]
    GEMM_SAMPLE_EVERY_FIELD_NUMBER: _ClassVar[int]
    NCCL_API_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    NCCL_API_EVENTS_FIELD_NUMBER: _ClassVar[int]
    GEMM_SAMPLE_MAX_FIELD_NUMBER: _ClassVar[int]
    STALE_INFLIGHT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NCCL_PROFILER_API_FIELD_NUMBER: _ClassVar[int]
    NCCL_PROFILER_CHAIN_FIELD_NUMBER: _ClassVar[int]
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
    def __init__(self, cuda_timing: _Optional[bool] = ..., nccl_plugin: _Optional[bool] = ..., nccl_gpu_timers: _Optional[bool] = ..., gemm_untimed_total: _Optional[int] = ..., nccl_untimed_total: _Optional[int] = ..., dropped_records_total: _Optional[int] = ..., slot_overflow_total: _Optional[int] = ..., nccl_channel_shortfall_total: _Optional[int] = ..., nccl_late_channels_total: _Optional[int] = ..., pending: _Optional[int] = ..., inactive_reason: _Optional[str] = ..., gemm_timed_first_calls: _Optional[int] = ..., gemm_sample_every: _Optional[int] = ..., nccl_api_fallback: _Optional[bool] = ..., nccl_api_events: _Optional[bool] = ..., gemm_sample_max: _Optional[int] = ..., stale_inflight_total: _Optional[int] = ..., nccl_profiler_api: _Optional[int] = ..., nccl_profiler_chain: _Optional[str] = ...) -> None: ...

class ProcessGroupProgress(_message.Message):
    __slots__ = ("id", "last_enqueued", "last_completed")
    ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    LAST_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    id: str
    last_enqueued: int
    last_completed: int
    def __init__(self, id: _Optional[str] = ..., last_enqueued: _Optional[int] = ..., last_completed: _Optional[int] = ...) -> None: ...

class RankVerdict(_message.Message):
    __slots__ = ("pid", "rank", "level", "explanation")
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    pid: int
    rank: int
    level: HangLevel
    explanation: str
    def __init__(self, pid: _Optional[int] = ..., rank: _Optional[int] = ..., level: _Optional[_Union[HangLevel, str]] = ..., explanation: _Optional[str] = ...) -> None: ...

class HangStatus(_message.Message):
    __slots__ = ("level", "since_unix_ns", "explanation", "ranks")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    level: HangLevel
    since_unix_ns: int
    explanation: str
    ranks: _containers.RepeatedCompositeFieldContainer[RankVerdict]
    def __init__(self, level: _Optional[_Union[HangLevel, str]] = ..., since_unix_ns: _Optional[int] = ..., explanation: _Optional[str] = ..., ranks: _Optional[_Iterable[_Union[RankVerdict, _Mapping]]] = ...) -> None: ...

class RankCost(_message.Message):
    __slots__ = ("pid", "rank", "host", "gpu", "cost_seconds", "cost_percent")
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    COST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COST_PERCENT_FIELD_NUMBER: _ClassVar[int]
    pid: int
    rank: int
    host: str
    gpu: int
    cost_seconds: float
    cost_percent: float
    def __init__(self, pid: _Optional[int] = ..., rank: _Optional[int] = ..., host: _Optional[str] = ..., gpu: _Optional[int] = ..., cost_seconds: _Optional[float] = ..., cost_percent: _Optional[float] = ...) -> None: ...

class JobSlowdown(_message.Message):
    __slots__ = ("job_id", "slow", "cause", "culprits", "ranks", "evidence", "unchecked", "step_seconds", "baseline_step_seconds", "cost_seconds", "cost_percent", "since_unix_ns", "unavailable")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SLOW_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    CULPRITS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    UNCHECKED_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COST_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    slow: bool
    cause: SlowdownCause
    culprits: _containers.RepeatedCompositeFieldContainer[RankCost]
    ranks: _containers.RepeatedCompositeFieldContainer[RankCost]
    evidence: _containers.RepeatedScalarFieldContainer[str]
    unchecked: _containers.RepeatedScalarFieldContainer[str]
    step_seconds: float
    baseline_step_seconds: float
    cost_seconds: float
    cost_percent: float
    since_unix_ns: int
    unavailable: _containers.ScalarMap[str, str]
    def __init__(self, job_id: _Optional[str] = ..., slow: _Optional[bool] = ..., cause: _Optional[_Union[SlowdownCause, str]] = ..., culprits: _Optional[_Iterable[_Union[RankCost, _Mapping]]] = ..., ranks: _Optional[_Iterable[_Union[RankCost, _Mapping]]] = ..., evidence: _Optional[_Iterable[str]] = ..., unchecked: _Optional[_Iterable[str]] = ..., step_seconds: _Optional[float] = ..., baseline_step_seconds: _Optional[float] = ..., cost_seconds: _Optional[float] = ..., cost_percent: _Optional[float] = ..., since_unix_ns: _Optional[int] = ..., unavailable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TraceOptions(_message.Message):
    __slots__ = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
    RECORD_SHAPES_FIELD_NUMBER: _ClassVar[int]
    PROFILE_MEMORY_FIELD_NUMBER: _ClassVar[int]
    WITH_STACK_FIELD_NUMBER: _ClassVar[int]
    WITH_FLOPS_FIELD_NUMBER: _ClassVar[int]
    WITH_MODULES_FIELD_NUMBER: _ClassVar[int]
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    with_flops: bool
    with_modules: bool
    def __init__(self, record_shapes: _Optional[bool] = ..., profile_memory: _Optional[bool] = ..., with_stack: _Optional[bool] = ..., with_flops: _Optional[bool] = ..., with_modules: _Optional[bool] = ...) -> None: ...

class CaptureTraceRequest(_message.Message):
    __slots__ = ("kind", "duration_ms", "iterations", "last_events", "start_time_unix_ms", "pids", "job_id", "ranks", "options", "output_subdir", "summary_steps", "summary_like_hta")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KINETO: _ClassVar[CaptureTraceRequest.Kind]
        TIMELINE: _ClassVar[CaptureTraceRequest.Kind]
    KINETO: CaptureTraceRequest.Kind
    TIMELINE: CaptureTraceRequest.Kind
    class SummarySteps(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ALL_STEPS: _ClassVar[CaptureTraceRequest.SummarySteps]
        COMPLETE_STEPS: _ClassVar[CaptureTraceRequest.SummarySteps]
    ALL_STEPS: CaptureTraceRequest.SummarySteps
    COMPLETE_STEPS: CaptureTraceRequest.SummarySteps
    KIND_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENTS_FIELD_NUMBER: _ClassVar[int]
    START_TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SUBDIR_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_STEPS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_LIKE_HTA_FIELD_NUMBER: _ClassVar[int]
    kind: CaptureTraceRequest.Kind
    duration_ms: int
    iterations: int
    last_events: int
    start_time_unix_ms: int
    pids: _containers.RepeatedScalarFieldContainer[int]
    job_id: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    options: TraceOptions
    output_subdir: str
    summary_steps: CaptureTraceRequest.SummarySteps
    summary_like_hta: bool
    def __init__(self, kind: _Optional[_Union[CaptureTraceRequest.Kind, str]] = ..., duration_ms: _Optional[int] = ..., iterations: _Optional[int] = ..., last_events: _Optional[int] = ..., start_time_unix_ms: _Optional[int] = ..., pids: _Optional[_Iterable[int]] = ..., job_id: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., options: _Optional[_Union[TraceOptions, _Mapping]] = ..., output_subdir: _Optional[str] = ..., summary_steps: _Optional[_Union[CaptureTraceRequest.SummarySteps, str]] = ..., summary_like_hta: _Optional[bool] = ...) -> None: ...

class TraceTarget(_message.Message):
    __slots__ = ("host", "pid", "rank", "state", "file", "reason", "summary")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    host: str
    pid: int
    rank: int
    state: TraceTargetState
    file: str
    reason: str
    summary: RankTraceSummary
    def __init__(self, host: _Optional[str] = ..., pid: _Optional[int] = ..., rank: _Optional[int] = ..., state: _Optional[_Union[TraceTargetState, str]] = ..., file: _Optional[str] = ..., reason: _Optional[str] = ..., summary: _Optional[_Union[RankTraceSummary, _Mapping]] = ...) -> None: ...

class RankTraceSummary(_message.Message):
    __slots__ = ("result_json", "base_time_ns", "collectives", "error", "seconds")
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    BASE_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    result_json: str
    base_time_ns: int
    collectives: _containers.RepeatedCompositeFieldContainer[CollectiveTimings]
    error: str
    seconds: float
    def __init__(self, result_json: _Optional[str] = ..., base_time_ns: _Optional[int] = ..., collectives: _Optional[_Iterable[_Union[CollectiveTimings, _Mapping]]] = ..., error: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class CollectiveTimings(_message.Message):
    __slots__ = ("group", "op", "on_gpu", "seq", "start_us", "end_us")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ON_GPU_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    START_US_FIELD_NUMBER: _ClassVar[int]
    END_US_FIELD_NUMBER: _ClassVar[int]
    group: str
    op: str
    on_gpu: bool
    seq: _containers.RepeatedScalarFieldContainer[int]
    start_us: _containers.RepeatedScalarFieldContainer[float]
    end_us: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, group: _Optional[str] = ..., op: _Optional[str] = ..., on_gpu: _Optional[bool] = ..., seq: _Optional[_Iterable[int]] = ..., start_us: _Optional[_Iterable[float]] = ..., end_us: _Optional[_Iterable[float]] = ...) -> None: ...

class CaptureStatusRequest(_message.Message):
    __slots__ = ("capture_id",)
    CAPTURE_ID_FIELD_NUMBER: _ClassVar[int]
    capture_id: str
    def __init__(self, capture_id: _Optional[str] = ...) -> None: ...

class CaptureTraceReply(_message.Message):
    __slots__ = ("capture_id", "targets", "done", "message")
    CAPTURE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    capture_id: str
    targets: _containers.RepeatedCompositeFieldContainer[TraceTarget]
    done: bool
    message: str
    def __init__(self, capture_id: _Optional[str] = ..., targets: _Optional[_Iterable[_Union[TraceTarget, _Mapping]]] = ..., done: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class FetchFileRequest(_message.Message):
    __slots__ = ("path", "offset")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("data", "offset", "total_size")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    total_size: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., total_size: _Optional[int] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("function", "file", "line", "native", "module")
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    function: str
    file: str
    line: int
    native: bool
    module: str
    def __init__(self, function: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ..., native: _Optional[bool] = ..., module: _Optional[str] = ...) -> None: ...

class ThreadStack(_message.Message):
    __slots__ = ("thread_id", "thread_name", "frames", "active")
    THREAD_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_NAME_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    thread_id: int
    thread_name: str
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    active: bool
    def __init__(self, thread_id: _Optional[int] = ..., thread_name: _Optional[str] = ..., frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ..., active: _Optional[bool] = ...) -> None: ...

class RankStacks(_message.Message):
    __slots__ = ("pid", "rank", "threads", "error", "dump_seconds", "cached", "age_seconds", "next_dump_in_seconds")
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DUMP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_DUMP_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    rank: int
    threads: _containers.RepeatedCompositeFieldContainer[ThreadStack]
    error: str
    dump_seconds: float
    cached: bool
    age_seconds: float
    next_dump_in_seconds: float
    def __init__(self, pid: _Optional[int] = ..., rank: _Optional[int] = ..., threads: _Optional[_Iterable[_Union[ThreadStack, _Mapping]]] = ..., error: _Optional[str] = ..., dump_seconds: _Optional[float] = ..., cached: _Optional[bool] = ..., age_seconds: _Optional[float] = ..., next_dump_in_seconds: _Optional[float] = ...) -> None: ...

class StackNode(_message.Message):
    __slots__ = ("frame", "ranks", "children", "thread")
    FRAME_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    THREAD_FIELD_NUMBER: _ClassVar[int]
    frame: Frame
    ranks: _containers.RepeatedScalarFieldContainer[int]
    children: _containers.RepeatedCompositeFieldContainer[StackNode]
    thread: str
    def __init__(self, frame: _Optional[_Union[Frame, _Mapping]] = ..., ranks: _Optional[_Iterable[int]] = ..., children: _Optional[_Iterable[_Union[StackNode, _Mapping]]] = ..., thread: _Optional[str] = ...) -> None: ...

class GetStacksRequest(_message.Message):
    __slots__ = ("take_now", "native", "pids")
    TAKE_NOW_FIELD_NUMBER: _ClassVar[int]
    NATIVE_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    take_now: bool
    native: bool
    pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, take_now: _Optional[bool] = ..., native: _Optional[bool] = ..., pids: _Optional[_Iterable[int]] = ...) -> None: ...

class StacksReply(_message.Message):
    __slots__ = ("hostname", "taken_unix_ns", "ranks", "merged", "incident")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    TAKEN_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    taken_unix_ns: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankStacks]
    merged: StackNode
    incident: str
    def __init__(self, hostname: _Optional[str] = ..., taken_unix_ns: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankStacks, _Mapping]]] = ..., merged: _Optional[_Union[StackNode, _Mapping]] = ..., incident: _Optional[str] = ...) -> None: ...

class SetFunctionTimingRequest(_message.Message):
    __slots__ = ("pid", "start", "stop")
    PID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    pid: int
    start: _containers.RepeatedScalarFieldContainer[str]
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pid: _Optional[int] = ..., start: _Optional[_Iterable[str]] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class FunctionTimingOutcome(_message.Message):
    __slots__ = ("serial", "acknowledged", "problems", "reason")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    serial: int
    acknowledged: bool
    problems: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, serial: _Optional[int] = ..., acknowledged: _Optional[bool] = ..., problems: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...
