"""Types of tuiprof_native.segment (the Cython segment reader); see segment.pyx for the why."""

import builtins
import re
from dataclasses import dataclass
from os import PathLike
from types import TracebackType

SEGMENT_DIR: str
SEGMENT_PREFIX: str
EXCEPTION_SUFFIX: str
FLIGHT_SUFFIX: str
INERT_SUFFIX: str
STEM_RANDOM_DIGITS: int
LAYOUT_VERSION: int
LAYOUT_VERSION_NO_DATA_SEQ: int
SEGMENT_SIZE: int
HEADER_SIZE: int
SLOTS_OFFSET: int
HIST_BUCKETS: int
FINE_OCTAVES: int
FINE_SUB_BITS: int
RING_CAPACITY: int
KINDS: dict[int, str]
COPY_DIRECTIONS: dict[int, str]
COPY_TIMED_FIRST: int
COPY_SAMPLE_EVERY: int
ALLOCATOR_NONE: int
ALLOCATOR_READ: int
ALLOCATOR_NO_CUDA: int
ALLOCATOR_UNINITIALIZED: int
FLAG_CUDA_TIMING: int
FLAG_NCCL_PLUGIN: int
FLAG_NCCL_GPU_TIME: int
FLAG_EXITED: int
FLAG_EXIT_STATUS: int
FLAG_NCCL_API: int
FLAG_NCCL_API_EVENTS: int
FLAG_LOCKED: int
MAX_UID: int
PID_MAX_LIMIT: int
SEGMENT_NAME: re.Pattern[str]

class SegmentError(OSError): ...
class SegmentFormatError(SegmentError): ...
class SegmentNotReadyError(SegmentError): ...
class SegmentBusyError(SegmentError): ...

@dataclass(frozen=True)
class Counters:
    step_count: int
    step_time_total_ns: int
    last_step_ns: int
    last_step_time_ns: int
    gc_count: int
    gc_pause_total_ns: int
    dataloader_count: int
    dataloader_wait_total_ns: int
    gemm_untimed: int
    nccl_untimed: int
    dropped_records: int
    slot_overflow: int
    nccl_channel_shortfall: int
    nccl_late_channels: int

@dataclass(frozen=True)
class Header:
    layout_version: int
    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    job_id: str
    hostname: str
    start_ns: int
    heartbeat_ns: int
    writer_seq: int
    flags: int
    slots_used: int
    ring_head: int
    counters: Counters
    fatal_signal: int | None
    exit_status: int | None
    gemm_timed_first: int = ...
    gemm_sample_every: int = ...
    gemm_sample_max: int = ...
    nccl_profiler_api: int = ...
    nccl_chain: str = ...

class Pulse:
    pid: int
    heartbeat_ns: int
    data_seq: int | None

@dataclass(frozen=True)
class AllocStats:
    malloc_calls: int
    malloc_bytes: int
    free_calls: int
    free_bytes: int
    free_unknown: int

@dataclass(frozen=True)
class CopyStats:
    direction: str
    calls: int
    bytes: int
    timed_calls: int
    timed_ns: int
    weighted_calls: int
    weighted_ns: int
    untimed: int

@dataclass(frozen=True)
class DeviceMemory:
    malloc: AllocStats
    malloc_async: AllocStats
    copies: tuple[CopyStats, ...]
    allocator_state: int
    allocator_read_ns: int
    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    alloc_retries: int
    ooms: int

@dataclass(frozen=True)
class Slot:
    kind: str
    op: str
    dtype: str
    algo: str
    proto: str
    nranks: int
    b: int
    m: int
    n: int
    k: int
    comm_hash: int
    count: int
    timed_count: int
    total_ns: int
    min_ns: int | None
    max_ns: int | None
    min_at_timed: int | None
    max_at_timed: int | None
    first_call_ns: int | None
    bytes: int
    flops: int
    timed_bytes: int
    timed_flops: int
    weighted_timed_count: int
    weighted_total_ns: int
    weighted_timed_bytes: int
    weighted_timed_flops: int
    hist: tuple[int, ...]
    sample_every: int = ...
    fine_octave: int = ...
    fine_anchors: int = ...
    fine_start: int = ...
    fine: builtins.bytes = ...

@dataclass(frozen=True)
class Inflight:
    kind: str
    op: str
    key: int
    op_seq: int
    launched_ns: int
    pending: int

@dataclass(frozen=True)
class Event:
    index: int
    kind: str
    op: str
    dtype: str
    rank: int
    start_ns: int
    end_ns: int | None
    bytes: int
    flops: int
    op_seq: int
    comm_hash: int
    b: int
    m: int
    n: int
    k: int
    first_call: bool = ...
    stream: int = ...

@dataclass(frozen=True)
class SegmentFile:
    path: str
    uid: int
    pid: int

def parse_name(name: str) -> tuple[int, int, bool] | None: ...
def discover(directory: str = ...) -> list[SegmentFile]: ...

class Segment:
    path: str
    owner_uid: int
    device: int
    inode: int
    tells_changes: bool
    def __init__(self, path: str | PathLike[str]) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Segment: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...
    def header(self) -> Header: ...
    def device_memory(self) -> DeviceMemory: ...
    def claimant(self) -> tuple[int, int]: ...
    def heartbeat_ns(self) -> int: ...
    def pulse(self) -> Pulse: ...
    def slots(self) -> list[Slot]: ...
    def inflight(self) -> list[Inflight]: ...
    def events(self, since: int = 0, kind: str | None = None) -> list[Event]: ...
