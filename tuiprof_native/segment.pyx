# cython: language_level=3
"""Reading ranks' telemetry segments (/dev/shm/tuiprof-<uid>-<pid>-<random>).

The layout, the directory, the file names, the kinds and the flags are
defined once, in ``include/tuiprof_segment.h``; this module compiles against
that header, so a change there cannot leave the reader behind silently.

Segments lie in a world-writable directory and the agent may read them as
root, so a segment is hostile until proven otherwise:

- it is opened with ``O_NOFOLLOW|O_NONBLOCK`` (a symlink is refused, a FIFO
  cannot block the open) and must be a regular file of exactly the layout's
  size;
- it is never mapped: every read copies what it needs with ``pread`` into
  private memory, so a file truncated under the reader gives a short read (a
  ``SegmentFormatError``), never a SIGBUS. Only the header, the slots in use
  and the in-flight table are read per call; the event ring (~1 MiB) only
  when ``events()`` is asked for;
- every record is read under its sequence counter (seqlock, see the header)
  with a bounded number of tries: a writer mid-update is waited for briefly,
  a counter left odd by a writer killed mid-update gives ``SegmentBusyError``,
  never an endless loop; every count and index taken from the file is
  clamped to the layout's bounds.

The blocking system calls (open, fstat, pread, the back-off sleeps) run
without the GIL. Every error is a ``SegmentError`` (an ``OSError``) whose
message names the file and what to do.
"""

import builtins
import os
import re
from dataclasses import dataclass

from libc.errno cimport EINTR, ELOOP, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy
from posix.stat cimport S_ISREG, struct_stat
from posix.time cimport timespec
from posix.types cimport off_t


cdef extern from "<string.h>" nogil:
    size_t strnlen(const char *s, size_t maxlen)

cdef extern from "<fcntl.h>" nogil:
    enum: O_RDONLY
    enum: O_NOFOLLOW
    enum: O_NONBLOCK
    enum: O_CLOEXEC
    int c_open "open"(const char *path, int flags)

cdef extern from "<sys/stat.h>" nogil:
    int c_fstat "fstat"(int fd, struct_stat *st)

cdef extern from "<unistd.h>" nogil:
    ssize_t c_pread "pread"(int fd, void *buf, size_t count, off_t offset)
    int c_close "close"(int fd)

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<time.h>" nogil:
    int nanosleep(const timespec *req, timespec *rem)


cdef extern from "tuiprof_segment.h":
    uint64_t TP_MAGIC
    uint32_t TP_LAYOUT_VERSION
    uint32_t TP_LAYOUT_VERSION_NO_DATA_SEQ
    uint32_t TP_MAX_SLOTS
    uint32_t TP_MAX_INFLIGHT
    uint32_t TP_RING_CAPACITY
    uint32_t TP_HIST_BUCKETS
    enum: TP_NAME_LEN
    enum: TP_DTYPE_LEN
    enum: TP_ALGO_LEN
    enum: TP_PROTO_LEN
    enum: TP_JOB_ID_LEN
    enum: TP_NCCL_CHAIN_LEN
    enum: TP_HOSTNAME_LEN
    enum: TP_HIST_BUCKETS_N "TP_HIST_BUCKETS"
    enum: TP_FINE_BUCKETS_N "TP_FINE_BUCKETS"
    uint32_t TP_FINE_OCTAVES
    uint32_t TP_FINE_SUB_BITS
    const char *TP_SEGMENT_DIR
    const char *TP_SEGMENT_PREFIX
    const char *TP_EXCEPTION_SUFFIX
    const char *TP_FLIGHT_SUFFIX
    const char *TP_INERT_SUFFIX
    int TP_STEM_RANDOM_DIGITS
    uint32_t TP_KIND_NONE
    uint32_t TP_KIND_GEMM
    uint32_t TP_KIND_NCCL
    uint32_t TP_KIND_STEP
    uint32_t TP_KIND_GC
    uint32_t TP_KIND_DATALOADER
    uint32_t TP_KIND_MEMCPY
    uint32_t TP_COPY_DIRECTIONS
    uint32_t TP_COPY_HOST_TO_HOST
    uint32_t TP_COPY_HOST_TO_DEVICE
    uint32_t TP_COPY_DEVICE_TO_HOST
    uint32_t TP_COPY_DEVICE_TO_DEVICE
    uint32_t TP_COPY_DEFAULT
    enum: TP_COPY_DIRECTIONS_N "TP_COPY_DIRECTIONS"
    uint32_t TP_COPY_TIMED_FIRST
    uint32_t TP_COPY_SAMPLE_EVERY
    uint32_t TP_ALLOCATOR_NONE
    uint32_t TP_ALLOCATOR_READ
    uint32_t TP_ALLOCATOR_NO_CUDA
    uint32_t TP_ALLOCATOR_UNINITIALIZED
    uint32_t TP_FLAG_CUDA_TIMING
    uint32_t TP_FLAG_NCCL_PLUGIN
    uint32_t TP_FLAG_NCCL_GPU_TIME
    uint32_t TP_FLAG_EXITED
    uint32_t TP_FLAG_EXIT_STATUS
    uint32_t TP_FLAG_NCCL_API
    uint32_t TP_FLAG_NCCL_API_EVENTS
    uint32_t TP_FLAG_LOCKED
    uint32_t TP_EVENT_FIRST_CALL

    ctypedef struct tp_counters:
        uint64_t seq
        uint64_t step_count
        uint64_t step_time_total_ns
        uint64_t last_step_ns
        uint64_t last_step_time_ns
        uint64_t gc_count
        uint64_t gc_pause_total_ns
        uint64_t dataloader_count
        uint64_t dataloader_wait_total_ns
        uint64_t gemm_untimed
        uint64_t nccl_untimed
        uint64_t dropped_records
        uint64_t slot_overflow
        uint64_t nccl_channel_shortfall
        uint64_t nccl_late_channels

    ctypedef struct tp_header:
        uint64_t magic
        uint32_t layout_version
        uint32_t header_size
        uint64_t segment_size
        uint32_t flags
        int32_t pid
        int32_t rank
        int32_t local_rank
        int32_t world_size
        char job_id[TP_JOB_ID_LEN]
        char hostname[TP_HOSTNAME_LEN]
        uint64_t start_ns
        uint64_t heartbeat_ns
        uint64_t writer_seq
        uint32_t slots_used
        int32_t fatal_signal
        uint64_t ring_head
        tp_counters counters
        int32_t exit_status
        uint32_t gemm_timed_first
        uint32_t gemm_sample_every
        uint32_t gemm_sample_max
        uint64_t data_seq
        uint32_t nccl_profiler_api
        char nccl_chain[TP_NCCL_CHAIN_LEN]

    ctypedef struct tp_copy_stats:
        uint64_t calls
        uint64_t bytes
        uint64_t timed_calls
        uint64_t timed_ns
        uint64_t weighted_calls
        uint64_t weighted_ns
        uint64_t untimed

    ctypedef struct tp_alloc_stats:
        uint64_t malloc_calls
        uint64_t malloc_bytes
        uint64_t free_calls
        uint64_t free_bytes
        uint64_t free_unknown

    ctypedef struct tp_device_memory:
        uint64_t seq
        tp_alloc_stats malloc
        tp_alloc_stats malloc_async
        tp_copy_stats copies[TP_COPY_DIRECTIONS_N]
        uint32_t allocator_state
        uint64_t allocator_read_ns
        uint64_t allocated_bytes
        uint64_t reserved_bytes
        uint64_t peak_allocated_bytes
        uint64_t alloc_retries
        uint64_t ooms

    ctypedef struct tp_slot:
        uint64_t seq
        uint32_t kind
        uint32_t nranks
        char op[TP_NAME_LEN]
        char dtype[TP_DTYPE_LEN]
        char algo[TP_ALGO_LEN]
        char proto[TP_PROTO_LEN]
        int64_t b, m, n, k
        uint64_t comm_hash
        uint64_t count
        uint64_t timed_count
        uint64_t total_ns, min_ns, max_ns
        uint64_t min_at_timed, max_at_timed
        uint64_t first_ns
        uint64_t bytes
        uint64_t flops
        uint64_t timed_bytes
        uint64_t timed_flops
        uint64_t weighted_timed_count
        uint64_t weighted_total_ns
        uint64_t weighted_timed_bytes
        uint64_t weighted_timed_flops
        uint64_t hist[TP_HIST_BUCKETS_N]
        uint32_t sample_every
        uint32_t fine_octave
        uint32_t fine_anchors
        uint32_t fine[TP_FINE_BUCKETS_N]

    ctypedef struct tp_inflight:
        uint64_t seq
        uint32_t kind
        uint32_t pending
        char op[TP_NAME_LEN]
        uint64_t key
        uint64_t op_seq
        uint64_t launched_ns

    ctypedef struct tp_event:
        uint64_t seq
        uint32_t kind
        int32_t rank
        char op[TP_NAME_LEN]
        char dtype[TP_DTYPE_LEN]
        uint64_t start_ns, end_ns
        uint64_t bytes
        uint64_t flops
        uint64_t op_seq
        uint64_t comm_hash
        int64_t b, m, n, k
        uint32_t flags
        uint64_t stream

    ctypedef struct tp_segment:
        tp_header header


cdef extern from *:
    """
    #include <stddef.h>
    #define TP_OFF_COUNTERS offsetof(tp_header, counters)
    #define TP_OFF_DEVICE_MEMORY offsetof(tp_segment, device_memory)
    #define TP_OFF_SLOTS offsetof(tp_segment, slots)
    #define TP_OFF_INFLIGHT offsetof(tp_segment, inflight)
    #define TP_OFF_RING offsetof(tp_segment, ring)
    """
    size_t TP_OFF_COUNTERS
    size_t TP_OFF_DEVICE_MEMORY
    size_t TP_OFF_SLOTS
    size_t TP_OFF_INFLIGHT
    size_t TP_OFF_RING


SEGMENT_DIR = TP_SEGMENT_DIR.decode()
SEGMENT_PREFIX = TP_SEGMENT_PREFIX.decode()
EXCEPTION_SUFFIX = TP_EXCEPTION_SUFFIX.decode()
FLIGHT_SUFFIX = TP_FLIGHT_SUFFIX.decode()
INERT_SUFFIX = TP_INERT_SUFFIX.decode()
LAYOUT_VERSION = TP_LAYOUT_VERSION
# The earlier layout still read: the same but for the header's data_seq (Pulse.data_seq is None).
LAYOUT_VERSION_NO_DATA_SEQ = TP_LAYOUT_VERSION_NO_DATA_SEQ
SEGMENT_SIZE = sizeof(tp_segment)
HEADER_SIZE = sizeof(tp_header)
SLOTS_OFFSET = TP_OFF_SLOTS  # where the slot table starts (after the header and the device memory block)
HIST_BUCKETS = TP_HIST_BUCKETS
FINE_OCTAVES = TP_FINE_OCTAVES
FINE_SUB_BITS = TP_FINE_SUB_BITS
RING_CAPACITY = TP_RING_CAPACITY
KINDS = {TP_KIND_NONE: "none", TP_KIND_GEMM: "gemm", TP_KIND_NCCL: "nccl", TP_KIND_STEP: "step",
         TP_KIND_GC: "gc", TP_KIND_DATALOADER: "dataloader", TP_KIND_MEMCPY: "memcpy"}
# A copy's direction by its cudaMemcpyKind (tp_device_memory.copies' index).
COPY_DIRECTIONS = {TP_COPY_HOST_TO_HOST: "host_to_host", TP_COPY_HOST_TO_DEVICE: "host_to_device",
                   TP_COPY_DEVICE_TO_HOST: "device_to_host", TP_COPY_DEVICE_TO_DEVICE: "device_to_device",
                   TP_COPY_DEFAULT: "default"}
COPY_TIMED_FIRST = TP_COPY_TIMED_FIRST
COPY_SAMPLE_EVERY = TP_COPY_SAMPLE_EVERY
ALLOCATOR_NONE = TP_ALLOCATOR_NONE
ALLOCATOR_READ = TP_ALLOCATOR_READ
ALLOCATOR_NO_CUDA = TP_ALLOCATOR_NO_CUDA
ALLOCATOR_UNINITIALIZED = TP_ALLOCATOR_UNINITIALIZED
FLAG_CUDA_TIMING = TP_FLAG_CUDA_TIMING
FLAG_NCCL_PLUGIN = TP_FLAG_NCCL_PLUGIN
FLAG_NCCL_GPU_TIME = TP_FLAG_NCCL_GPU_TIME
FLAG_EXITED = TP_FLAG_EXITED
FLAG_EXIT_STATUS = TP_FLAG_EXIT_STATUS
FLAG_NCCL_API = TP_FLAG_NCCL_API
FLAG_NCCL_API_EVENTS = TP_FLAG_NCCL_API_EVENTS
FLAG_LOCKED = TP_FLAG_LOCKED
# Real uids are below 2^32 - 1 ((uid_t)-1 means "none"); Linux pids never exceed PID_MAX_LIMIT (2^22).
MAX_UID = 0xFFFFFFFE
PID_MAX_LIMIT = 1 << 22
STEM_RANDOM_DIGITS = TP_STEM_RANDOM_DIGITS
# tuiprof-<uid>-<pid>-<random>[.inert]: at most 10 digits each, so a hostile name cannot make a huge
# int; the random part is the hook's (lowercase hex), unknown to anyone before the file exists. A name
# without it is what hooks before it wrote (same layout): still a claim, judged the same way.
SEGMENT_NAME = re.compile(
    rf"^{re.escape(SEGMENT_PREFIX)}([0-9]{{1,10}})-([0-9]{{1,10}})(?:-[0-9a-f]{{{STEM_RANDOM_DIGITS}}})?"
    rf"({re.escape(INERT_SUFFIX)})?$")

# A writer updates a record in nanoseconds, but it may be preempted mid-update: a few
# yields, then short sleeps, well under 1 ms in all before a record is declared busy
# (the caller reads again next interval). Kept short: a hostile segment whose counter
# stays odd costs this much per read, no more.
DEF _YIELD_TRIES = 8
DEF _READ_TRIES = 16
DEF _BACKOFF_NS = 50000

cdef enum RecordState:
    PENDING = 0
    DONE = 1
    SKIPPED = 2       # a ring entry overwritten (or never written): not among the last N

cdef enum ReadResult:
    READ_OK = 0
    READ_BUSY = 1     # records still torn after every try
    READ_ERROR = -1   # pread failed (errno)
    READ_SHORT = -2   # end of file before the range: truncated under the reader


class SegmentError(OSError):
    """A segment could not be read; the message names the file."""


class SegmentFormatError(SegmentError):
    """Not a tuiprof segment of this layout: foreign, truncated (also while being read),
    another version, or not a regular file. Corrupt; reading it again will not help."""


class SegmentNotReadyError(SegmentError):
    """The writer has not finished creating the segment yet; read it again shortly."""


class SegmentBusyError(SegmentError):
    """A record stayed mid-update through every try: a writer killed while writing it
    (the counter stays odd), or one rewriting it without pause. Try again next time."""


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
    fatal_signal: int | None  # the last fatal signal the process received (see the layout header)
    exit_status: int | None   # what the process passed to exit(), when it got that far
    # GEMM timing sampling: every call of a shape timed until this many, then one in gemm_sample_every;
    # with gemm_sample_max (not 0) a period per shape from its kernel time, up to gemm_sample_max
    gemm_timed_first: int = 0
    gemm_sample_every: int = 1
    gemm_sample_max: int = 0
    # ncclProfiler_vN NCCL initialised the hook with (0: none), and what became of a profiler plugin the
    # user had named ("chains to ... (ncclProfiler_vN)", "not chained to ...: why", "" when none)
    nccl_profiler_api: int = 0
    nccl_chain: str = ""


cdef class Pulse:
    """What the header says every interval, read in one go without its counters: the pid it
    claims, the writer's last heartbeat and ``data_seq``, which the writer bumps after a pass that
    changed any figure (None for a layout without it: every reading may hold changes)."""

    cdef readonly int pid
    cdef readonly object heartbeat_ns
    cdef readonly object data_seq

    def __repr__(self):
        return f"Pulse(pid={self.pid}, heartbeat_ns={self.heartbeat_ns}, data_seq={self.data_seq})"


@dataclass(frozen=True)
class AllocStats:
    """One CUDA runtime allocator API's calls that succeeded (tuiprof_segment.h, tp_alloc_stats)."""
    malloc_calls: int
    malloc_bytes: int
    free_calls: int
    free_bytes: int
    free_unknown: int  # frees of pointers the hook did not see allocated: their bytes are not in free_bytes


@dataclass(frozen=True)
class CopyStats:
    """The copies of one direction (tp_copy_stats): exact counts, sampled timing."""
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
    """CUDA allocations and copies the hook counted, and PyTorch's caching allocator figures as the
    startup hook last published them (``allocator_state`` one of ALLOCATOR_*; the figures mean
    something only with ALLOCATOR_READ)."""
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
    # timed_count right after the call that set min_ns / max_ns (None when nothing was timed)
    min_at_timed: int | None
    max_at_timed: int | None
    # a GEMM slot's first call, kept out of the timed figures: it includes lazy module loading
    first_call_ns: int | None
    bytes: int
    flops: int
    timed_bytes: int
    timed_flops: int
    # the timed calls weighted by the calls each stands for (sampling): estimates of all calls
    weighted_timed_count: int
    weighted_total_ns: int
    weighted_timed_bytes: int
    weighted_timed_flops: int
    hist: tuple[int, ...]
    # GEMM: the sampling period of its latest call due for timing after the first ones; 0: none yet
    sample_every: int = 0
    # The fine window (tuiprof_segment.h): its lowest octave (0: none yet), how often the writer placed
    # it (readings with different counts do not subtract), and its counts from sub-bucket fine_start to
    # the last non-zero one, as native uint32 that wrap (subtract modulo 2^32); those outside are zero.
    # Bytes of the span, not ints of the whole window: a slot is read every interval, and kept.
    fine_octave: int = 0
    fine_anchors: int = 0
    fine_start: int = 0
    fine: builtins.bytes = b""


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
    first_call: bool = False  # a GEMM slot's first call: includes lazy module loading, not kernel time
    stream: int = 0  # GEMM: the CUDA stream it ran on


@dataclass(frozen=True)
class SegmentFile:
    path: str
    uid: int
    pid: int


def parse_name(name: str):
    """``(uid, pid, inert)`` of a segment name (``tuiprof-<uid>-<pid>-<random>``, or an earlier hook's
    ``tuiprof-<uid>-<pid>``) or an inert-hook note (the same with ``.inert``), None for any other name
    or numbers out of range."""
    match = SEGMENT_NAME.match(name)
    if match is None:
        return None
    uid, pid = int(match.group(1)), int(match.group(2))
    if uid > MAX_UID or not 0 < pid <= PID_MAX_LIMIT:
        return None
    return uid, pid, match.group(3) is not None


def discover(directory: str = SEGMENT_DIR) -> list:
    """Every file named like a segment in ``directory`` (any uid), by pid. A name is a claim:
    ``agentd.collectors.ranks`` checks it against the kernel before it believes it."""
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        parsed = parse_name(name)
        if parsed is not None and not parsed[2]:
            found.append(SegmentFile(os.path.join(directory, name), parsed[0], parsed[1]))
    found.sort(key=lambda f: f.pid)
    return found


cdef str _text(const char *p, size_t cap):
    return p[:strnlen(p, cap)].decode("utf-8", "replace")


cdef object _opt_rank(int32_t v):
    return None if v < 0 else v


cdef str _kind(uint32_t code):
    return KINDS.get(code, str(code))


cdef ssize_t _pread_full(int fd, char *buf, size_t size, size_t offset) noexcept nogil:
    """Bytes read into ``buf`` (fewer than ``size`` at end of file), -1 on error."""
    cdef size_t got = 0
    cdef ssize_t n
    while got < size:
        n = c_pread(fd, buf + got, size - got, <off_t>(offset + got))
        if n < 0:
            if errno == EINTR:
                continue
            return -1
        if n == 0:
            break
        got += <size_t>n
    return <ssize_t>got


cdef void _back_off(int attempt) noexcept nogil:
    cdef timespec pause
    if attempt < _YIELD_TRIES:
        sched_yield()
    else:
        pause.tv_sec = 0
        pause.tv_nsec = _BACKOFF_NS
        nanosleep(&pause, NULL)


cdef inline uint64_t _seq_at(const char *records, size_t size, size_t i) noexcept nogil:
    cdef uint64_t seq
    memcpy(&seq, records + i * size, sizeof(uint64_t))
    return seq


cdef ReadResult _read_records(int fd, size_t base, size_t size, size_t count, char *out, char *state,
                              bint ring, uint64_t first_index) noexcept nogil:
    """Copy ``count`` records of ``size`` bytes (sequence counter first) from file offset
    ``base`` into ``out``, each one consistent under its seqlock; ``state[i]`` says which.

    Three reads per try: the counters, the records, the counters again. A record whose
    counter was even and unchanged around the copy (and equal in the copy) is consistent,
    as the writer makes the counter odd before it touches the record. Ring entries must
    also carry the counter of the event they should hold (``2 * index + 2``); another one
    means the entry was overwritten or never written, and it is skipped. Each retry
    covers only the records still torn."""
    cdef size_t span = count * size
    cdef char *scratch = <char *>malloc(span if span else 1)
    cdef uint64_t *before = <uint64_t *>malloc((count if count else 1) * sizeof(uint64_t))
    cdef size_t lo = 0, hi = count, i, length
    cdef uint64_t seq
    cdef ssize_t got
    cdef int attempt
    cdef ReadResult result = READ_BUSY
    if scratch == NULL or before == NULL:
        free(scratch)
        free(before)
        return READ_ERROR
    for i in range(count):
        state[i] = PENDING
    for attempt in range(_READ_TRIES):
        if lo >= hi:
            result = READ_OK
            break
        if attempt:
            _back_off(attempt)
        length = (hi - lo) * size
        got = _pread_full(fd, scratch, length, base + lo * size)
        if got == <ssize_t>length:
            for i in range(lo, hi):
                before[i] = _seq_at(scratch, size, i - lo)
            got = _pread_full(fd, out + lo * size, length, base + lo * size)
        if got == <ssize_t>length:
            got = _pread_full(fd, scratch, length, base + lo * size)
        if got != <ssize_t>length:
            result = READ_ERROR if got < 0 else READ_SHORT
            break
        for i in range(lo, hi):
            if state[i] != PENDING:
                continue
            seq = before[i]
            if seq & 1 or seq != _seq_at(scratch, size, i - lo) or seq != _seq_at(out, size, i):
                continue  # torn: the writer was at work on it
            if ring and seq != 2 * (first_index + i) + 2:
                state[i] = SKIPPED
            else:
                state[i] = DONE
        while lo < hi and state[lo] != PENDING:
            lo += 1
        while hi > lo and state[hi - 1] != PENDING:
            hi -= 1
    else:
        result = READ_OK if lo >= hi else READ_BUSY
    free(scratch)
    free(before)
    return result


cdef class Segment:
    """One rank's segment, held open (never mapped) until ``close()``; every call reads afresh."""

    cdef int fd
    cdef readonly str path
    cdef readonly object owner_uid  # the file's owner, as the kernel reports it
    cdef readonly object device
    cdef readonly object inode
    cdef readonly bint tells_changes  # its header has data_seq (layout 10 on)

    def __cinit__(self, path):
        self.fd = -1
        self.path = os.fspath(path)
        cdef bytes encoded = os.fsencode(self.path)
        cdef const char *c_path = encoded
        cdef int fd
        cdef int err = 0
        cdef struct_stat st
        with nogil:
            fd = c_open(c_path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            if fd < 0:
                err = errno
            elif c_fstat(fd, &st) != 0:
                err = errno
                c_close(fd)
                fd = -1
        if fd < 0:
            if err == ELOOP:
                raise SegmentFormatError(f"{self.path} is a symbolic link, not a segment: not followed")
            raise SegmentError(f"cannot open segment {self.path}: {os.strerror(err)}")
        self.fd = fd
        self.owner_uid = st.st_uid
        self.device = st.st_dev
        self.inode = st.st_ino
        try:
            self._validate(st)
        except BaseException:
            self.close()
            raise

    cdef _validate(self, struct_stat st):
        if not S_ISREG(st.st_mode):
            raise SegmentFormatError(f"{self.path} is not a regular file (a FIFO, socket or directory "
                                     "under a segment's name): not a segment")
        if <size_t>st.st_size < sizeof(tp_header):
            raise SegmentFormatError(
                f"{self.path} is {st.st_size} bytes, smaller than a tuiprof segment header "
                f"({sizeof(tp_header)} bytes): truncated or not a segment; delete it if its process is gone")
        cdef tp_header h
        self._read_plain_header(&h, False)
        if h.magic == 0:
            raise SegmentNotReadyError(f"{self.path}: the writer has not finished creating this segment yet")
        if h.magic != TP_MAGIC:
            raise SegmentFormatError(
                f"{self.path} is not a tuiprof segment (magic {h.magic:#018x}, expected {TP_MAGIC:#018x})")
        if h.layout_version not in (TP_LAYOUT_VERSION, TP_LAYOUT_VERSION_NO_DATA_SEQ):
            raise SegmentFormatError(
                f"{self.path} has layout version {h.layout_version}, this reader understands "
                f"{TP_LAYOUT_VERSION_NO_DATA_SEQ} and {TP_LAYOUT_VERSION}: run an agent built from the same "
                "tuiprof as the training job")
        self.tells_changes = h.layout_version != TP_LAYOUT_VERSION_NO_DATA_SEQ
        if h.header_size != sizeof(tp_header) or h.segment_size != sizeof(tp_segment):
            raise SegmentFormatError(
                f"{self.path} declares header/segment sizes {h.header_size}/{h.segment_size}, expected "
                f"{sizeof(tp_header)}/{sizeof(tp_segment)}: written by an incompatible build")
        if <size_t>st.st_size != sizeof(tp_segment):
            what = "truncated" if <size_t>st.st_size < sizeof(tp_segment) else "not a segment of this layout"
            raise SegmentFormatError(
                f"{self.path} is {st.st_size} bytes but a segment is {sizeof(tp_segment)}: {what}")

    def close(self) -> None:
        if self.fd >= 0:
            c_close(self.fd)
            self.fd = -1

    def __dealloc__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    cdef _check_open(self):
        if self.fd < 0:
            raise SegmentError(f"segment {self.path} is closed")

    cdef _truncated(self, str what):
        return SegmentFormatError(f"{self.path} was truncated while its {what} was read: no longer a segment")

    cdef _raise_for(self, ReadResult result, str what):
        if result == READ_SHORT:
            raise self._truncated(what)
        if result == READ_ERROR:
            raise SegmentError(f"cannot read the {what} of segment {self.path}: {os.strerror(errno)}")
        if result == READ_BUSY:
            raise SegmentBusyError(
                f"{self.path}: the {what} stayed mid-update through every read (its writer died while "
                "writing it, or never pauses); read it again later")

    cdef _read_plain_header(self, tp_header *h, bint check_size=True):
        """The header's words as they are now (the counters in it are not yet checked), after
        checking the file still has a segment's size (it may be truncated at any time)."""
        self._check_open()
        cdef ssize_t got = -1
        cdef struct_stat st
        with nogil:
            if c_fstat(self.fd, &st) == 0:
                got = _pread_full(self.fd, <char *>h, sizeof(tp_header), 0)
        if got < 0:
            raise SegmentError(f"cannot read segment {self.path}: {os.strerror(errno)}")
        if <size_t>got != sizeof(tp_header) or check_size and <size_t>st.st_size != sizeof(tp_segment):
            raise SegmentFormatError(
                f"{self.path} is {st.st_size} bytes now but a segment is {sizeof(tp_segment)}: truncated "
                "(or extended) under the reader, no longer a segment")

    cdef _read_array(self, size_t base, size_t size, size_t count, char *out, char *state, bint ring,
                     uint64_t first_index, str what):
        cdef ReadResult result
        with nogil:
            result = _read_records(self.fd, base, size, count, out, state, ring, first_index)
        if result != READ_OK and not (ring and result == READ_BUSY):
            self._raise_for(result, what)

    def header(self) -> Header:
        """Identity, heartbeat and counters (the counters read consistently)."""
        cdef tp_header h
        cdef tp_counters c
        cdef char state
        self._read_plain_header(&h)
        self._read_array(TP_OFF_COUNTERS, sizeof(tp_counters), 1, <char *>&c, &state, False, 0, "counters")
        counters = Counters(c.step_count, c.step_time_total_ns, c.last_step_ns, c.last_step_time_ns,
                            c.gc_count, c.gc_pause_total_ns, c.dataloader_count, c.dataloader_wait_total_ns,
                            c.gemm_untimed, c.nccl_untimed, c.dropped_records, c.slot_overflow,
                            c.nccl_channel_shortfall, c.nccl_late_channels)
        return Header(h.layout_version, h.pid, _opt_rank(h.rank), _opt_rank(h.local_rank),
                      _opt_rank(h.world_size), _text(h.job_id, sizeof(h.job_id)),
                      _text(h.hostname, sizeof(h.hostname)), h.start_ns, h.heartbeat_ns, h.writer_seq, h.flags,
                      h.slots_used, h.ring_head, counters, h.fatal_signal or None,
                      h.exit_status if h.flags & TP_FLAG_EXIT_STATUS else None, h.gemm_timed_first,
                      h.gemm_sample_every, h.gemm_sample_max, h.nccl_profiler_api,
                      _text(h.nccl_chain, sizeof(h.nccl_chain)) if h.nccl_profiler_api else "")

    def device_memory(self) -> DeviceMemory:
        """CUDA allocations and copies, and PyTorch's allocator figures (read consistently)."""
        self._check_open()
        cdef tp_device_memory m
        cdef char state
        self._read_array(TP_OFF_DEVICE_MEMORY, sizeof(tp_device_memory), 1, <char *>&m, &state, False, 0,
                         "device memory counters")
        return DeviceMemory(_alloc(&m.malloc), _alloc(&m.malloc_async),
                            tuple(_copies(&m.copies[d], d) for d in range(TP_COPY_DIRECTIONS)),
                            m.allocator_state, m.allocator_read_ns, m.allocated_bytes, m.reserved_bytes,
                            m.peak_allocated_bytes, m.alloc_retries, m.ooms)

    def claimant(self) -> tuple:
        """``(pid, start_ns)``: the process the header says made the segment, and when. Plain
        words, written before the magic: readable even when the counters are mid-update."""
        cdef tp_header h
        self._read_plain_header(&h)
        return h.pid, h.start_ns

    def heartbeat_ns(self) -> int:
        cdef tp_header h
        self._read_plain_header(&h)
        return h.heartbeat_ns

    def pulse(self) -> Pulse:
        """The header's pid, heartbeat and data_seq: plain words, never mid-update (no seqlock).
        Read before the figures it vouches for, so a change made since shows in a later pulse."""
        cdef tp_header h
        self._read_plain_header(&h)
        cdef Pulse pulse = Pulse.__new__(Pulse)
        pulse.pid = h.pid
        pulse.heartbeat_ns = h.heartbeat_ns
        pulse.data_seq = h.data_seq if self.tells_changes else None
        return pulse

    def slots(self) -> list:
        """Every aggregate slot in use, in creation order (overflow slot last, if used)."""
        cdef tp_header h
        self._read_plain_header(&h)
        cdef uint32_t used = min(h.slots_used, TP_MAX_SLOTS - 1)
        # the slots in use and the overflow slot (the last), in one read of each
        cdef tp_slot *buf = <tp_slot *>malloc((used + 1) * sizeof(tp_slot))
        cdef char *state = <char *>malloc(used + 1)
        if buf == NULL or state == NULL:
            free(buf)
            free(state)
            raise MemoryError()
        try:
            self._read_array(TP_OFF_SLOTS, sizeof(tp_slot), used, <char *>buf, state, False, 0, "slots")
            self._read_array(TP_OFF_SLOTS + (TP_MAX_SLOTS - 1) * sizeof(tp_slot), sizeof(tp_slot), 1,
                             <char *>&buf[used], &state[used], False, 0, "overflow slot")
            return [_slot(&buf[i]) for i in range(used + 1) if i < used or buf[i].kind != TP_KIND_NONE]
        finally:
            free(buf)
            free(state)

    def inflight(self) -> list:
        """Oldest unfinished op per stream / communicator."""
        self._check_open()
        cdef tp_inflight *buf = <tp_inflight *>malloc(TP_MAX_INFLIGHT * sizeof(tp_inflight))
        cdef char *state = <char *>malloc(TP_MAX_INFLIGHT)
        if buf == NULL or state == NULL:
            free(buf)
            free(state)
            raise MemoryError()
        try:
            self._read_array(TP_OFF_INFLIGHT, sizeof(tp_inflight), TP_MAX_INFLIGHT, <char *>buf, state, False, 0,
                             "in-flight table")
            return [Inflight(_kind(buf[i].kind), _text(buf[i].op, sizeof(buf[i].op)), buf[i].key, buf[i].op_seq,
                             buf[i].launched_ns, buf[i].pending)
                    for i in range(TP_MAX_INFLIGHT) if buf[i].kind != TP_KIND_NONE]
        finally:
            free(buf)
            free(state)

    def events(self, since: int = 0, kind: str | None = None) -> list:
        """Ring events with index >= ``since`` still in the ring, oldest first,
        of one ``kind`` ("gemm", "nccl", "step", ...) or all.

        Entries the writer overwrites while they are read, or leaves mid-update, are
        skipped (they are no longer among the last N)."""
        cdef uint32_t want = 0
        if kind is not None:
            codes = {name: code for code, name in KINDS.items()}
            if kind not in codes:
                raise ValueError(f"unknown event kind {kind!r}; one of {sorted(codes)}")
            want = codes[kind]
        cdef tp_header h
        self._read_plain_header(&h)
        cdef uint64_t head = h.ring_head
        cdef uint64_t first = head - TP_RING_CAPACITY if head > TP_RING_CAPACITY else 0
        if since > first:
            first = min(since, head)
        cdef size_t count = <size_t>(head - first)
        cdef tp_event *buf = <tp_event *>malloc((count if count else 1) * sizeof(tp_event))
        cdef char *state = <char *>malloc(count if count else 1)
        cdef size_t start_slot, chunk, done = 0
        if buf == NULL or state == NULL:
            free(buf)
            free(state)
            raise MemoryError()
        try:
            while done < count:  # the range wraps around the ring's end at most once
                start_slot = <size_t>((first + done) % TP_RING_CAPACITY)
                chunk = min(count - done, TP_RING_CAPACITY - start_slot)
                self._read_array(TP_OFF_RING + start_slot * sizeof(tp_event), sizeof(tp_event), chunk,
                                 <char *>&buf[done], &state[done], True, first + done, "event ring")
                done += chunk
            return [_event(&buf[i], first + i) for i in range(count)
                    if state[i] == DONE and (want == 0 or buf[i].kind == want)]
        finally:
            free(buf)
            free(state)


cdef object _alloc(const tp_alloc_stats *a):
    return AllocStats(a.malloc_calls, a.malloc_bytes, a.free_calls, a.free_bytes, a.free_unknown)


cdef object _copies(const tp_copy_stats *c, uint32_t direction):
    return CopyStats(COPY_DIRECTIONS[direction], c.calls, c.bytes, c.timed_calls, c.timed_ns, c.weighted_calls,
                     c.weighted_ns, c.untimed)


cdef object _slot(const tp_slot *s):
    cdef uint32_t start = 0, end = TP_FINE_BUCKETS_N
    while start < end and s.fine[start] == 0:
        start += 1
    while end > start and s.fine[end - 1] == 0:
        end -= 1
    return Slot(_kind(s.kind), _text(s.op, sizeof(s.op)), _text(s.dtype, sizeof(s.dtype)),
                _text(s.algo, sizeof(s.algo)), _text(s.proto, sizeof(s.proto)), s.nranks, s.b, s.m, s.n, s.k,
                s.comm_hash, s.count, s.timed_count, s.total_ns,
                s.min_ns if s.timed_count else None, s.max_ns if s.timed_count else None,
                s.min_at_timed if s.timed_count else None, s.max_at_timed if s.timed_count else None,
                s.first_ns if s.first_ns else None,
                s.bytes, s.flops, s.timed_bytes, s.timed_flops,
                s.weighted_timed_count, s.weighted_total_ns, s.weighted_timed_bytes, s.weighted_timed_flops,
                tuple(s.hist[j] for j in range(TP_HIST_BUCKETS)), s.sample_every, s.fine_octave, s.fine_anchors,
                start if end > start else 0, (<const char *>&s.fine[start])[:(end - start) * sizeof(uint32_t)])


cdef object _event(const tp_event *e, uint64_t index):
    return Event(index, _kind(e.kind), _text(e.op, sizeof(e.op)), _text(e.dtype, sizeof(e.dtype)), e.rank,
                 e.start_ns, e.end_ns if e.end_ns else None, e.bytes, e.flops, e.op_seq, e.comm_hash,
                 e.b, e.m, e.n, e.k, bool(e.flags & TP_EVENT_FIRST_CALL), e.stream)
