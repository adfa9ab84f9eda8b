"""Per-rank telemetry: the training processes' shared-memory segments, turned into rates.

Every process started under `tuiprof run` that does GPU or training work has a
segment /dev/shm/tuiprof-<uid>-<pid>-<random> (layout: tuiprof_native/include/
tuiprof_segment.h). Each interval this collector scans the directory, checks
every segment's claim against the kernel (``rank_claims``: file owner, process
owner, pid, start time — the agent runs as root and later dumps the stacks of
the ranks it reports), reads the segments it believes (never blocking their
writers, never mapping them) and turns the counters into per-interval
RankStats (see ``rank_rates`` for the definitions). A segment that fails a
check is skipped, counted per reason (``refused()``) and logged once; one bad
segment never stops the others.

A rank whose process is gone (or whose pid now belongs to a newer process) is
reported as "exited" for ``exited_keep_seconds``, then its segment is deleted.
The agent is not the process's parent, so its exit code or fatal signal comes
from what the process left in its segment, and its last uncaught Python
exception (live or exited) from the file beside it (``rank_exit``). PyTorch
Flight Recorder progress, where the startup hook publishes it, adds per
process group counters and in-flight collectives (``rank_flight``). A live
process whose writer stopped beating is reported with its kernel state and
heartbeat age: judging that is the hang detector's job. ``RankStats.hook`` is
the hook library's account of itself (timing it has, records it lost); a
process whose hook stayed inert (no segment: shared memory full, ...) left a
``.inert`` note instead and is reported with its state and the reason.

Each live rank also gets its own CPU counter group (``agentd.collectors.pmu``,
inheriting into threads and children created later), opened when its segment
is verified, read once per interval into ``RankStats.pmu``, and closed when
the rank is seen to exit (after that final reading), or when its process no
longer acts only as its owner (``pmu.rank_counters``). A rank whose counters
cannot be opened has ``pmu`` unset and ``unavailable["pmu"]`` saying why.

The collector is clocked by snapshots: each snapshot's reading is compared with
the previous snapshot's, so every finished operation lands in exactly one
published interval (``RankStats.interval_seconds`` says its span). A rank not
read this interval (a writer mid-update, or exited after its final reading) is
reported without the previous interval's figures, with the reason; what it did
is counted in the next reading, never twice.

A rank at rest is not read again: the hook bumps its header's ``data_seq`` after every pass that
changed a figure (heartbeats do not), so when it is what it was before the last full reading, the rank
did nothing since, and its report is that reading's with the per-interval figures of a reading with
no change (zero rates, no latency; ``_at_rest_report``) and the figures that move with time brought up to
date (interval, heartbeat and in-flight ages). Everything else is read every interval as before: the
header's pid, its CPU counters and scheduler figures (a rank at rest may still spin a CPU) and the files
beside its segment. The process's status (real uid, ids, state) is read again when it may have changed:
the kernel's process events (``agentd.proc_events``) named the process (ids, exec, exit) or were lost,
or its main thread ran (only it can stop, wait on a disk or exit itself), or its state was another than
running or sleeping (``_process_now``); without the events, every interval. A rank at rest that did
nothing at all (``_quiet``: no thread ran, no side files, no in-flight entries) keeps its report, and while
its file is as its folder's last listing took it (``rank_claims.FolderListings``) its header is not read either
(only its own threads write it); when the process events vouch for its status too, it costs one read of its
counters (``_stays_quiet``). A rank that did work is read in full in the interval it shows it in, as every rank of a segment layout without ``data_seq``. What did not move costs
little: counters that read as before give cached figures and spare the threads' schedstat files
(``pmu.RankCounters.ran``), and a file beside the segment is looked at only when the folder's listing
holds it (``rank_claims.Scan.side_files``).

What one owner's ranks put into a snapshot is bounded: at most
``MAX_OPS_PER_OWNER`` ops (GEMM and NCCL aggregates, in-flight entries, Flight
Recorder process groups, timed Python functions: ``rank_functions``) per owner and interval, taken in the order the ranks are read. The rest are left
out, never silently: the rank says how many of its ops are missing and why
(``unavailable["ops"]``), the snapshot counts them per owner
(``HostSnapshot.rank_ops_dropped``), and the log says so once per owner.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import statistics
import threading
import time

from agentd import containers, procfs, proc_events
from agentd.collectors import (
    pmu,
    rank_arrivals,
    rank_claims,
    rank_device_memory,
    rank_exit,
    rank_flight,
    rank_function_requests,
    rank_functions,
    rank_rates,
)
from agentd.collectors.rank_arrivals import Arrival, ArrivalTracker
from agentd.collectors.rank_sched import CpuStatReads, SchedReader
from agentd.collectors.base import Collector
from agentd.collectors.rank_claims import Candidate, Refused
from agentd.collectors.rank_files import SidecarFile
from agentd.collectors.rank_places import Claimant, SegmentFolders
from agentd.collectors.readings import Unavailable, counter_rate, put, put_unavailable, scaled
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

log = logging.getLogger(__name__)

# Without the extension ``native`` stays unbound and _IMPORT_ERROR says why; nothing
# touches ``native`` before checking _IMPORT_ERROR (status() reports it, collect() is not run).
try:
    from tuiprof_native import segment as native
except ImportError as error:  # built by the package's build; say so if it was not
    _IMPORT_ERROR = f"tuiprof_native.segment is not built ({error}); reinstall the package"
else:
    _IMPORT_ERROR = ""

STEP_WINDOW = 32
# The most ops one owner's ranks report per interval: GEMM and NCCL aggregates, in-flight entries and
# Flight Recorder process groups, over the owner's ranks in the order they are read (ranks already followed
# first, then by pid). Each op is at most 11 series on /metrics. A rank has up to 511 aggregates, 128
# in-flight entries and a 96 KiB Flight Recorder file (thousands of groups), so one user's 256 segments
# could otherwise put 160k ops or more (1.5 million series) into every snapshot and scrape; an 8-GPU job's
# ranks use a few hundred.
MAX_OPS_PER_OWNER = 4096
# The most aggregate slots a segment holds (TP_MAX_SLOTS): what a rank not read for the budget counts as left out.
_SLOTS_AT_MOST = 512
_OPS_BASELINE = ("its ops were left out of the previous interval (over the per-owner budget): this reading is "
                 "their new baseline, their figures come from the next interval")
# A rank's state from its process's: sleeping and idle ranks are running a job.
_RANK_STATES = {
    procfs.RUNNING: pb.RANK_STATE_RUNNING, procfs.SLEEPING: pb.RANK_STATE_RUNNING, "idle": pb.RANK_STATE_RUNNING,
    procfs.DISK_SLEEP: pb.RANK_STATE_DISK_SLEEP, procfs.STOPPED: pb.RANK_STATE_STOPPED,
    "tracing-stop": pb.RANK_STATE_STOPPED, procfs.ZOMBIE: pb.RANK_STATE_ZOMBIE, procfs.DEAD: pb.RANK_STATE_EXITED,
}
# The states a process leaves only by running (its main thread stops, waits on a disk or exits itself).
_LEFT_ONLY_BY_RUNNING = frozenset((procfs.RUNNING, procfs.SLEEPING, "idle"))
_NO_PYTHON_HOOK = "no Python startup hook data (not a Python job, or torch was never imported)"
# The most communicators one rank reports arrivals of per interval (each at most about MAX_ARRIVALS_PER_COMM
# collectives): an honest job has a few; any local user can fill a ring with made-up ones.
MAX_COMMS_PER_RANK = 16
MAX_STEP_ENDS = 256  # step ends one rank reports per interval (a step under 4 ms at the 1 s default is rare)
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
_THROTTLED = "cpu_throttled_seconds_per_s"
_PER_INTERVAL_FIELDS = ("gemm_tflops", "gc_pause_seconds_per_s", "dataloader_wait_seconds_per_s", "pmu")
_NOT_READ_BUSY = "the segment was mid-update when read: this interval's work is counted in the next one"
_NOT_READ_EXITED = "the process has exited: its work was counted in its final reading"
_NCCL_SINGLE_RANK = "world size 1: NCCL does no communication"
_NO_TIMED_GEMM = "no timed GEMM finished in the interval"
_NCCL_NO_PLUGIN = ("NCCL has not loaded the tuiprof profiler plugin in this process (no communicator created yet, "
                   "or an NCCL without the profiler plugin interface)")


def rank_state(process_state: str) -> pb.RankState:
    """A rank's state from its process's (``procfs`` words); UNSPECIFIED for one no rank shows."""
    return _RANK_STATES.get(process_state, pb.RANK_STATE_UNSPECIFIED)


@dataclasses.dataclass
class _Rank:
    """One verified segment being followed, and its previous reading."""

    candidate: Candidate
    claimant: Claimant  # its process as the host sees it (host pid and uid)
    seg: native.Segment
    start_ns: int  # the segment's start as verified against its process's; later header edits do not count
    process: procfs.StatusFile | None  # its process's /proc status, held open (None: gone when verified)
    cpu_stats: CpuStatReads  # the collector's: its cgroup's cpu.stat is read once an interval for all its ranks
    status: procfs.ProcessStatus | None = None  # what ``process`` said when last read (None: not read yet)
    main_thread_unknown: bool = False  # it exec'd since it was verified: its main thread may be another one
    quiet: bool = False  # its last report was of a rank at rest that did nothing at all (``_quiet``): kept as is
    pulse: native.Pulse | None = None  # its header's words as last read
    read_ns: int = 0
    data_seq: int | None = None  # the header's data_seq before its last full reading (None: not known)
    at_rest: pb.RankStats | None = None  # its figures as an unchanged segment gives them; None: read it in full
    inflight: list = dataclasses.field(default_factory=list)  # the segment's in-flight entries as last read
    slots: dict | None = dataclasses.field(default_factory=dict)  # None: not read last time (over the ops budget)
    counters: native.Counters | None = None
    device_memory: native.DeviceMemory | None = None
    step_times: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=STEP_WINDOW))
    exited_at: float | None = None
    stats: pb.RankStats | None = None
    cpu_counters: pmu.RankCounters | None = None
    cpu_counters_reason: str = ""
    ring_read: int = 0  # events before this ring index were read for arrivals
    finished: dict = dataclasses.field(default_factory=dict)  # NCCL communicator (hex) → newest finished sequence
    stale: set = dataclasses.field(default_factory=set)  # (communicator, sequence) of in-flight entries found stale
    arrivals: ArrivalTracker = dataclasses.field(default_factory=ArrivalTracker)
    exception: SidecarFile = dataclasses.field(init=False)
    flight: SidecarFile = dataclasses.field(init=False)
    flight_progress: rank_flight.FlightProgress = dataclasses.field(default_factory=rank_flight.FlightProgress)
    functions: rank_functions.FunctionTimings = dataclasses.field(init=False)
    sched: SchedReader = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.exception = SidecarFile(self.path, native.EXCEPTION_SUFFIX)
        self.flight = SidecarFile(self.path, native.FLIGHT_SUFFIX)
        self.functions = rank_functions.FunctionTimings(self.path)
        self.sched = SchedReader(self.pid, self.cpu_stats)

    @property
    def path(self) -> str:
        return self.candidate.path

    @property
    def pid(self) -> int:
        return self.claimant.pid

    @property
    def uid(self) -> int:
        return self.claimant.uid

    def same_file(self, candidate: Candidate) -> bool:
        return candidate.identity[:2] == self.candidate.identity[:2]  # (device, inode)

    def close(self) -> None:
        """Close the segment and release the counters' and the status file's descriptors."""
        self.close_counters()
        self.seg.close()
        if self.process is not None:
            self.process.close()

    def close_counters(self) -> None:
        if self.cpu_counters is not None:
            self.cpu_counters.close()
            self.cpu_counters = None


@dataclasses.dataclass(frozen=True)
class _CpuReading:
    """A rank's CPU counters as read this interval."""

    pmu: pb.PmuStats | None  # None: unavailable, ``reason`` says why
    reason: str
    ran: bool  # whether any of its threads may have had a CPU in the interval (``pmu.RankCounters.ran``)
    idle_threads: frozenset[int]  # the threads that surely had none (``pmu.RankCounters.idle_threads``)


def _listen_to_process_events() -> proc_events.ProcessEvents | None:
    """The kernel's process events, or None (every rank's status is then read every interval)."""
    try:
        return proc_events.ProcessEvents.subscribe()
    except proc_events.ProcessEventsUnavailable as exc:
        log.info("process events unavailable: each rank's /proc status is read every interval",
                 extra={"reason": str(exc)})
        return None


class RanksCollector(Collector):
    """Discovers rank segments, believes those the kernel confirms, reports per-rank rates."""

    name = "ranks"
    clocked_by_snapshots = True

    def __init__(self, interval_seconds: float, directory: str | None = None,
                 exited_keep_seconds: float = 30.0) -> None:
        super().__init__(interval_seconds)
        self.directory = directory or ("/dev/shm" if _IMPORT_ERROR else native.SEGMENT_DIR)
        # Containers' /dev/shm folders too, for a root agent reading the default folder (a folder given
        # by name is the one place looked at).
        self._folders = SegmentFolders(self.directory, containers=directory is None and os.geteuid() == 0)
        self._listings = rank_claims.FolderListings()  # each folder's last listing, reused while it is unchanged
        self.exited_keep_seconds = exited_keep_seconds
        self._ranks: dict[str, _Rank] = {}
        self._unreadable: dict[str, str] = {}  # path → the transient error last logged for it
        self._refusals = rank_claims.Refusals()
        self._refused: dict[str, int] = {}
        self._ops_dropped: list[pb.RankOpsDropped] = []
        self._over_budget: set[int] = set()  # owners whose ops were left out in the last interval
        self._latest: list[pb.RankStats] = []
        self._live_owners: dict[int, int] = {}  # pid → uid of the live ranks last read
        self._lock = threading.Lock()
        self.function_requests = rank_function_requests.RequestQueue()  # SetFunctionTiming's, written at collect()
        # An agent that is not root reads its own user's ranks only: the others' segments are 0600, theirs
        # and root's (their owners did nothing wrong: no warning for them, the collector's status says so).
        self._own_uid = os.geteuid()
        pmu.raise_fd_limit()  # each rank's counters take one fd per event per thread
        self._events = _listen_to_process_events()
        self._heard: set[int] | None = None  # the pids the process events named this interval; None: any may have changed
        self._execs: set[int] = set()  # those of them that exec'd (a rank is read every interval from then on)
        self._changes: proc_events.Changes | None = None  # all the process events told this interval (None: no listener)
        self._cpu_stats = CpuStatReads()

    def status(self) -> pb.CollectorStatus:
        if _IMPORT_ERROR:
            return pb.CollectorStatus(name=self.name, available=False, reason=_IMPORT_ERROR)
        if not os.path.isdir(self.directory):
            return pb.CollectorStatus(name=self.name, available=False,
                                      reason=f"{self.directory} does not exist: no shared memory for rank segments")
        return pb.CollectorStatus(name=self.name, available=True, interval_seconds=self.interval_seconds,
                                  reason=self._scope())

    def _scope(self) -> str:
        """Whose ranks this agent shows, when not everyone's."""
        if self._own_uid == 0:
            return ""
        return (f"shows the ranks of uid {self._own_uid} only (this agent's user): other users' rank segments are "
                "private to them and root; the node's root agent shows every rank")

    def refused(self) -> dict[str, int]:
        """Files refused in the last interval, per reason (``rank_claims``' reason keys)."""
        with self._lock:
            return dict(self._refused)

    def live_rank_owner(self, pid: int) -> int | None:
        """The owner of ``pid`` when it is a live rank as last read (any thread), else None."""
        with self._lock:
            return self._live_owners.get(pid)

    def collect(self) -> None:
        self._send_function_requests()
        self._cpu_stats.next_interval()
        self._heard = self._hear_process_events()  # before any rank is read: what changed up to now is known
        now_ns = time.time_ns()
        mono = time.monotonic()
        folders = self._folders.current(lambda: {rank.candidate.folder.path for rank in self._ranks.values()}, self._changes)
        found = self._listings.scan(folders, native, {path: rank.candidate for path, rank in self._ranks.items()})
        self._refusals.start_interval(found)
        budget = OpsBudget(MAX_OPS_PER_OWNER)
        inert: list[pb.RankStats] = []
        read: set[str] = set()  # ranks whose counters this interval's figures come from
        beside = _with_side_files(found.side_files)
        for candidate in found.candidates:
            if self._own_uid not in (0, candidate.owner):
                continue  # another user's: not readable by this agent, and not an anomaly
            try:
                if self._refusals.still_refused(candidate):
                    continue
                if self._stays_quiet(candidate, now_ns, budget, beside):
                    read.add(candidate.path)
                elif candidate.inert:
                    inert.extend(self._inert_rank(candidate))
                elif self._follow(candidate, now_ns, mono, budget, found.side_files):
                    read.add(candidate.path)
            except Refused as refusal:
                self._refuse(candidate, refusal)
            except native.SegmentFormatError as exc:
                self._refuse(candidate, Refused(rank_claims.UNREADABLE, str(exc)))
            except native.SegmentNotReadyError:
                pass  # being created right now: next interval
            except native.SegmentError as exc:  # busy (a writer mid-update), or gone between scan and open
                self._note_unreadable(candidate.path, exc)
        present = {c.path for c in found.candidates}
        self._expire(present, mono)
        self._refusals.forget_missing(present)
        self._unreadable = {p: r for p, r in self._unreadable.items() if p in present}
        followed = {r.pid for r in self._ranks.values()}
        newest = _one_per_process(self._ranks)
        latest = [r.stats if r.path in read else budget.trim(_not_read(r.stats, exited=r.exited_at is not None))
                  for r in newest if r.stats is not None]
        # a segment beats a stale note; one note per process
        latest += {r.pid: r for r in inert if r.pid not in followed}.values()
        ops_dropped = budget.dropped_entries()
        self._log_budget({entry.uid: entry for entry in ops_dropped})
        with self._lock:
            self._latest = latest
            self._live_owners = {r.pid: r.uid for r in newest if r.exited_at is None}
            self._refused = dict(self._refusals.counts)
            self._ops_dropped = ops_dropped

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        with self._lock:
            add = snapshot.ranks.add
            for stats in self._latest:  # a copy each: half the time of ``extend``'s (upb), with 1600 ranks
                add().CopyFrom(stats)
            snapshot.rank_segments_refused.extend(
                pb.RankSegmentsRefused(reason=reason, files=self._refused.get(reason, 0))
                for reason in rank_claims.REASONS)
            snapshot.rank_ops_dropped.extend(self._ops_dropped)

    def close(self) -> None:
        for rank in list(self._ranks.values()):
            rank.close()
        self._ranks.clear()
        self._folders.close()
        if self._events is not None:
            self._events.close()

    # ---------------------------------------------------------------- internals

    def _send_function_requests(self) -> None:
        """Write the requests SetFunctionTiming handed over beside their ranks' segments, through the
        folders this collector holds (``rank_function_requests``)."""
        requests = self.function_requests.take()
        live = {rank.pid: rank for rank in _one_per_process(self._ranks) if rank.exited_at is None} if requests else {}
        for request in requests:
            rank = live.get(request.pid)
            try:
                if rank is None:
                    raise rank_function_requests.RequestNotWrittenError(
                        f"pid {request.pid} is no longer a live rank on this host")
                folder = rank.candidate.folder
                rank_function_requests.write_request(folder.fd, folder.path, os.path.basename(rank.path), rank.uid,
                                                     request)
            except rank_function_requests.RequestNotWrittenError as exc:
                request.written.set_exception(exc)
                continue
            rank.functions.sent = request
            request.written.set_result(None)

    def _log_budget(self, over: dict[int, pb.RankOpsDropped]) -> None:
        """One line when an owner goes over the ops budget, one when they are back under it."""
        for uid in sorted(over.keys() - self._over_budget):
            log.warning("rank ops over the per-owner budget: the rest are left out of snapshots and /metrics",
                        extra={"uid": uid, "ops_dropped": over[uid].ops, "budget": MAX_OPS_PER_OWNER})
        for uid in sorted(self._over_budget - over.keys()):
            log.info("rank ops back within the per-owner budget", extra={"uid": uid, "budget": MAX_OPS_PER_OWNER})
        self._over_budget = set(over)

    def _refuse(self, candidate: Candidate, refusal: Refused) -> None:
        self._refusals.refuse(candidate, refusal)
        rank = self._ranks.pop(candidate.path, None)
        if rank is not None:  # believed once, refused now (its header was rewritten): never reported again
            rank.close()

    def _note_unreadable(self, path: str, exc: OSError) -> None:
        if self._unreadable.get(path) != str(exc):
            log.warning("rank segment busy or gone while read (its process was writing it, or it was just removed, as a "
                        "finished job's is): harmless, nothing to do; read again next interval",
                        extra={"path": path, "reason": str(exc)})
        self._unreadable[path] = str(exc)

    def _follow(self, candidate: Candidate, now_ns: int, mono: float, budget: OpsBudget, side_files: set[str]) -> bool:
        """Open (the first time) and read one rank; whether its counters were read. ``side_files``: those its
        folder's listing holds (``rank_claims.Scan.side_files``)."""
        rank = self._ranks.get(candidate.path)
        if rank is not None and not rank.same_file(candidate):  # replaced under the same name: a new claim
            self._forget(rank, delete=False)
            rank = None
        if rank is None:
            rank = self._open(candidate)
        file_unchanged = candidate is rank.candidate  # the scan kept it: the file is as its folder's last listing took it
        rank.candidate = candidate
        return self._sample(rank, now_ns, mono, budget, side_files, file_unchanged)

    def _stays_quiet(self, candidate: Candidate, now_ns: int, budget: OpsBudget, beside: set[str]) -> bool:
        """Whether ``candidate`` is a quiet rank (``_quiet``) that still is, told without reading its file or its
        process's status: the scan kept its Candidate (``rank_claims.FolderListings``), the process events vouch
        for its status (``_status_stands``), nothing is listed beside it (``beside``: the segments that have
        files beside them) nor a function timing request outstanding, and its counter groups read as they did
        (``_counters_still``). Its report is then kept, with the times of now and its cgroup's CPU throttling.
        This is most ranks of a node at rest, each interval: the full reading (``_follow``) decides the rest."""
        rank = self._ranks.get(candidate.path)
        if rank is None or not rank.quiet or candidate is not rank.candidate or rank.main_thread_unknown \
                or rank.functions.sent is not None or candidate.path in beside or not self._status_stands(rank):
            return False
        assert rank.stats is not None and rank.pulse is not None  # a quiet rank was read in full before
        if rank.cpu_counters is None or not _counters_still(rank.cpu_counters) or not _rests(rank, rank.pulse, budget):
            return False
        _retime(rank, rank.stats, rank.pulse, now_ns)
        _throttling(rank, rank.stats)
        return True

    def _open(self, candidate: Candidate) -> _Rank:
        """Open a segment and check its claim; the rank, followed from now on. Raises Refused."""
        seg, start_ns, claimant, alive = rank_claims.open_verified(candidate, native, self._folders)
        try:
            process = rank_claims.watch_process(claimant.pid, claimant.uid, start_ns, candidate.path) if alive else None
        except BaseException:
            seg.close()
            raise
        rank = _Rank(candidate, claimant, seg, start_ns, process, self._cpu_stats)
        rank.read_ns = start_ns  # first rates are since the segment's creation
        if alive is None:
            rank.cpu_counters_reason = (f"CPU counters for pid {rank.pid} could not be opened: no such process "
                                        "(ESRCH): it exited before the agent found its segment")
        else:
            try:
                rank.cpu_counters = pmu.rank_counters(rank.pid, rank.uid)
            except (OSError, RuntimeError) as exc:  # PerfEventError is an OSError; RuntimeError: pmu not built
                rank.cpu_counters_reason = f"CPU counters for pid {rank.pid} could not be opened: {exc}"
                log.info("rank CPU counters unavailable", extra={"pid": rank.pid, "reason": str(exc)})
        self._ranks[candidate.path] = rank
        return rank

    def _expire(self, present: set[str], mono: float) -> None:
        for path in list(self._ranks):
            rank = self._ranks[path]
            gone_file = path not in present
            expired = rank.exited_at is not None and mono - rank.exited_at >= self.exited_keep_seconds
            if gone_file or expired:
                self._forget(rank, delete=expired and not gone_file)

    def _forget(self, rank: _Rank, delete: bool) -> None:
        rank.close()
        del self._ranks[rank.path]
        rank.exception.remove()
        rank.flight.remove()
        rank.functions.file.remove()
        rank_function_requests.remove_request(rank.path)
        if delete:
            _unlink(rank.path)

    def _sample(self, rank: _Rank, now_ns: int, mono: float, budget: OpsBudget, side_files: set[str],
                file_unchanged: bool) -> bool:
        """Read one rank's segment into ``rank.stats``; False when its counters were not read.
        ``file_unchanged``: the scan kept its Candidate (``rank_claims.FolderListings``: as its folder's last listing took it).

        A rank that was quiet (``_quiet``) last interval and still is, none of whose threads ran since, whose
        file is as the listing took it, is not even looked at: only its own threads write its segment (the
        hook's; a forked child lets go of it), so its header is what it was, pid and data_seq included."""
        if rank.exited_at is not None:
            return False  # its final reading was published; it is reported exited until cleaned up
        alive, cpu = self._process_now(rank)
        still_quiet = alive is not None and rank.quiet and _quiet(rank, cpu, side_files)
        if still_quiet and file_unchanged and rank.pulse is not None:
            pulse = rank.pulse
        else:
            pulse = rank.seg.pulse()
            rank_claims.check_header_pid(rank.candidate, pulse.pid)
            rank.pulse = pulse
        resting = alive is not None and _rests(rank, pulse, budget)
        if resting and still_quiet:
            assert rank.stats is not None and alive is not None
            _retime(rank, rank.stats, pulse, now_ns)  # the rest of its last report is what this one would be
            _throttling(rank, rank.stats)
            rank.stats.state = rank_state(alive.state)
            return True
        header = None
        new_events: tuple[list, list[int]] = ([], [])  # none at rest: its ring did not move
        if resting:
            stats, left_out = _rested(rank, pulse, now_ns), 0
        else:
            try:
                header = rank.seg.header()
            except native.SegmentBusyError:
                if alive is not None:
                    raise  # a live writer mid-update: the last report stands, the next interval reads again
                self._exited_mid_update(rank, mono)
                return False
            rank_claims.check_header_pid(rank.candidate, header.pid)
            stats, left_out = self._rates(rank, header, now_ns, budget)
            rank.data_seq = pulse.data_seq
            rank.at_rest = _at_rest_report(stats) if left_out == 0 and alive is not None and pulse.data_seq is not None \
                and stats.unavailable.get("gemm_tflops") != _OPS_BASELINE else None
            new_events = _new_events(rank, header)
        # a rank at rest may still use CPU, wait for one or write its side files: read every interval
        self._kernel_figures(rank, stats, cpu)
        exception = rank.exception.refresh(side_files)
        if exception:
            stats.exception = printable(exception, keep_lines=True)
        flight_left_out, flight_arrivals = self._flight(rank, stats, rank.flight.refresh(side_files), now_ns, budget)
        left_out += flight_left_out
        rank.functions.fill(stats, now_ns, side_files)
        if stats.functions:
            functions = budget.take(rank.uid, len(stats.functions))
            left_out += len(stats.functions) - functions
            del stats.functions[functions:]
        _arrivals(rank, stats, *new_events, flight_arrivals)
        if left_out:
            stats.unavailable["ops"] = budget.reason(rank.uid, left_out)
        if alive is None:
            assert header is not None  # only a live rank rests
            rank.exited_at = mono
            rank.close_counters()
            stats.state = pb.RANK_STATE_EXITED
            rank_exit.fill_exit_status(header, stats, native.FLAG_EXITED)
        else:
            stats.state = rank_state(alive.state)
        rank.stats = stats
        # Kept as its next report while it stays so: all but its times (and CPU throttling) come out the same.
        rank.quiet = (resting and _quiet(rank, cpu, side_files) and "ops" not in stats.unavailable
                      and stats.HasField("run_delay_seconds_per_s"))
        return True

    def _process_now(self, rank: _Rank) -> tuple[procfs.ProcessStatus | None, _CpuReading]:
        """The rank's process status (None: gone) and its CPU counters' reading of this interval.

        The status (real uid, uids and gids, state, life) is read again unless nothing in it can have changed
        since it was last read: the process events (``agentd.proc_events``) named no change of ids, exec or
        exit of the process, and lost none; and its state was one the process leaves only by running
        (running, sleeping, idle: stopping, a disk wait or exiting happen in its main thread) while its main
        thread's counter group says it did not run (read first, for that). Without the events, or counters,
        it is read every interval."""
        if rank.process is None:
            return None, self._cpu_counters(rank, None)
        if rank.pid in self._execs:
            rank.main_thread_unknown = True
        stands = self._status_stands(rank)
        if not stands:
            rank.status = rank_claims.owned_status(rank.process, rank.uid, rank.path)
        # Its ids are the status's still (no event said otherwise): the counters' eligibility check holds.
        cpu = self._cpu_counters(rank, rank.status)
        if stands and (rank.main_thread_unknown or cpu.ran and rank.pid not in cpu.idle_threads):
            rank.status = rank_claims.owned_status(rank.process, rank.uid, rank.path)
        return rank.status, cpu

    def _status_stands(self, rank: _Rank) -> bool:
        """Whether the process events vouch that ``rank``'s process did not change its ids, exec or exit
        since its status was last read, and that status's state only the process itself can leave."""
        return (self._heard is not None and rank.pid not in self._heard and rank.status is not None
                and rank.status.state in _LEFT_ONLY_BY_RUNNING)

    def _hear_process_events(self) -> set[int] | None:
        """The pids the process events named since the last interval; None when any process may have changed
        unheard (no listener, or the kernel dropped events: every rank's status is read). A process that
        exec'd may have a new main thread (one of its other threads exec'd): its main thread's counter
        group no longer tells whether it ran, so its status is read every interval from then on; after lost
        events, that of every rank followed then (any of them may have exec'd unheard)."""
        if self._events is None:
            return None
        changes = self._events.drain()
        self._execs = changes.execs
        self._changes = changes
        if changes.lost:
            for rank in self._ranks.values():
                rank.main_thread_unknown = True
            return None
        return changes.pids

    def _kernel_figures(self, rank: _Rank, stats: pb.RankStats, cpu: _CpuReading) -> None:
        """The rank's CPU counters (``cpu``, read this interval), run-queue delay and CPU throttling over the
        interval (``stats``')."""
        seconds = stats.interval_seconds
        if cpu.pmu is None:
            stats.unavailable["pmu"] = cpu.reason
        else:
            stats.pmu.CopyFrom(cpu.pmu)
        put(stats, "run_delay_seconds_per_s", rank.sched.run_delay_seconds_per_s(seconds, cpu.ran, cpu.idle_threads))
        _throttling(rank, stats)

    @staticmethod
    def _flight(rank: _Rank, stats: pb.RankStats, text: str, now_ns: int,
                budget: OpsBudget) -> tuple[int, list[Arrival]]:
        """The rank's Flight Recorder process groups and in-flight collectives from its file's ``text``, as many
        as its owner's budget allows: how many were left out, and the arrivals the file lists. With no budget left the file is
        not even parsed (up to 96 KiB of JSON per rank and interval)."""
        uid = rank.uid
        if not budget.left(uid):
            stats.unavailable["process_groups"] = (f"not read: the ranks of uid {uid} have more ops than the "
                                                   f"agent's per-owner budget of {budget.per_owner}")
            return 0, []
        inflight_before = len(stats.inflight)
        arrivals = rank.flight_progress.fill(text, stats, now_ns)
        added = len(stats.inflight) - inflight_before
        if not stats.process_groups and not added:
            return 0, arrivals
        groups = budget.take(uid, len(stats.process_groups))
        collectives = budget.take(uid, added)
        left_out = len(stats.process_groups) - groups + added - collectives
        del stats.process_groups[groups:]
        del stats.inflight[inflight_before + collectives:]
        return left_out, arrivals

    def _exited_mid_update(self, rank: _Rank, mono: float) -> None:
        """A rank whose process died while writing its counters: exited, its last reading kept."""
        stats = rank.stats or pb.RankStats(pid=rank.pid, uid=rank.uid)
        stats.state = pb.RANK_STATE_EXITED
        rank_exit.fill_exit_unknown(stats, "the process died while writing its segment (its counters are left "
                                           "mid-update), so how it ended is unknown")
        rank.exited_at = mono
        rank.close_counters()
        rank.stats = stats

    def _inert_rank(self, candidate: Candidate) -> list[pb.RankStats]:
        """A process whose hook stayed inert (no segment), from its note; [] once it is gone
        (and the note removed)."""
        claimant = rank_claims.place(candidate, self._folders)
        alive = rank_claims.live_process(claimant.pid, claimant.uid, candidate.changed_ns, candidate.path)
        if alive is None:
            _unlink(candidate.path)  # a regular file of the name's uid: the hook's own note, now stale
            return []
        reason = rank_claims.read_note(candidate) or rank_claims.no_segment_reason(
            os.path.dirname(candidate.path), native.SEGMENT_SIZE)
        stats = pb.RankStats(pid=claimant.pid, uid=claimant.uid, state=rank_state(alive.state))
        _place(stats, claimant)
        stats.hook.inactive_reason = reason
        rank = procfs.rank_from_environ(procfs.read_environ(claimant.pid))
        if rank is not None and rank <= _INT32_MAX:
            stats.rank = rank
        no_data = f"the hook library is inert in this process: {reason}"
        for field in ("rank", "local_rank", "world_size", "step_time_seconds", "gemm_tflops", "device_memory"):
            if not stats.HasField(field):
                stats.unavailable[field] = no_data
        return [stats]

    @staticmethod
    def _cpu_counters(rank: _Rank, status: procfs.ProcessStatus | None) -> _CpuReading:
        """This interval's CPU counters of the rank (one read of its counter groups); ``status``: its
        process's ids as last read (None: gone), for their check that it still acts only as its owner."""
        if rank.cpu_counters is None:
            return _CpuReading(None, rank.cpu_counters_reason, True, frozenset())
        if rank.quiet and _counters_still(rank.cpu_counters):
            assert rank.stats is not None  # a quiet rank's report holds the figures of counters that did not move
            return _CpuReading(rank.stats.pmu, "", False, frozenset())
        try:
            stats = rank.cpu_counters.stats(status)
        except pmu.ProcessLeftItsOwner as exc:  # a set-user-ID exec, another program: closed for good
            log.warning("rank CPU counters closed", extra={"pid": rank.pid, "reason": str(exc)})
            rank.close_counters()
            rank.cpu_counters_reason = str(exc)
            return _CpuReading(None, str(exc), True, frozenset())
        except OSError as exc:  # a read that fails says why; the next interval tries again
            return _CpuReading(None, f"reading the CPU counters of pid {rank.pid} failed: {exc}", True, frozenset())
        return _CpuReading(stats, "", rank.cpu_counters.ran, rank.cpu_counters.idle_threads)

    def _rates(self, rank: _Rank, header: native.Header, now_ns: int, budget: OpsBudget) -> tuple[pb.RankStats, int]:
        """The rank's figures for the interval, and how many of its ops its owner's budget left out."""
        seconds = max((now_ns - rank.read_ns) * 1e-9, 1e-9)
        device_memory = rank.seg.device_memory()  # first: a busy segment leaves the rank's readings as they were
        stats = pb.RankStats(pid=rank.pid, uid=rank.uid, job_id=printable(header.job_id), interval_seconds=seconds,
                             step_count=header.counters.step_count,
                             heartbeat_age_seconds=max(0.0, (now_ns - header.heartbeat_ns) * 1e-9))
        _place(stats, rank.claimant)
        for field in ("rank", "local_rank", "world_size"):
            value = getattr(header, field)
            if value is None:
                stats.unavailable[field] = "not set in the process's environment (RANK/LOCAL_RANK/WORLD_SIZE)"
            else:
                setattr(stats, field, value)
        uid = rank.uid
        left_out = self._slot_stats(rank, header, stats, seconds, budget)
        inflight = rank.seg.inflight()
        reported_inflight = budget.take(uid, len(inflight))
        left_out += len(inflight) - reported_inflight
        stats.inflight.extend(_inflight_ops(inflight[:reported_inflight], now_ns))
        rank.inflight = inflight
        stats.hook.CopyFrom(hook_health(header, inflight))
        _nccl_reason(stats)
        self._host_rates(rank, header, stats, seconds)
        stats.device_memory.CopyFrom(rank_device_memory.device_memory_stats(
            device_memory, rank.device_memory, seconds, now_ns, native))
        rank.device_memory = device_memory
        rank.counters = header.counters
        rank.read_ns = now_ns
        return stats, left_out

    @staticmethod
    def _slot_stats(rank: _Rank, header: native.Header, stats: pb.RankStats, seconds: float, budget: OpsBudget) -> int:
        """The interval's GEMM and NCCL figures of ``rank``, as many as its owner's budget allows; how many
        aggregates were left out. Every slot read is kept (the next interval's rates start from it). A rank
        with no budget left is not read at all (reading the slots is the cost the budget bounds); the next
        reading of its slots is then a baseline, its figures reported from the interval after."""
        uid = rank.uid
        over_budget = (f"not all of this rank's GEMMs are reported: the ranks of uid {uid} have more ops than "
                       f"the agent's per-owner budget of {budget.per_owner}")
        if not budget.left(uid):
            rank.slots = None
            stats.unavailable["gemm_tflops"] = over_budget
            return budget.leave_out(uid, min(header.slots_used, _SLOTS_AT_MOST))
        slots = {rank_rates.slot_key(slot): slot for slot in rank.seg.slots()}
        ops = [(key, slot) for key, slot in slots.items() if slot.kind in ("gemm", "nccl")]
        reported = budget.take(uid, len(ops))
        previous, rank.slots = rank.slots, slots
        if previous is None:
            stats.unavailable["gemm"] = stats.unavailable["nccl"] = stats.unavailable["gemm_tflops"] = _OPS_BASELINE
            return len(ops) - reported
        gemm_deltas = []
        for key, slot in ops[:reported]:
            delta = rank_rates.SlotDelta(slot, previous.get(key))
            if slot.kind == "gemm":
                gemm_deltas.append(delta)
                stats.gemm.append(rank_rates.gemm_stats(delta, seconds))
            else:
                stats.nccl.append(rank_rates.nccl_stats(delta, seconds))
        tflops = rank_rates.total_tflops(gemm_deltas)
        if reported < len(ops):
            stats.unavailable["gemm_tflops"] = over_budget
        elif tflops is None:
            stats.unavailable["gemm_tflops"] = _NO_TIMED_GEMM
        else:
            stats.gemm_tflops = tflops
        return len(ops) - reported

    def _host_rates(self, rank: _Rank, header: native.Header, stats: pb.RankStats, seconds: float) -> None:
        now, before = header.counters, rank.counters
        step = rank_rates.mean_step_seconds(now, before)
        if step is not None:
            rank.step_times.append(step)
        if rank.step_times:
            stats.step_time_seconds = statistics.median(rank.step_times)
        else:
            stats.unavailable["step_time_seconds"] = "no training step finished yet"
        if now.step_count == 0 and now.gc_count == 0 and now.dataloader_count == 0:
            put_unavailable(stats, ("gc_pause_seconds_per_s", "dataloader_wait_seconds_per_s"), _NO_PYTHON_HOOK)
            return
        # a rank seen for the first time is compared with its segment's creation (all counters zero)
        put(stats, "gc_pause_seconds_per_s", scaled(counter_rate(
            before.gc_pause_total_ns if before else 0, now.gc_pause_total_ns, seconds), 1e-9))
        put(stats, "dataloader_wait_seconds_per_s", scaled(counter_rate(
            before.dataloader_wait_total_ns if before else 0, now.dataloader_wait_total_ns, seconds), 1e-9))


def _new_events(rank: _Rank, header: native.Header) -> tuple[list, list[int]]:
    """The rank's NCCL events since its last reading, and when its steps since then ended."""
    head = header.ring_head
    events = [e for e in rank.seg.events(since=rank.ring_read, kind="nccl") if e.index < head]
    steps = [e.end_ns for e in rank.seg.events(since=rank.ring_read, kind="step") if e.index < head and e.end_ns]
    rank.ring_read = head
    return events, steps


def _arrivals(rank: _Rank, stats: pb.RankStats, events: list, step_ends: list[int],
              flight_arrivals: list[Arrival]) -> None:
    """The rank's new collective arrivals (``rank_arrivals``): its NCCL ``events`` since the last reading and
    what its Flight Recorder file lists, of at most MAX_COMMS_PER_RANK communicators; and when its steps
    of the interval ended."""
    _drop_stale_inflight(rank, stats, events)
    if step_ends:
        stats.step_ends_unix_ns.extend(step_ends[-MAX_STEP_ENDS:])
    if not events and not flight_arrivals:
        return  # nothing new (a rank at rest, a Flight Recorder file read before)
    comms = rank.arrivals.take(rank_arrivals.from_nccl_events(events) + flight_arrivals,
                               stats.world_size if stats.HasField("world_size") else None)
    if len(comms) > MAX_COMMS_PER_RANK:
        stats.unavailable["arrivals"] = (f"the arrivals of {len(comms) - MAX_COMMS_PER_RANK} communicators left out: "
                                         f"at most {MAX_COMMS_PER_RANK} per rank and interval")
        del comms[MAX_COMMS_PER_RANK:]
    stats.arrivals.extend(comms)


def _drop_stale_inflight(rank: _Rank, stats: pb.RankStats, events: list) -> None:
    """Leave out the in-flight NCCL entries a later finished collective of the same communicator shows
    finished (one communicator's collectives finish in order), and count each in the hook's health.
    Left in, such an entry makes a healthy rank look stuck at an old collective to the hang detector."""
    for event in events:
        comm = f"{event.comm_hash:x}"
        rank.finished[comm] = max(rank.finished.get(comm, -1), event.op_seq)
    kept = []
    for op in stats.inflight:
        if op.kind == "nccl" and op.sequence < rank.finished.get(op.comm_hash, -1):
            rank.stale.add((op.comm_hash, op.sequence))
        else:
            kept.append(op)
    if len(kept) < len(stats.inflight):
        del stats.inflight[:]
        stats.inflight.extend(kept)
    stats.hook.stale_inflight_total = len(rank.stale)


def _inflight_ops(entries: list[native.Inflight], now_ns: int) -> list[pb.InflightOp]:
    """The segment's in-flight entries as reported, aged at ``now_ns``."""
    return [pb.InflightOp(kind=entry.kind, op=printable(entry.op), sequence=entry.op_seq,
                          comm_hash=f"{entry.key:x}" if entry.kind == "nccl" else "",
                          stream=entry.key if entry.kind in ("gemm", "memcpy") else 0,
                          age_seconds=max(0.0, (now_ns - entry.launched_ns) * 1e-9))
            for entry in entries]


def _rests(rank: _Rank, pulse: native.Pulse, budget: OpsBudget) -> bool:
    """Whether ``rank`` did nothing since its last full reading (its header's data_seq is still what it was
    before it) and can be reported from it; takes its segment's ops from its owner's budget when so."""
    if rank.at_rest is None or pulse.data_seq is None or pulse.data_seq != rank.data_seq:
        return False
    ops = len(rank.at_rest.gemm) + len(rank.at_rest.nccl) + len(rank.inflight)
    if budget.left(rank.uid) < ops:
        return False  # the budget would cut it: a full reading says which ops are left out
    budget.take(rank.uid, ops)
    return True


def _at_rest_report(stats: pb.RankStats) -> pb.RankStats:
    """The segment's part of ``stats`` (a full reading's) as the next reading gives it when nothing changed:
    the same totals, zero rates, no latency, no timed GEMM; without what moves with time (interval,
    heartbeat and in-flight ages: ``_rested`` sets them) and without what is read beside the segment."""
    out = pb.RankStats()
    out.CopyFrom(stats)
    out.ClearField("interval_seconds")
    out.ClearField("heartbeat_age_seconds")
    del out.inflight[:]
    for gemm in out.gemm:
        gemm.count_per_s = 0.0
        gemm.timed_count_interval = 0
        gemm.ClearField("tflops")
        gemm.latency.CopyFrom(pb.LatencyStats())  # as a slot with no timed call in the interval gives it
    for nccl in out.nccl:
        nccl.count_per_s = 0.0
        nccl.ClearField("algbw_bytes_per_s")
        nccl.ClearField("busbw_bytes_per_s")
        nccl.latency.CopyFrom(pb.LatencyStats())
    out.ClearField("gemm_tflops")
    out.unavailable["gemm_tflops"] = _NO_TIMED_GEMM
    for field in ("gc_pause_seconds_per_s", "dataloader_wait_seconds_per_s"):
        if out.HasField(field):
            setattr(out, field, 0.0)
    for copies in out.device_memory.copies:
        copies.calls_per_s = copies.bytes_per_s = 0.0
    return out


def _rested(rank: _Rank, pulse: native.Pulse, now_ns: int) -> pb.RankStats:
    """The report of a rank at rest (``_rests``): its last full reading's, as ``_at_rest_report`` left it,
    with the interval, the heartbeat's age and the in-flight entries' ages of now."""
    assert rank.at_rest is not None
    stats = pb.RankStats()
    stats.CopyFrom(rank.at_rest)
    if rank.inflight:
        stats.inflight.extend(_inflight_ops(rank.inflight, now_ns))
    _retime(rank, stats, pulse, now_ns)
    return stats


def _retime(rank: _Rank, stats: pb.RankStats, pulse: native.Pulse, now_ns: int) -> None:
    """A rank at rest's report given the interval, the heartbeat's age and the allocator figures' age of now."""
    stats.interval_seconds = max((now_ns - rank.read_ns) * 1e-9, 1e-9)
    stats.heartbeat_age_seconds = max(0.0, (now_ns - pulse.heartbeat_ns) * 1e-9)
    if stats.device_memory.HasField("allocator_age_seconds") and rank.device_memory is not None:
        stats.device_memory.allocator_age_seconds = max(0.0, (now_ns - rank.device_memory.allocator_read_ns) * 1e-9)
    rank.read_ns = now_ns


def _counters_still(counters: pmu.RankCounters) -> bool:
    """Whether a quiet rank's counter groups (``_quiet``: they did not move last interval) read as they did,
    told by one read and a comparison each (``CounterGroup.moved``). Then none of its threads ran: nor did
    they exec or change their ids, so the check that it acts as its owner alone holds as it did.
    Counters of user space only cannot tell."""
    sets = counters.counters
    return not sets.software.user_space_only and not sets.software.moved() and \
        (sets.hardware is None or not sets.hardware.moved())


def _throttling(rank: _Rank, stats: pb.RankStats) -> None:
    """The rank's cgroup's CPU throttling over the interval into ``stats`` (a kept report's replaced; the
    reason it is unavailable written only when it is another than the report's: most ranks' every interval)."""
    throttled = rank.sched.cpu_throttled_seconds_per_s(stats.interval_seconds)
    if isinstance(throttled, Unavailable):
        stats.ClearField(_THROTTLED)
        if stats.unavailable.get(_THROTTLED) != throttled.reason:
            stats.unavailable[_THROTTLED] = throttled.reason
    else:
        if _THROTTLED in stats.unavailable:
            del stats.unavailable[_THROTTLED]
        stats.cpu_throttled_seconds_per_s = throttled


def _quiet(rank: _Rank, cpu: _CpuReading, side_files: set[str]) -> bool:
    """Whether a rank at rest gives, this interval, the report it gave when it was last so, but for its times
    and its cgroup's CPU throttling: none of its threads ran (the same no-change CPU figures, no run-queue
    delay), it has no in-flight entries to age, no file beside its segment (nothing of them listed this
    interval nor kept from before) and no function timing request outstanding."""
    return (not cpu.ran and not rank.inflight and rank.functions.sent is None
            and not (rank.exception.text or rank.flight.text or rank.functions.file.text)
            and not side_files.intersection((rank.exception.path, rank.flight.path, rank.functions.file.path)))


def _with_side_files(side_files: set[str]) -> set[str]:
    """The segments (paths) that the listing shows a file beside: their last exception, Flight Recorder
    progress or timed functions (``_quiet``; not the agent's own function timing request)."""
    return {stem for stem, _, suffix in (path.rpartition(".") for path in side_files)
            if f".{suffix}" != rank_function_requests.REQUEST_SUFFIX}


def _place(stats: pb.RankStats, claimant: Claimant) -> None:
    """Where the rank runs: its pid in its container (when it has a pid namespace of its own) and the
    container, pod or SLURM job its cgroup names."""
    if claimant.pid_in_container is not None:
        stats.pid_in_container = claimant.pid_in_container
    else:
        stats.unavailable["pid_in_container"] = containers.SAME_PID_NAMESPACE
    if claimant.container is not None:
        stats.container.CopyFrom(claimant.container)


def _one_per_process(ranks: dict[str, _Rank]) -> list[_Rank]:
    """One segment per process, by pid: the newest (latest verified start). A process that started
    the hook again after an exec (same pid and start time) left its first segment behind, and an
    owner may copy their own segment under other names; neither is another rank."""
    newest: dict[int, _Rank] = {}
    for rank in ranks.values():
        kept = newest.get(rank.pid)
        if kept is None or rank.start_ns > kept.start_ns:
            newest[rank.pid] = rank
    return sorted(newest.values(), key=lambda r: r.pid)


def _nccl_reason(stats: pb.RankStats) -> None:
    """Why a rank has no NCCL figures, when it has none: a single rank, or no profiler plugin."""
    if stats.nccl:
        return
    if stats.HasField("world_size") and stats.world_size == 1:
        stats.unavailable["nccl"] = _NCCL_SINGLE_RANK
    elif not stats.hook.nccl_plugin:
        stats.unavailable["nccl"] = _NCCL_NO_PLUGIN


def _not_read(stats: pb.RankStats, exited: bool) -> pb.RankStats:
    """A rank's report for an interval in which its counters were not read: who it is and how
    it stands, never the previous interval's figures again (they were published once).

    An exited rank keeps its per-op totals (with nothing done since); a live one whose
    segment was busy has its ops in the next reading."""
    out = pb.RankStats()
    out.CopyFrom(stats)
    reason = _NOT_READ_EXITED if exited else _NOT_READ_BUSY
    out.ClearField("interval_seconds")
    for field in _PER_INTERVAL_FIELDS:
        out.ClearField(field)
        out.unavailable[field] = reason
    rank_functions.without_rates(out, reason)
    rank_device_memory.without_rates(out, reason)
    if not exited:
        del out.gemm[:]
        del out.nccl[:]
        out.unavailable["gemm"] = out.unavailable["nccl"] = reason
        return out
    for gemm in out.gemm:
        gemm.count_per_s = 0.0
        gemm.ClearField("tflops")
        gemm.ClearField("latency")
    for nccl in out.nccl:
        nccl.count_per_s = 0.0
        nccl.ClearField("algbw_bytes_per_s")
        nccl.ClearField("busbw_bytes_per_s")
        nccl.ClearField("latency")
    return out


class OpsBudget:
    """How many ops each owner's ranks may still report this interval, and how many were left out."""

    def __init__(self, per_owner: int) -> None:
        self.per_owner = per_owner
        self._reported: dict[int, int] = {}  # plain dicts: asked for every rank of the node every interval
        self._dropped: dict[int, int] = {}

    def left(self, uid: int) -> int:
        """How many more ops ``uid``'s ranks may report this interval."""
        return self.per_owner - self._reported.get(uid, 0)

    def leave_out(self, uid: int, ops: int) -> int:
        """Count ``ops`` of ``uid``'s left out unread; returns ``ops``."""
        self._dropped[uid] = self._dropped.get(uid, 0) + ops
        return ops

    def take(self, uid: int, wanted: int) -> int:
        """How many of ``wanted`` ops of one of ``uid``'s ranks are reported; the rest count as left out."""
        reported = self._reported.get(uid, 0)
        granted = max(0, min(wanted, self.per_owner - reported))
        self._reported[uid] = reported + granted
        if granted < wanted:
            self.leave_out(uid, wanted - granted)
        return granted

    def reason(self, uid: int, left_out: int) -> str:
        return (f"{left_out} of this rank's ops (GEMM and NCCL aggregates, in-flight entries, process groups, timed functions) "
                f"are not reported: the ranks of uid {uid} have more than {self.per_owner} this interval, the "
                "agent's per-owner budget")

    def trim(self, stats: pb.RankStats) -> pb.RankStats:
        """``stats`` (a rank not read this interval) cut to what its owner may still report."""
        left_out = 0
        for ops in (stats.gemm, stats.nccl, stats.inflight, stats.process_groups, stats.functions):
            kept = self.take(stats.uid, len(ops))
            left_out += len(ops) - kept
            del ops[kept:]
        if left_out:
            stats.unavailable["ops"] = self.reason(stats.uid, left_out)
        return stats

    def dropped_entries(self) -> list[pb.RankOpsDropped]:
        """One entry per owner whose ranks had ops left out."""
        return [pb.RankOpsDropped(uid=uid, ops=dropped, reason=(
                    f"the ranks of uid {uid} published {self._reported.get(uid, 0) + dropped} ops (GEMM and NCCL "
                    f"aggregates, in-flight entries, process groups, timed functions) this interval; the agent reports at most "
                    f"{self.per_owner} per owner (in the order it reads the ranks: those it already followed, then "
                    "by pid) and left the rest out"))
                for uid, dropped in sorted(self._dropped.items())]


def hook_health(header: native.Header, inflight: list[native.Inflight]) -> pb.HookHealth:
    """What the hook library could do in this process, and what it counted untimed or lost."""
    c = header.counters
    return pb.HookHealth(
        cuda_timing=bool(header.flags & native.FLAG_CUDA_TIMING),
        nccl_plugin=bool(header.flags & native.FLAG_NCCL_PLUGIN),
        nccl_gpu_timers=bool(header.flags & native.FLAG_NCCL_GPU_TIME),
        gemm_untimed_total=c.gemm_untimed, nccl_untimed_total=c.nccl_untimed,
        dropped_records_total=c.dropped_records, slot_overflow_total=c.slot_overflow,
        nccl_channel_shortfall_total=c.nccl_channel_shortfall, nccl_late_channels_total=c.nccl_late_channels,
        pending=min(sum(e.pending for e in inflight), _UINT32_MAX),
        gemm_timed_first_calls=header.gemm_timed_first, gemm_sample_every=header.gemm_sample_every,
        gemm_sample_max=header.gemm_sample_max,
        nccl_api_fallback=bool(header.flags & native.FLAG_NCCL_API),
        nccl_api_events=bool(header.flags & native.FLAG_NCCL_API_EVENTS),
        nccl_profiler_api=header.nccl_profiler_api,
        nccl_profiler_chain=printable(header.nccl_chain))  # the job wrote it: shown on terminals


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove a stale rank file", extra={"path": path, "reason": str(exc)})
