"""Per-rank telemetry: the training processes' shared-memory segments, turned into rates.

Every process started under `tuiprof run` that does GPU or training work has a
segment /dev/shm/tuiprof-<uid>-<pid> (layout: tuiprof_native/include/
tuiprof_segment.h). Each interval this collector discovers the segments,
reads them (never blocking their writers), and turns the counters into
per-interval RankStats (see ``rank_rates`` for the definitions).

A rank whose process is gone (or whose pid now belongs to a newer process) is
reported as "exited" for ``exited_keep_seconds``, then its segment is deleted.
The agent is not the process's parent, so its exit code or fatal signal comes
from what the process left in its segment, and its last uncaught Python
exception (live or exited) from the file beside it (``rank_exit``). PyTorch
Flight Recorder progress, where the startup hook publishes it, adds per
process group counters and in-flight collectives (``rank_flight``). A live
process whose writer stopped beating is reported with its kernel state and
heartbeat age: judging that is the hang detector's job.

Each rank also gets its own CPU counter group (``agentd.collectors.pmu``,
inheriting into threads and children created later), opened when its segment
is found, read once per interval into ``RankStats.pmu``, and closed when the
rank is seen to exit (after that final reading). A rank whose counters cannot
be opened has ``pmu`` unset and ``unavailable["pmu"]`` saying why.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import statistics
import threading
import time

from agentd import procfs
from agentd.collectors import pmu, rank_exit, rank_flight, rank_rates
from agentd.collectors.rank_files import SidecarFile
from agentd.collectors.base import Collector
from agentd.proto import tuiprof_agent_pb2 as pb

log = logging.getLogger(__name__)

try:
    from tuiprof_native import segment as native
except ImportError as error:  # built by the package's build; say so if it was not
    native = None
    _IMPORT_ERROR = f"tuiprof_native.segment is not built ({error}); reinstall the package"
else:
    _IMPORT_ERROR = ""

STEP_WINDOW = 32
# A rank's state as the console shows it: sleeping and idle ranks are running a job.
_RANK_STATES = {procfs.SLEEPING: "running", "idle": "running", procfs.DEAD: "exited", "tracing-stop": "stopped"}
_NO_PYTHON_HOOK = "no Python startup hook data (not a Python job, or torch was never imported)"


def rank_state(pid: int, segment_start_ns: int) -> str | None:
    """The kernel state of ``pid`` if it is still the process that made the segment, else None."""
    stat = procfs.read_stat(pid)
    if stat is None or not stat.started_by(segment_start_ns):
        return None
    return _RANK_STATES.get(stat.state, stat.state)


@dataclasses.dataclass
class _Rank:
    """One segment being followed, and its previous reading."""

    path: str
    pid: int
    seg: "native.Segment"
    read_ns: int = 0
    slots: dict = dataclasses.field(default_factory=dict)
    counters: object = None
    ring_index: int = 0
    step_times: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=STEP_WINDOW))
    exited_at: float | None = None
    stats: pb.RankStats | None = None
    cpu_counters: "pmu.Counters | None" = None
    cpu_counters_reason: str = ""
    exception: SidecarFile = dataclasses.field(init=False)
    flight: SidecarFile = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.exception = SidecarFile(self.path, native.EXCEPTION_SUFFIX)
        self.flight = SidecarFile(self.path, native.FLIGHT_SUFFIX)

    def close(self) -> None:
        """Unmap the segment and release the counters' file descriptors."""
        self.close_counters()
        self.seg.close()

    def close_counters(self) -> None:
        if self.cpu_counters is not None:
            self.cpu_counters.close()
            self.cpu_counters = None


class RanksCollector(Collector):
    """Discovers rank segments and reports per-rank GEMM/NCCL/step rates."""

    name = "ranks"

    def __init__(self, interval_seconds: float, directory: str | None = None,
                 exited_keep_seconds: float = 30.0) -> None:
        super().__init__(interval_seconds)
        self.directory = directory or (native.SEGMENT_DIR if native else "/dev/shm")
        self.exited_keep_seconds = exited_keep_seconds
        self._ranks: dict[str, _Rank] = {}
        self._unreadable: dict[str, str] = {}
        self._latest: list[pb.RankStats] = []
        self._lock = threading.Lock()
        pmu.raise_fd_limit()  # each rank's counters take one fd per event per thread

    def status(self) -> pb.CollectorStatus:
        if native is None:
            return pb.CollectorStatus(name=self.name, available=False, reason=_IMPORT_ERROR)
        if not os.path.isdir(self.directory):
            return pb.CollectorStatus(name=self.name, available=False,
                                      reason=f"{self.directory} does not exist: no shared memory for rank segments")
        return pb.CollectorStatus(name=self.name, available=True, interval_seconds=self.interval_seconds)

    def collect(self) -> None:
        now_ns = time.time_ns()
        mono = time.monotonic()
        present = set()
        for found in native.discover(self.directory):
            present.add(found.path)
            rank = self._ranks.get(found.path) or self._open(found)
            if rank is not None:
                self._sample(rank, now_ns, mono)
        for path in list(self._ranks):
            rank = self._ranks[path]
            gone_file = path not in present
            expired = rank.exited_at is not None and mono - rank.exited_at >= self.exited_keep_seconds
            if gone_file or expired:
                self._forget(rank, delete=expired and not gone_file)
        self._unreadable = {p: r for p, r in self._unreadable.items() if p in present}
        latest = [r.stats for r in sorted(self._ranks.values(), key=lambda r: r.pid) if r.stats is not None]
        with self._lock:
            self._latest = latest

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        with self._lock:
            snapshot.ranks.extend(self._latest)

    def close(self) -> None:
        for rank in list(self._ranks.values()):
            rank.close()
        self._ranks.clear()

    # ---------------------------------------------------------------- internals

    def _open(self, found) -> _Rank | None:
        try:
            seg = native.Segment(found.path)
        except native.SegmentNotReadyError:
            return None  # being created right now: next interval
        except native.SegmentError as exc:
            if self._unreadable.get(found.path) != str(exc):
                log.warning("rank segment unreadable", extra={"path": found.path, "reason": str(exc)})
            self._unreadable[found.path] = str(exc)
            return None
        rank = _Rank(found.path, found.pid, seg)
        header = seg.header()
        rank.read_ns = header.start_ns  # first rates are since the segment's creation
        try:
            rank.cpu_counters = pmu.process_counters(found.pid)
        except (OSError, RuntimeError) as exc:  # PerfEventError is an OSError; RuntimeError: pmu not built
            rank.cpu_counters_reason = f"CPU counters for pid {found.pid} could not be opened: {exc}"
            log.info("rank CPU counters unavailable", extra={"pid": found.pid, "reason": str(exc)})
        self._ranks[found.path] = rank
        return rank

    def _forget(self, rank: _Rank, delete: bool) -> None:
        rank.close()
        del self._ranks[rank.path]
        rank.exception.remove()
        rank.flight.remove()
        if delete:
            try:
                os.unlink(rank.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot remove exited rank's segment", extra={"path": rank.path, "reason": str(exc)})

    def _sample(self, rank: _Rank, now_ns: int, mono: float) -> None:
        if rank.exited_at is not None:
            return  # its last report stands until it is cleaned up
        header = rank.seg.header()
        state = rank_state(rank.pid, header.start_ns)
        stats = self._rates(rank, header, now_ns)
        self._cpu_counters(rank, stats)
        stats.exception = rank.exception.refresh()
        rank_flight.fill_flight(rank.flight.refresh(), stats, now_ns)
        if state is None:
            rank.exited_at = mono
            rank.close_counters()
            stats.state = "exited"
            rank_exit.fill_exit_status(header, stats, native.FLAG_EXITED)
        else:
            stats.state = state
        rank.stats = stats

    @staticmethod
    def _cpu_counters(rank: _Rank, stats: pb.RankStats) -> None:
        """This interval's CPU counters of the rank (one read of its counter groups)."""
        if rank.cpu_counters is None:
            stats.unavailable["pmu"] = rank.cpu_counters_reason
            return
        try:
            stats.pmu.CopyFrom(rank.cpu_counters.stats())
        except OSError as exc:  # a read that fails says why; the next interval tries again
            stats.unavailable["pmu"] = f"reading the CPU counters of pid {rank.pid} failed: {exc}"

    def _rates(self, rank: _Rank, header, now_ns: int) -> pb.RankStats:
        seconds = max((now_ns - rank.read_ns) * 1e-9, 1e-9)
        stats = pb.RankStats(pid=header.pid, job_id=header.job_id, step_count=header.counters.step_count,
                             heartbeat_age_seconds=max(0.0, (now_ns - header.heartbeat_ns) * 1e-9))
        for field in ("rank", "local_rank", "world_size"):
            value = getattr(header, field)
            if value is None:
                stats.unavailable[field] = "not set in the process's environment (RANK/LOCAL_RANK/WORLD_SIZE)"
            else:
                setattr(stats, field, value)
        gemm_deltas = []
        slots = {}
        for slot in rank.seg.slots():
            key = rank_rates.slot_key(slot)
            slots[key] = slot
            delta = rank_rates.SlotDelta(slot, rank.slots.get(key))
            if slot.kind == "gemm":
                gemm_deltas.append(delta)
                stats.gemm.append(rank_rates.gemm_stats(delta, seconds))
            elif slot.kind == "nccl":
                stats.nccl.append(rank_rates.nccl_stats(delta, seconds))
        tflops = rank_rates.total_tflops(gemm_deltas)
        if tflops is None:
            stats.unavailable["gemm_tflops"] = "no timed GEMM finished in the interval"
        else:
            stats.gemm_tflops = tflops
        for entry in rank.seg.inflight():
            stats.inflight.append(pb.InflightOp(
                kind=entry.kind, op=entry.op, sequence=entry.op_seq,
                comm_hash=f"{entry.key:x}" if entry.kind == "nccl" else "",
                stream=entry.key if entry.kind == "gemm" else 0,
                age_seconds=max(0.0, (now_ns - entry.launched_ns) * 1e-9)))
        self._host_rates(rank, header, stats, seconds)
        rank.slots = slots
        rank.counters = header.counters
        rank.read_ns = now_ns
        return stats

    def _host_rates(self, rank: _Rank, header, stats: pb.RankStats, seconds: float) -> None:
        for event in rank.seg.events(since=rank.ring_index, kind="step"):
            if event.end_ns and event.end_ns > event.start_ns:
                rank.step_times.append((event.end_ns - event.start_ns) * 1e-9)
        rank.ring_index = header.ring_head
        if rank.step_times:
            stats.step_time_seconds = statistics.median(rank.step_times)
        else:
            stats.unavailable["step_time_seconds"] = "no training step finished yet"
        now, before = header.counters, rank.counters
        if now.step_count == 0 and now.gc_count == 0 and now.dataloader_count == 0:
            stats.unavailable["gc_pause_seconds_per_s"] = _NO_PYTHON_HOOK
            stats.unavailable["dataloader_wait_seconds_per_s"] = _NO_PYTHON_HOOK
            return
        gc_ns = now.gc_pause_total_ns - (before.gc_pause_total_ns if before else 0)
        dl_ns = now.dataloader_wait_total_ns - (before.dataloader_wait_total_ns if before else 0)
        stats.gc_pause_seconds_per_s = gc_ns * 1e-9 / seconds
        stats.dataloader_wait_seconds_per_s = dl_ns * 1e-9 / seconds
