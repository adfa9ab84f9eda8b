# cython: language_level=3
"""Reading ranks' telemetry segments (/dev/shm/tuiprof-<uid>-<pid>).

The layout is defined once, in ``include/tuiprof_segment.h``; this module
compiles against that header, so a layout change cannot leave the reader
behind silently. A segment is mapped read-only; the writer (the hook's
background thread in the training process) is never blocked: every record is
copied under its sequence counter and the copy retried when the writer was
mid-update.

A file that is not a segment of this layout — wrong magic, another layout
version, truncated — raises ``SegmentFormatError`` naming the path and what
to do; a segment whose writer has not finished creating it raises
``SegmentNotReadyError``. Both are ``SegmentError`` (an ``OSError``).
"""

import os
import re
from dataclasses import dataclass

from libc.errno cimport errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

cdef extern from "<string.h>":
    size_t strnlen(const char *s, size_t maxlen)
from posix.fcntl cimport O_RDONLY, open as c_open
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, mmap, munmap
from posix.stat cimport fstat, struct_stat
from posix.unistd cimport close


cdef extern from "tuiprof_segment.h":
    uint64_t TP_MAGIC
    uint32_t TP_LAYOUT_VERSION
    uint32_t TP_MAX_SLOTS
    uint32_t TP_MAX_INFLIGHT
    uint32_t TP_RING_CAPACITY
    uint32_t TP_HIST_BUCKETS
    const char *TP_EXCEPTION_SUFFIX
    const char *TP_FLIGHT_SUFFIX
    uint32_t TP_FLAG_EXITED
    uint32_t TP_FLAG_EXIT_STATUS

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
        char job_id[64]
        char hostname[64]
        uint64_t start_ns
        uint64_t heartbeat_ns
        uint64_t writer_seq
        uint32_t slots_used
        int32_t fatal_signal
        uint64_t ring_head
        tp_counters counters
        int32_t exit_status

    ctypedef struct tp_slot:
        uint64_t seq
        uint32_t kind
        uint32_t nranks
        char op[32]
        char dtype[16]
        char algo[16]
        char proto[8]
        int64_t b, m, n, k
        uint64_t comm_hash
        uint64_t count
        uint64_t timed_count
        uint64_t total_ns, min_ns, max_ns
        uint64_t bytes
        uint64_t flops
        uint64_t timed_bytes
        uint64_t timed_flops
        uint64_t hist[40]

    ctypedef struct tp_inflight:
        uint64_t seq
        uint32_t kind
        uint32_t pending
        char op[32]
        uint64_t key
        uint64_t op_seq
        uint64_t launched_ns

    ctypedef struct tp_event:
        uint64_t seq
        uint32_t kind
        int32_t rank
        char op[32]
        char dtype[16]
        uint64_t start_ns, end_ns
        uint64_t bytes
        uint64_t flops
        uint64_t op_seq
        uint64_t comm_hash
        int64_t b, m, n, k

    ctypedef struct tp_segment:
        tp_header header
        tp_slot slots[512]
        tp_inflight inflight[128]
        tp_event ring[8192]

    int tp_read_record(const void *rec, void *out, uint64_t size, uint64_t expect, int tries) nogil


SEGMENT_DIR = "/dev/shm"
SEGMENT_NAME = re.compile(r"^tuiprof-(\d+)-(\d+)$")
LAYOUT_VERSION = TP_LAYOUT_VERSION
SEGMENT_SIZE = sizeof(tp_segment)
HIST_BUCKETS = TP_HIST_BUCKETS
RING_CAPACITY = TP_RING_CAPACITY
KINDS = {0: "none", 1: "gemm", 2: "nccl", 3: "step", 4: "gc", 5: "dataloader"}
FLAG_CUDA_TIMING = 1
FLAG_NCCL_PLUGIN = 2
FLAG_NCCL_GPU_TIME = 4
FLAG_EXITED = TP_FLAG_EXITED
FLAG_EXIT_STATUS = TP_FLAG_EXIT_STATUS
EXCEPTION_SUFFIX = TP_EXCEPTION_SUFFIX.decode()
FLIGHT_SUFFIX = TP_FLIGHT_SUFFIX.decode()
_READ_TRIES = 10000
_UNTIMED = 0xFFFFFFFFFFFFFFFF


class SegmentError(OSError):
    """A segment could not be read; the message names the file."""


class SegmentFormatError(SegmentError):
    """The file is not a tuiprof segment of this layout (foreign, truncated, other version)."""


class SegmentNotReadyError(SegmentError):
    """The writer has not finished creating the segment yet; read it again shortly."""


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
    bytes: int
    flops: int
    timed_bytes: int
    timed_flops: int
    hist: tuple[int, ...]


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


@dataclass(frozen=True)
class SegmentFile:
    path: str
    uid: int
    pid: int


def discover(directory: str = SEGMENT_DIR) -> list:
    """Every tuiprof segment file in ``directory`` (any uid), by pid."""
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        match = SEGMENT_NAME.match(name)
        if match:
            found.append(SegmentFile(os.path.join(directory, name), int(match.group(1)), int(match.group(2))))
    found.sort(key=lambda f: f.pid)
    return found


cdef str _text(const char *p, size_t cap):
    return p[:strnlen(p, cap)].decode("utf-8", "replace")


cdef object _opt_rank(int32_t v):
    return None if v < 0 else v


cdef class Segment:
    """One rank's segment, mapped read-only until ``close()``."""

    cdef const tp_segment *seg
    cdef size_t _mapped
    cdef readonly str path

    def __cinit__(self, path):
        self.seg = NULL
        self.path = os.fspath(path)
        cdef bytes encoded = os.fsencode(self.path)
        cdef int fd = c_open(encoded, O_RDONLY)
        if fd < 0:
            raise SegmentError(f"cannot open segment {self.path}: {os.strerror(errno)}")
        cdef struct_stat st
        cdef void *p
        try:
            if fstat(fd, &st) != 0:
                raise SegmentError(f"cannot stat segment {self.path}: {os.strerror(errno)}")
            if <size_t>st.st_size < sizeof(tp_header):
                raise SegmentFormatError(
                    f"{self.path} is {st.st_size} bytes, smaller than a tuiprof segment header "
                    f"({sizeof(tp_header)} bytes): truncated or not a segment; delete it if its process is gone")
            p = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0)
            if p == MAP_FAILED:
                raise SegmentError(f"cannot map segment {self.path}: {os.strerror(errno)}")
        finally:
            close(fd)
        self.seg = <const tp_segment *>p
        self._mapped = <size_t>st.st_size
        try:
            self._validate(st.st_size)
        except BaseException:
            self.close()
            raise

    cdef _validate(self, size_t size):
        cdef const tp_header *h = &self.seg.header
        cdef uint64_t magic = h.magic
        if magic == 0:
            raise SegmentNotReadyError(f"{self.path}: the writer has not finished creating this segment yet")
        if magic != TP_MAGIC:
            raise SegmentFormatError(
                f"{self.path} is not a tuiprof segment (magic {magic:#018x}, expected {TP_MAGIC:#018x})")
        if h.layout_version != TP_LAYOUT_VERSION:
            raise SegmentFormatError(
                f"{self.path} has layout version {h.layout_version}, this reader understands "
                f"{TP_LAYOUT_VERSION}: run an agent built from the same tuiprof as the training job")
        if h.header_size != sizeof(tp_header) or h.segment_size != sizeof(tp_segment):
            raise SegmentFormatError(
                f"{self.path} declares header/segment sizes {h.header_size}/{h.segment_size}, expected "
                f"{sizeof(tp_header)}/{sizeof(tp_segment)}: written by an incompatible build")
        if size < sizeof(tp_segment):
            raise SegmentFormatError(
                f"{self.path} is {size} bytes but a segment is {sizeof(tp_segment)}: truncated")

    def close(self) -> None:
        if self.seg != NULL:
            munmap(<void *>self.seg, self._mapped)
            self.seg = NULL

    def __dealloc__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    cdef _check_open(self):
        if self.seg == NULL:
            raise SegmentError(f"segment {self.path} is closed")

    def header(self) -> Header:
        """Identity, heartbeat and counters (counters read consistently)."""
        self._check_open()
        cdef const tp_header *h = &self.seg.header
        cdef tp_counters c
        if tp_read_record(&h.counters, &c, sizeof(tp_counters), 0, _READ_TRIES) != 0:
            raise SegmentError(f"{self.path}: counters kept changing while read; try again")
        counters = Counters(c.step_count, c.step_time_total_ns, c.last_step_ns, c.last_step_time_ns,
                            c.gc_count, c.gc_pause_total_ns, c.dataloader_count, c.dataloader_wait_total_ns,
                            c.gemm_untimed, c.nccl_untimed, c.dropped_records, c.slot_overflow,
                            c.nccl_channel_shortfall, c.nccl_late_channels)
        return Header(h.layout_version, h.pid, _opt_rank(h.rank), _opt_rank(h.local_rank),
                      _opt_rank(h.world_size), _text(h.job_id, 64), _text(h.hostname, 64), h.start_ns,
                      h.heartbeat_ns, h.writer_seq, h.flags, h.slots_used, h.ring_head, counters,
                      h.fatal_signal or None, h.exit_status if h.flags & TP_FLAG_EXIT_STATUS else None)

    def heartbeat_ns(self) -> int:
        self._check_open()
        return self.seg.header.heartbeat_ns

    def slots(self) -> list:
        """Every aggregate slot in use, in creation order (overflow slot last, if used)."""
        self._check_open()
        cdef uint32_t used = min(self.seg.header.slots_used, TP_MAX_SLOTS - 1)
        cdef tp_slot s
        out = []
        indices = list(range(used))
        if self.seg.slots[TP_MAX_SLOTS - 1].kind != 0:
            indices.append(TP_MAX_SLOTS - 1)
        for i in indices:
            if tp_read_record(&self.seg.slots[i], &s, sizeof(tp_slot), 0, _READ_TRIES) != 0:
                raise SegmentError(f"{self.path}: slot {i} kept changing while read; try again")
            out.append(Slot(KINDS.get(s.kind, str(s.kind)), _text(s.op, 32), _text(s.dtype, 16),
                            _text(s.algo, 16), _text(s.proto, 8), s.nranks, s.b, s.m, s.n, s.k, s.comm_hash,
                            s.count, s.timed_count, s.total_ns,
                            s.min_ns if s.timed_count else None, s.max_ns if s.timed_count else None,
                            s.bytes, s.flops, s.timed_bytes, s.timed_flops,
                            tuple(s.hist[j] for j in range(TP_HIST_BUCKETS))))
        return out

    def inflight(self) -> list:
        """Oldest unfinished op per stream / communicator."""
        self._check_open()
        cdef tp_inflight e
        out = []
        for i in range(TP_MAX_INFLIGHT):
            if tp_read_record(&self.seg.inflight[i], &e, sizeof(tp_inflight), 0, _READ_TRIES) != 0:
                raise SegmentError(f"{self.path}: in-flight entry {i} kept changing while read; try again")
            if e.kind != 0:
                out.append(Inflight(KINDS.get(e.kind, str(e.kind)), _text(e.op, 32), e.key, e.op_seq,
                                    e.launched_ns, e.pending))
        return out

    def events(self, since: int = 0, kind: str | None = None) -> list:
        """Ring events with index >= ``since`` still in the ring, oldest first,
        of one ``kind`` ("gemm", "nccl", "step", ...) or all.

        Entries the writer overwrites while they are read are skipped (they
        are no longer among the last N)."""
        self._check_open()
        cdef uint64_t head = self.seg.header.ring_head
        cdef uint64_t first = head - TP_RING_CAPACITY if head > TP_RING_CAPACITY else 0
        cdef uint64_t i
        cdef tp_event e
        cdef int rc
        cdef uint32_t want = 0
        if kind is not None:
            codes = {name: code for code, name in KINDS.items()}
            if kind not in codes:
                raise ValueError(f"unknown event kind {kind!r}; one of {sorted(codes)}")
            want = codes[kind]
        if since > first:
            first = since
        out = []
        for i in range(first, head):
            rc = tp_read_record(&self.seg.ring[i % TP_RING_CAPACITY], &e, sizeof(tp_event), 2 * i + 2,
                                _READ_TRIES)
            if rc != 0 or (want and e.kind != want):
                continue
            out.append(Event(i, KINDS.get(e.kind, str(e.kind)), _text(e.op, 32), _text(e.dtype, 16), e.rank,
                             e.start_ns, e.end_ns if e.end_ns else None, e.bytes, e.flops, e.op_seq,
                             e.comm_hash, e.b, e.m, e.n, e.k))
        return out

