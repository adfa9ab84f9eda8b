"""CPU performance counters (tuiprof_native.pmu) for the host and for tracked processes.

Host scope: system-wide per CPU where the kernel allows it (perf_event_paranoid
<= 0 or CAP_PERFMON); otherwise "process" scope, the sum over the processes
added with ``track(pid)`` (agentd only tracks itself), each of which is also
counted on its own (``process_stats``). The ranks' own counters are not these:
the ranks collector opens them per rank with ``rank_counters``, which count a rank's
process only while it acts as its owner alone (``procfs.ineligible_reason``): a rank
that execs a set-user-ID program has them closed, with the reason.

Hardware events are tried once per counter set; where they fail the reason
(errno and cause) is reported in ``hardware_reason`` and every hardware-derived
rate is unavailable with that reason. Rates are per interval (see
tuiprof_native.pmu: dynolog's are since-start averages).

``rest(reason)`` stops the reads until ``wake()`` (the counters stay open): the console's
embedded agent rests it while no screen shows it, because a system-wide read is one group
read per CPU, each an interrupt to that CPU (about 1 ms a second on a 16-CPU VM,
bench/console/console_nvitop.md). While resting the collector is unavailable with that reason; the
first read after waking is a first sample again, never a rate over the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import threading
from collections.abc import Iterable

from agentd import procfs
from agentd.collectors.base import Collector
from agentd.collectors.readings import FIRST_SAMPLE, put_unavailable
from agentd.proto import tuiprof_agent_pb2 as pb

log = logging.getLogger(__name__)

# Without the extension ``native`` stays unbound and _IMPORT_ERROR says why; nothing
# below touches ``native`` before checking _IMPORT_ERROR.
try:
    from tuiprof_native import pmu as native
except ImportError as error:  # the extension is built by the package's build; say so if it was not
    _IMPORT_ERROR = f"tuiprof_native.pmu is not built ({error}); reinstall the package"
else:
    _IMPORT_ERROR = ""

# System-wide the task clock counts idle time too (it is wall time per CPU),
# so only the process scope counts it.
_SYSTEM_SOFTWARE = ("context_switches", "page_faults", "cpu_migrations")
_PROCESS_SOFTWARE = ("task_clock", "context_switches", "page_faults", "cpu_migrations")
_HARDWARE_FIELDS = ("mips", "mega_cycles_per_s", "ipc", "cache_misses_per_s", "cache_miss_percent", "branch_misses_per_s")
# The events each PmuStats field is computed from (to name the missing one).
_FIELD_EVENTS = {
    "mips": ("instructions",),
    "mega_cycles_per_s": ("cycles",),
    "ipc": ("instructions", "cycles"),
    "cache_misses_per_s": ("cache_misses",),
    "cache_miss_percent": ("cache_misses", "cache_references"),
    "branch_misses_per_s": ("branch_misses",),
    "task_clock_cpus": ("task_clock",),
    "context_switches_per_s": ("context_switches",),
    "page_faults_per_s": ("page_faults",),
    "cpu_migrations_per_s": ("cpu_migrations",),
}
_SYSTEM_TASK_CLOCK = "system-wide task clock counts idle time; use the host CPU percentages"


def raise_fd_limit() -> None:
    """One fd per event per CPU (or thread): lift the soft RLIMIT_NOFILE to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclasses.dataclass
class Counters:
    """A software and (maybe) a hardware counter set with their last samples.

    For one process: ``process_counters(pid)``; ``stats()`` once per interval
    gives that interval's PmuStats (a ranks collector's ``RankStats.pmu``).
    """

    software: native.CounterSet
    hardware: native.CounterSet | None
    hardware_reason: str
    previous: list = dataclasses.field(default_factory=list)
    # Whether the last read (interval() or stats()) saw anything counted since the one before. A process's
    # counters (and their times enabled and running) move only while one of its counted threads or children
    # is on a CPU, so False says none was.
    moved: bool = True
    # The threads (ids) whose own group (software events: one a thread the process had when the counters
    # were opened) read as before in the last read: none of them, nor a thread they started since, was on a
    # CPU in between. Empty after a read in which nothing moved (``moved`` says all of it then) and for
    # system-wide counters.
    idle_threads: frozenset[int] = frozenset()
    _still: pb.PmuStats | None = None  # the stats of an interval in which nothing moved, once built

    def sets(self) -> list:
        return [s for s in (self.software, self.hardware) if s is not None]

    def interval(self) -> native.IntervalCounts | None:
        """Counts since the previous call (None on the first call)."""
        previous, current = self._sample()
        return self._counts(previous, current) if previous else None

    def stats(self, scope: str = "process") -> pb.PmuStats:
        """PmuStats for the interval since the previous call (the first call: "first sample"). The same
        message for every interval in which nothing moved: its figures (zero counts, no ratio) do not
        depend on the interval's length. The caller copies it."""
        previous, current = self._sample()
        if not previous:
            return pmu_stats(scope, None, self.hardware_reason)
        if not self.moved and self._still is not None:
            return self._still
        stats = pmu_stats(scope, self._counts(previous, current), self.hardware_reason)
        if not self.moved:
            self._still = stats
        return stats

    def _sample(self) -> tuple[list, list]:
        """Read every set: (the previous samples, [] the first time; the new ones); sets ``moved``."""
        current = [counter_set.sample() for counter_set in self.sets()]
        previous, self.previous = self.previous, current
        self.moved = not previous or not all(map(_same_readings, previous, current))
        self.idle_threads = frozenset(
            group.pid for group, before, after in zip(self.software.groups, previous[0].readings,
                                                      current[0].readings, strict=True)
            if group.pid > 0 and _same_reading(before, after)) if previous and self.moved else frozenset()
        return previous, current

    def _counts(self, previous: list, current: list) -> native.IntervalCounts:
        interval = native.IntervalCounts.combined(
            native.interval_counts(before, after, counter_set.events)
            for before, after, counter_set in zip(previous, current, self.sets(), strict=True)
        )
        return _without_kernel_mode(interval) if self.software.user_space_only else interval

    def close(self) -> None:
        for counter_set in self.sets():
            counter_set.close()


def _same_readings(before: native.CounterSample, after: native.CounterSample) -> bool:
    """Whether every group of a counter set read the same twice."""
    return all(map(_same_reading, before.readings, after.readings))


def _same_reading(before: native.GroupReading, after: native.GroupReading) -> bool:
    """Whether one group read the same (times enabled and running, and counts) twice."""
    return (before.values == after.values and before.time_enabled_ns == after.time_enabled_ns
            and before.time_running_ns == after.time_running_ns)


def _open(scope: str, pid: int = -1) -> Counters:
    """Open software counters (must work) and hardware counters (reason when not)."""
    if scope == "system":
        software = native.CounterSet.system_wide(_SYSTEM_SOFTWARE)
    else:
        software = native.CounterSet.for_process(pid, _PROCESS_SOFTWARE)
        if software.user_space_only:
            log.info("pmu: counting user space only (perf_event_paranoid >= 2, no CAP_PERFMON)", extra={"pid": pid})
    try:
        if scope == "system":
            hardware = native.CounterSet.system_wide(native.HARDWARE_EVENTS)
        else:
            hardware = native.CounterSet.for_process(pid, native.HARDWARE_EVENTS)
    except native.PerfEventError as error:
        return Counters(software, None, str(error))
    return Counters(software, hardware, "")


# Software events the kernel raises only in kernel mode: counted in user space only (perf_event_paranoid 2
# without CAP_PERFMON) they always read 0, which would say "no context switches" where none were counted.
_KERNEL_MODE_EVENTS = ("context_switches", "cpu_migrations")


def _without_kernel_mode(interval: native.IntervalCounts) -> native.IntervalCounts:
    """``interval`` with the kernel-mode events missing, with why, instead of 0."""
    reason = (f"not countable here: the agent counts user space only (perf_event_paranoid is "
              f"{native.paranoid_level()} and it lacks CAP_PERFMON), and the kernel does this in kernel mode; "
              "run the agent as root or set kernel.perf_event_paranoid to 1")
    counts = {event: count for event, count in interval.counts.items() if event not in _KERNEL_MODE_EVENTS}
    missing = {**interval.missing, **{event: reason for event in _KERNEL_MODE_EVENTS if event in interval.counts}}
    return native.IntervalCounts(interval.seconds, counts, missing)


def process_counters(pid: int) -> Counters:
    """Counters for ``pid`` and all its threads, present and future. Raises PerfEventError (ESRCH, ...)."""
    if _IMPORT_ERROR:
        raise RuntimeError(_IMPORT_ERROR)
    return _open("process", pid)


class ProcessLeftItsOwner(OSError):
    """A rank's process no longer acts only as its owner: its counters are not (or no longer) read."""


@dataclasses.dataclass
class RankCounters:
    """A rank process's counters, read only while it acts as its owner alone."""

    pid: int
    confirmed: procfs.Credentials
    counters: Counters

    def stats(self, status: procfs.ProcessStatus | None) -> pb.PmuStats:
        """This interval's PmuStats, ``status`` being the process's /proc status just read (None: gone);
        raises ProcessLeftItsOwner (returns nothing read) once the process no longer acts only as its
        owner: the caller closes them.

        The counters are read first. When they did not move (``ran`` is False) the process was never on
        a CPU since the last read, so it cannot have exec'd a program or turned non-dumpable: only the
        uids and gids ``status`` lists are checked then, without the looks at ``/proc/<pid>`` and its
        ``exe`` (``procfs.ineligible_reason_given``) that a process that ran gets."""
        stats = self.counters.stats()
        if status is None:
            reason = ""
        elif self.ran:
            reason = procfs.ineligible_reason_given(self.pid, self.confirmed, status)
        else:
            reason = procfs.ids_changed_reason(self.pid, self.confirmed, status)
        if reason:
            raise ProcessLeftItsOwner(f"CPU counters of pid {self.pid} closed: {reason}")
        return stats

    @property
    def ran(self) -> bool:
        """Whether the process may have run in the interval ``stats`` last read: False only when its counters
        did not move, task clock included, counted in kernel mode too (not at perf_event_paranoid 2 without
        CAP_PERFMON). Then none of its threads, nor a child they started since the counters were opened, was
        on a CPU."""
        return self.counters.moved or self.counters.software.user_space_only

    @property
    def idle_threads(self) -> frozenset[int]:
        """The threads that had no CPU in the interval ``stats`` last read, by their own counter groups
        (``Counters.idle_threads``; none where kernel mode is not counted)."""
        return frozenset() if self.counters.software.user_space_only else self.counters.idle_threads

    def close(self) -> None:
        self.counters.close()


def rank_counters(pid: int, owner_uid: int) -> RankCounters:
    """``process_counters`` of a rank's process, held to what it is now (its owner's credentials,
    its program). Raises ProcessLeftItsOwner when it already does not act only as its owner,
    ProcessLookupError when it is gone, PerfEventError (ESRCH, ...) when they cannot be opened."""
    confirmed = procfs.credentials(pid, owner_uid)
    if confirmed is None:
        raise ProcessLookupError(f"process {pid} is gone")
    reason = procfs.ineligible_reason(pid, confirmed)
    if reason:
        raise ProcessLeftItsOwner(reason)
    return RankCounters(pid, confirmed, process_counters(pid))


def summed(intervals: Iterable[native.IntervalCounts]) -> native.IntervalCounts:
    """Add up the counts of several processes over the same interval."""
    intervals = list(intervals)
    counts: dict[str, float] = {}
    missing: dict[str, str] = {}
    for interval in intervals:
        missing.update(interval.missing)
        for event, count in interval.counts.items():
            counts[event] = counts.get(event, 0.0) + count
    for event in counts:
        missing.pop(event, None)
    return native.IntervalCounts(max(i.seconds for i in intervals), counts, missing)


def pmu_stats(scope: str, interval: native.IntervalCounts | None, hardware_reason: str) -> pb.PmuStats:
    """PmuStats for one interval; every value that cannot be given says why."""
    stats = pb.PmuStats(scope=scope, hardware_available=not hardware_reason, hardware_reason=hardware_reason)
    values = _derived(interval) if interval is not None else {}
    for field in _FIELD_EVENTS:
        value = values.get(field)
        if field in _HARDWARE_FIELDS and hardware_reason:
            stats.unavailable[field] = f"hardware counters unavailable: {hardware_reason}"
        elif field == "task_clock_cpus" and scope == "system":
            stats.unavailable[field] = _SYSTEM_TASK_CLOCK
        elif interval is None:
            stats.unavailable[field] = FIRST_SAMPLE
        elif value is None:
            stats.unavailable[field] = _missing_reason(field, interval)
        else:
            setattr(stats, field, value)
    return stats


def _derived(interval: native.IntervalCounts) -> dict[str, float | None]:
    return {
        "mips": interval.mips,
        "mega_cycles_per_s": interval.mega_cycles_per_s,
        "ipc": interval.ipc,
        "cache_misses_per_s": interval.per_second("cache_misses"),
        "cache_miss_percent": interval.cache_miss_percent,
        "branch_misses_per_s": interval.per_second("branch_misses"),
        "task_clock_cpus": interval.task_clock_cpus,
        "context_switches_per_s": interval.per_second("context_switches"),
        "page_faults_per_s": interval.per_second("page_faults"),
        "cpu_migrations_per_s": interval.per_second("cpu_migrations"),
    }


def _missing_reason(field: str, interval: native.IntervalCounts) -> str:
    for event in _FIELD_EVENTS[field]:
        if event in interval.missing:
            return f"{event}: {interval.missing[event]}"
    return "zero denominator in this interval"


class PmuCollector(Collector):
    """perf_event counters: host scope plus one counter set per tracked process."""

    name = "pmu"
    # Reads never block (perf counters): sampled by the snapshot tick, on its thread, rather than
    # waking a thread of its own that would contend for the GIL with the others each second.
    clocked_by_snapshots = True

    def __init__(self, interval_seconds: float) -> None:
        super().__init__(interval_seconds)
        self._lock = threading.Lock()
        self._reason = ""
        self._host: Counters | None = None
        self._scope = ""
        self._tracked: dict[int, Counters] = {}
        self._host_stats: pb.PmuStats | None = None
        self._process_stats: dict[int, pb.PmuStats] = {}
        self._resting = ""  # why no reads are made now ("" while reading)
        self._start()

    def _start(self) -> None:
        if _IMPORT_ERROR:
            self._reason = _IMPORT_ERROR
            return
        if native.paranoid_level() is None:
            self._reason = f"perf_event is not supported by this kernel (no {native.PARANOID_PATH})"
            return
        raise_fd_limit()
        try:
            self._host, self._scope = _open("system"), "system"
        except native.PerfEventError as error:
            log.info("pmu: system-wide counting refused, counting tracked processes", extra={"reason": str(error)})
            self._scope = "process"
            try:
                self.track(os.getpid())
            except native.PerfEventError as own_error:
                self._reason = f"system-wide: {error}; this process: {own_error}"

    @property
    def scope(self) -> str:
        """"system" (all CPUs) or "process" (the tracked processes summed)."""
        return self._scope

    def status(self) -> pb.CollectorStatus:
        reason = self._reason or self._resting
        return pb.CollectorStatus(
            name=self.name, available=not reason, reason=reason, interval_seconds=self.interval_seconds
        )

    def rest(self, reason: str) -> None:
        """Make no reads until ``wake()``; the collector is unavailable with ``reason`` meanwhile."""
        with self._lock:
            self._resting = reason
            self._host_stats = None
            self._process_stats = {}

    def wake(self) -> None:
        """Read again from the next collect(), which is a first sample (no rate spans the rest)."""
        with self._lock:
            if not self._resting:
                return
            self._resting = ""
            self._host_stats = None
            self._process_stats = {}
            for counted in [self._host, *self._tracked.values()]:
                if counted is not None:
                    counted.previous = []

    def track(self, pid: int) -> None:
        """Count ``pid`` (all its threads, present and future). Raises PerfEventError (e.g. ESRCH)."""
        counted = process_counters(pid)
        with self._lock:
            old = self._tracked.pop(pid, None)
            self._tracked[pid] = counted
        if old is not None:
            old.close()

    def untrack(self, pid: int) -> None:
        """Stop counting ``pid`` and close its file descriptors."""
        with self._lock:
            counted = self._tracked.pop(pid, None)
            self._process_stats.pop(pid, None)
        if counted is not None:
            counted.close()

    def tracked(self) -> list[int]:
        with self._lock:
            return sorted(self._tracked)

    def collect(self) -> None:
        if self._reason or self._resting:
            return
        with self._lock:
            tracked = dict(self._tracked)
        gone = [pid for pid in tracked if not os.path.exists(f"/proc/{pid}")]
        for pid in gone:
            log.info("pmu: tracked process exited", extra={"pid": pid})
            self.untrack(pid)
            del tracked[pid]
        intervals = {pid: counted.interval() for pid, counted in tracked.items()}
        process_stats = {
            pid: pmu_stats("process", intervals[pid], counted.hardware_reason) for pid, counted in tracked.items()
        }
        if self._host is not None:  # system scope
            host = pmu_stats("system", self._host.interval(), self._host.hardware_reason)
        else:
            host = self._process_scope_stats(tracked, intervals)
        with self._lock:
            if self._resting:  # rest() came while reading: keep nothing of it
                return
            self._host_stats = host
            self._process_stats = {pid: s for pid, s in process_stats.items() if pid in self._tracked}

    @staticmethod
    def _process_scope_stats(tracked: dict[int, Counters], intervals: dict) -> pb.PmuStats:
        if not tracked:
            stats = pb.PmuStats(scope="process", hardware_available=False, hardware_reason="no tracked processes")
            put_unavailable(stats, _FIELD_EVENTS, "no tracked processes")
            return stats
        reason = next((c.hardware_reason for c in tracked.values() if c.hardware_reason), "")
        present = [interval for interval in intervals.values() if interval is not None]
        return pmu_stats("process", summed(present) if present else None, reason)

    def process_stats(self, pid: int) -> pb.PmuStats | None:
        """The latest interval's counters of one tracked process (for RankStats.pmu)."""
        with self._lock:
            stats = self._process_stats.get(pid)
            if stats is None:
                return None
            copy = pb.PmuStats()
            copy.CopyFrom(stats)
            return copy

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        with self._lock:
            if self._host_stats is not None:
                snapshot.pmu.CopyFrom(self._host_stats)

    def close(self) -> None:
        with self._lock:
            tracked, self._tracked = list(self._tracked.values()), {}
        for counted in tracked:
            counted.close()
        if self._host is not None:
            self._host.close()
            self._host = None
