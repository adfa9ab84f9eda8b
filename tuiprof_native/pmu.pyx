# cython: language_level=3
"""CPU performance counters through perf_event_open(2).

A ``CounterGroup`` is one perf_event group (a leader and its members, scheduled
onto the PMU together) on one (pid, cpu) pair, read in one ``read()`` with
PERF_FORMAT_GROUP | TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING so that counts of a
multiplexed group can be scaled by enabled/running time. A ``CounterSet`` is the
same events counted by many groups -- one per online CPU (system-wide), or one
per thread of a process (with ``inherit`` so that threads and children created
later are counted too) -- and summed.

Rates are per interval: ``interval_counts(previous, current)`` scales each
group's *deltas* (Δcount x Δenabled / Δrunning) and divides by the wall time
between the two samples. dynolog's ``mips`` and ``mega_cycles_per_second`` are
since-start, per-CPU averages (its counters are never reset and it divides by
the summed running time); ours are what happened in the last interval, summed
over the CPUs (or threads) counted.

Hardware events (cycles, instructions, cache and branch misses) need a PMU,
which most VMs do not expose; software events (task clock, context switches,
page faults, CPU migrations) always work where perf_event exists. Failures are
``PerfEventError`` (an ``OSError``) whose message names the errno and the cause.
"""

import errno as _errno
import os
import time

from libc.errno cimport errno
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset
from posix.ioctl cimport ioctl
from posix.unistd cimport close, read


cdef extern from "<linux/perf_event.h>":
    cdef struct perf_event_attr:
        uint32_t type
        uint32_t size
        uint64_t config
        uint64_t read_format
        # bit fields in the kernel header; Cython only emits assignments to them
        unsigned int disabled
        unsigned int inherit
        unsigned int exclude_kernel
        unsigned int exclude_hv

    uint32_t PERF_TYPE_HARDWARE
    uint32_t PERF_TYPE_SOFTWARE
    uint64_t PERF_COUNT_HW_CPU_CYCLES
    uint64_t PERF_COUNT_HW_INSTRUCTIONS
    uint64_t PERF_COUNT_HW_CACHE_REFERENCES
    uint64_t PERF_COUNT_HW_CACHE_MISSES
    uint64_t PERF_COUNT_HW_BRANCH_MISSES
    uint64_t PERF_COUNT_SW_TASK_CLOCK
    uint64_t PERF_COUNT_SW_CONTEXT_SWITCHES
    uint64_t PERF_COUNT_SW_PAGE_FAULTS
    uint64_t PERF_COUNT_SW_CPU_MIGRATIONS
    uint64_t PERF_FORMAT_TOTAL_TIME_ENABLED
    uint64_t PERF_FORMAT_TOTAL_TIME_RUNNING
    uint64_t PERF_FORMAT_GROUP
    unsigned long PERF_EVENT_IOC_ENABLE
    unsigned long PERF_EVENT_IOC_RESET
    unsigned long PERF_IOC_FLAG_GROUP
    unsigned long PERF_FLAG_FD_CLOEXEC


cdef extern from "<sys/syscall.h>":
    long SYS_perf_event_open


cdef extern from "<unistd.h>":
    long syscall(long number, ...) nogil


cdef enum:
    MAX_GROUP_EVENTS = 13

HARDWARE_EVENTS = ("cycles", "instructions", "cache_references", "cache_misses", "branch_misses")
SOFTWARE_EVENTS = ("task_clock", "context_switches", "page_faults", "cpu_migrations")

cdef dict _EVENT_CODES = {
    "cycles": (PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES),
    "instructions": (PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS),
    "cache_references": (PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_REFERENCES),
    "cache_misses": (PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES),
    "branch_misses": (PERF_TYPE_HARDWARE, PERF_COUNT_HW_BRANCH_MISSES),
    "task_clock": (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK),
    "context_switches": (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES),
    "page_faults": (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS),
    "cpu_migrations": (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_MIGRATIONS),
}

PARANOID_PATH = "/proc/sys/kernel/perf_event_paranoid"


def paranoid_level():
    """The kernel's perf_event_paranoid level, or None when perf_event is absent."""
    try:
        with open(PARANOID_PATH) as handle:
            return int(handle.read().strip())
    except FileNotFoundError:
        return None


def explain_errno(int err, str event, int pid, int cpu):
    """Why perf_event_open failed with ``err``, in words an operator can act on."""
    name = _errno.errorcode.get(err, str(err))
    scope = f"system-wide on CPU {cpu}" if pid == -1 else f"for process {pid}"
    if err in (_errno.ENOENT, _errno.EOPNOTSUPP, _errno.ENODEV):
        return (f"{name}: no PMU here supports '{event}' (usual in a VM without a virtual PMU; "
                "/sys/bus/event_source/devices has no 'cpu')")
    if err in (_errno.EACCES, _errno.EPERM):
        return (f"{name}: not permitted to count '{event}' {scope}: perf_event_paranoid is "
                f"{paranoid_level()} and this process lacks CAP_PERFMON (system-wide counting needs "
                "paranoid <= 0, per-process kernel-mode counting <= 1)")
    if err == _errno.ESRCH:
        return f"{name}: process {pid} does not exist"
    if err in (_errno.EMFILE, _errno.ENFILE):
        return f"{name}: out of file descriptors while opening '{event}'; raise RLIMIT_NOFILE (one per event per CPU or thread)"
    if err == _errno.EINVAL:
        return f"{name}: the kernel rejected '{event}' {scope} (bad config, or more events in the group than counters)"
    return f"{name}: {os.strerror(err)} (opening '{event}' {scope})"


class PerfEventError(OSError):
    """perf_event_open (or a read of a counter) failed; the message says why."""

    def __init__(self, int err, str event, int pid, int cpu):
        super().__init__(err, explain_errno(err, event, pid, cpu))
        self.event = event
        self.pid = pid
        self.cpu = cpu


cdef class GroupReading:
    """One read of a group: the raw counts and how long it was enabled / on the PMU."""

    cdef readonly uint64_t time_enabled_ns
    cdef readonly uint64_t time_running_ns
    cdef readonly tuple values

    def __init__(self, uint64_t time_enabled_ns, uint64_t time_running_ns, tuple values):
        self.time_enabled_ns = time_enabled_ns
        self.time_running_ns = time_running_ns
        self.values = values

    def __repr__(self):
        return f"GroupReading(enabled={self.time_enabled_ns}, running={self.time_running_ns}, values={self.values})"


cdef int _open_event(str event, int pid, int cpu, int group_fd, bint leader, bint inherit,
                     bint exclude_kernel) except -2:
    cdef perf_event_attr attr
    memset(&attr, 0, sizeof(attr))
    kind, config = _EVENT_CODES[event]
    attr.type = kind
    attr.size = sizeof(attr)
    attr.config = config
    attr.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_GROUP
    attr.disabled = 1 if leader else 0
    attr.inherit = 1 if inherit else 0
    attr.exclude_kernel = 1 if exclude_kernel else 0
    attr.exclude_hv = 1
    cdef long fd = syscall(SYS_perf_event_open, &attr, pid, cpu, group_fd, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        return -1
    return <int>fd


cdef class CounterGroup:
    """A perf_event group counting ``events`` for ``pid`` on ``cpu`` (-1 = any)."""

    cdef list _fds
    cdef readonly tuple events
    cdef readonly int pid
    cdef readonly int cpu
    cdef readonly bint inherit
    cdef readonly bint exclude_kernel
    cdef uint64_t _last[3 + MAX_GROUP_EVENTS]  # the last read's buffer (``moved`` compares with it)
    cdef long _last_size  # its bytes; 0 before the first read

    def __cinit__(self):
        self._fds = []
        self._last_size = 0

    def __init__(self, events, int pid=-1, int cpu=-1, bint inherit=False, bint exclude_kernel=False):
        self.events = tuple(events)
        unknown = [event for event in self.events if event not in _EVENT_CODES]
        if unknown or not self.events:
            raise ValueError(f"unknown perf events {unknown or '(none given)'}; known: {sorted(_EVENT_CODES)}")
        if len(self.events) > MAX_GROUP_EVENTS:
            raise ValueError(f"{len(self.events)} events in one group; at most {MAX_GROUP_EVENTS}")
        self.pid, self.cpu, self.inherit, self.exclude_kernel = pid, cpu, inherit, exclude_kernel
        cdef int fd
        cdef int leader = -1
        for event in self.events:
            fd = _open_event(event, pid, cpu, leader, leader == -1, inherit, exclude_kernel)
            if fd < 0:
                err = errno
                self.close()
                raise PerfEventError(err, event, pid, cpu)
            if leader == -1:
                leader = fd
            self._fds.append(fd)
        ioctl(leader, PERF_EVENT_IOC_RESET, PERF_IOC_FLAG_GROUP)
        if ioctl(leader, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP) != 0:
            err = errno
            self.close()
            raise PerfEventError(err, self.events[0], pid, cpu)

    def read(self):
        """The group's counts now (cumulative since it was opened)."""
        if not self._fds:
            raise ValueError("counter group is closed")
        cdef uint64_t buf[3 + MAX_GROUP_EVENTS]
        cdef int fd = self._fds[0]
        cdef long got
        with nogil:
            got = read(fd, buf, sizeof(buf))
        if got < 0:
            raise PerfEventError(errno, self.events[0], self.pid, self.cpu)
        cdef uint64_t count = buf[0]
        if got < <long>((3 + count) * sizeof(uint64_t)) or count != <uint64_t>len(self.events):
            raise OSError(_errno.EIO, f"short perf_event group read ({got} bytes for {len(self.events)} events)")
        memcpy(self._last, buf, got)
        self._last_size = got
        return GroupReading(buf[1], buf[2], tuple([buf[3 + i] for i in range(count)]))

    def moved(self):
        """Whether the group reads otherwise now (counts, times enabled and running) than at its last
        ``read``, without building a reading: one read(2) and a comparison. True before any ``read`` and
        when this read fails (``read`` says why)."""
        if not self._fds or self._last_size == 0:
            return True
        cdef uint64_t buf[3 + MAX_GROUP_EVENTS]
        cdef int fd = self._fds[0]
        cdef long got
        with nogil:
            got = read(fd, buf, sizeof(buf))
        return got != self._last_size or memcmp(buf, self._last, got) != 0

    def close(self):
        """Close every fd of the group (idempotent)."""
        for fd in self._fds:
            close(fd)
        self._fds = []

    def __dealloc__(self):
        for fd in self._fds:
            close(fd)


def online_cpus():
    """The CPUs that are online now (from /sys), as a list of ints."""
    try:
        with open("/sys/devices/system/cpu/online") as handle:
            text = handle.read().strip()
    except FileNotFoundError:
        return list(range(os.cpu_count() or 1))
    cpus = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


class CounterSample:
    """Readings of every group of a CounterSet, taken together at ``at_ns`` (monotonic)."""

    __slots__ = ("at_ns", "readings")

    def __init__(self, at_ns, readings):
        self.at_ns = at_ns
        self.readings = tuple(readings)


class CounterSet:
    """The same events counted by several groups (per CPU, or per thread), summed when read."""

    def __init__(self, groups, events, scope, user_space_only=False):
        self.groups = list(groups)
        self.events = tuple(events)
        self.scope = scope
        self.user_space_only = user_space_only

    @classmethod
    def system_wide(cls, events, cpus=None):
        """One group per online CPU counting every task on it; needs paranoid <= 0 or CAP_PERFMON."""
        groups = []
        try:
            for cpu in (online_cpus() if cpus is None else cpus):
                groups.append(CounterGroup(events, pid=-1, cpu=cpu))
        except BaseException:
            for group in groups:
                group.close()
            raise
        return cls(groups, events, "system")

    @classmethod
    def for_process(cls, int pid, events):
        """One inheriting group per thread of ``pid``, so present and future threads are counted.

        Kernel-mode time is counted where allowed; at perf_event_paranoid 2
        without CAP_PERFMON only user space is (``user_space_only``). A thread
        that exits while the groups are being opened is skipped; the process
        itself being gone is an error (ESRCH).
        """
        try:
            return cls._open_threads(pid, events, False)
        except PerfEventError as error:
            if error.errno not in (_errno.EACCES, _errno.EPERM):
                raise
        return cls._open_threads(pid, events, True)

    @classmethod
    def _open_threads(cls, int pid, events, bint exclude_kernel):
        groups = []
        try:
            groups.append(CounterGroup(events, pid=pid, inherit=True, exclude_kernel=exclude_kernel))
            for tid in _threads(pid):
                if tid == pid:
                    continue
                try:
                    groups.append(CounterGroup(events, pid=tid, inherit=True, exclude_kernel=exclude_kernel))
                except PerfEventError as error:
                    if error.errno != _errno.ESRCH:
                        raise
        except BaseException:
            for group in groups:
                group.close()
            raise
        return cls(groups, events, "process", exclude_kernel)

    def sample(self):
        """Read every group now."""
        return CounterSample(time.monotonic_ns(), [group.read() for group in self.groups])

    def moved(self):
        """Whether any group reads otherwise than at the last ``sample`` (``CounterGroup.moved``)."""
        return any(group.moved() for group in self.groups)

    def close(self):
        for group in self.groups:
            group.close()
        self.groups = []


def _threads(int pid):
    try:
        return sorted(int(name) for name in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        raise PerfEventError(_errno.ESRCH, "task list", pid, -1) from None


class IntervalCounts:
    """Event counts over one interval (multiplex-scaled, summed) and the rates derived from them.

    Every derived value is None when an input is missing (event not counted,
    never scheduled, zero denominator); ``missing`` says why per event. All
    rates are for this interval only, summed over the CPUs/threads counted --
    unlike dynolog, whose figures are since-start per-CPU averages.
    """

    def __init__(self, seconds, counts, missing=None):
        self.seconds = seconds
        self.counts = dict(counts)
        self.missing = dict(missing or {})

    @classmethod
    def combined(cls, parts):
        """Merge intervals of different counter sets taken over the same period."""
        parts = list(parts)
        counts, missing = {}, {}
        for part in parts:
            counts.update(part.counts)
            missing.update(part.missing)
        return cls(max(part.seconds for part in parts), counts, missing)

    def per_second(self, event):
        count = self.counts.get(event)
        if count is None or self.seconds <= 0:
            return None
        return count / self.seconds

    def _ratio(self, numerator, denominator):
        top, bottom = self.counts.get(numerator), self.counts.get(denominator)
        if top is None or not bottom:
            return None
        return top / bottom

    @property
    def ipc(self):
        """Instructions per cycle."""
        return self._ratio("instructions", "cycles")

    @property
    def mips(self):
        """Millions of instructions per second of wall time (all counted CPUs together)."""
        rate = self.per_second("instructions")
        return None if rate is None else rate / 1e6

    @property
    def mega_cycles_per_s(self):
        """Millions of unhalted cycles per second of wall time (all counted CPUs together)."""
        rate = self.per_second("cycles")
        return None if rate is None else rate / 1e6

    @property
    def cache_miss_percent(self):
        ratio = self._ratio("cache_misses", "cache_references")
        return None if ratio is None else 100.0 * ratio

    @property
    def task_clock_cpus(self):
        """CPU-seconds of task time per second of wall time (1.0 = one core busy)."""
        rate = self.per_second("task_clock")
        return None if rate is None else rate / 1e9


def interval_counts(previous, current, events):
    """Scaled per-event deltas between two samples of the same CounterSet.

    Each group's delta is scaled by Δenabled/Δrunning (the share of the
    interval it was actually on the PMU). A group that was enabled but never
    scheduled contributes nothing and, if no group counted, the event is
    missing with that reason -- never 0.
    """
    if len(previous.readings) != len(current.readings):
        raise ValueError("samples come from different counter sets")
    seconds = (current.at_ns - previous.at_ns) / 1e9
    totals = [0.0] * len(events)
    counted = [False] * len(events)
    multiplexed_out = False
    for before, after in zip(previous.readings, current.readings):
        enabled = after.time_enabled_ns - before.time_enabled_ns
        running = after.time_running_ns - before.time_running_ns
        if enabled == 0:
            # not enabled in this interval (e.g. the thread had exited): it counted nothing
            for index in range(len(events)):
                counted[index] = True
            continue
        if running == 0:
            multiplexed_out = True
            continue
        scale = enabled / running
        for index in range(len(events)):
            totals[index] += (after.values[index] - before.values[index]) * scale
            counted[index] = True
    counts, missing = {}, {}
    for index, event in enumerate(events):
        if counted[index]:
            counts[event] = totals[index]
        else:
            missing[event] = ("never scheduled on the PMU in this interval (counters multiplexed out)"
                              if multiplexed_out else "no counter groups")
    return IntervalCounts(seconds, counts, missing)
