"""Taking the stacks of this host's ranks and pre-merging them into one tree.

Only processes the ranks collector knows (they registered a tuiprof segment)
are ever dumped: the agent does not ptrace arbitrary processes. Each target is
the process the ranks collector reported, pinned by its start time, owner,
credentials and program; just before py-spy runs the pid is read again, and a
pid the kernel has since handed to another process, or a rank that no longer
acts only as its owner (it exec'd a set-user-ID program: ``procfs.ineligible_reason``),
is not dumped.

py-spy stops the target while it reads it, so dumps are a cost to the training
job. ``RankDumper`` keeps that cost bounded however many clients ask: requests
for a rank while its dump runs share that dump, and after a dump the rank is
left alone for ``1 / MAX_DUTY`` times as long as the dump took (at least
``MIN_GAP_SECONDS``, at most ``MAX_GAP_SECONDS``: a one-second native dump buys
a minute). A request in that gap is answered at once, as ``py-spy dump`` would
be, with the last dump marked ``cached``, its age and when the rank may be
dumped again: a client asking in a loop gets one new dump per gap.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from agentd import procfs
from agentd.hang import pyspy
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.stacks.merge import merge
from agentd.stacks.wire import samples_from_ranks, tree_to_proto

# Dumps are CPU-bound (native ones symbolize libtorch): more at once than CPUs only adds contention.
MAX_PARALLEL_DUMPS = min(8, os.cpu_count() or 1)
# At most this share of a rank's time is spent stopped under py-spy.
MAX_DUTY = 0.02
MIN_GAP_SECONDS = 1.0
MAX_GAP_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class DumpTarget:
    """A rank process as the ranks collector reported it, pinned to one process."""

    pid: int
    rank: int | None
    uid: int | None
    start_ns: int   # when the kernel started it, read when the ranks collector first reported it
    # What it acted as and ran when pinned: root ptraces it on its owner's behalf only while it still does.
    credentials: procfs.Credentials | None = None

    @classmethod
    def pin(cls, pid: int, rank: int | None, uid: int | None) -> DumpTarget | None:
        """The process ``pid`` is now (its start time, credentials and program; its real uid unless
        ``uid`` is known); None if gone."""
        stat = procfs.read_stat(pid)
        if stat is None:
            return None
        owner = uid if uid is not None else procfs.real_uid(pid)
        held = procfs.credentials(pid, owner) if owner is not None else None
        return cls(pid, rank, owner, stat.start_ns, held)

    def still_same_process(self) -> str:
        """Empty when the pid still names this process; else why it does not."""
        stat = procfs.read_stat(self.pid)
        if stat is None:
            return "process is gone: no stacks to take"
        if stat.start_ns != self.start_ns:
            return "the pid now belongs to a newer process (the rank exited): not dumped"
        if self.uid is not None and procfs.real_uid(self.pid) != self.uid:
            return "the process changed owner since it registered: not dumped"
        if self.credentials is not None:
            reason = procfs.ineligible_reason(self.pid, self.credentials)
            if reason:
                return f"not dumped: {reason}; py-spy runs as root and would read it on its owner's behalf"
        return ""


@dataclasses.dataclass(frozen=True)
class _LastDump:
    stacks: pb.RankStacks
    native: bool
    taken_at: float      # monotonic time the dump ended
    quiet_until: float   # monotonic time before which this rank is not dumped again


DumpFunction = Callable[[pathlib.Path, int, "int | None", bool], pb.RankStacks]


class RankDumper:
    """py-spy dumps of one target at a time, shared by concurrent requests, duty-limited."""

    def __init__(self, binary: pathlib.Path, dump: DumpFunction = pyspy.dump,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.binary = binary
        self._dump = dump
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[tuple[int, int], Future[pb.RankStacks]] = {}
        self._last: dict[tuple[int, int], _LastDump] = {}
        self.dumps_run = 0  # py-spy runs so far (for logs and tests)

    def stacks(self, target: DumpTarget, native: bool) -> pb.RankStacks:
        key = (target.pid, target.start_ns)
        with self._lock:
            last = self._last.get(key)
            if last is not None and self._clock() < last.quiet_until:
                return _cached(last, native, self._clock())
            running = self._running.get(key)
            if running is None:
                future: Future[pb.RankStacks] = Future()
                self._running[key] = future
        if running is not None:
            return _copy(running.result())
        try:
            stacks = self._run(target, native)
            future.set_result(stacks)
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._running[key]
        return _copy(stacks)

    def forget(self, live: set[tuple[int, int]]) -> None:
        """Drop what is kept of processes that are no longer ranks."""
        with self._lock:
            for key in set(self._last) - live:
                del self._last[key]

    def _run(self, target: DumpTarget, native: bool) -> pb.RankStacks:
        why_not = target.still_same_process()
        if why_not:
            stacks = pb.RankStacks(pid=target.pid, error=why_not)
            if target.rank is not None:
                stacks.rank = target.rank
            return stacks
        started = self._clock()
        stacks = self._dump(self.binary, target.pid, target.rank, native)
        ended = self._clock()
        gap = min(MAX_GAP_SECONDS, max(MIN_GAP_SECONDS, (ended - started) / MAX_DUTY))
        with self._lock:
            self.dumps_run += 1
            self._last[(target.pid, target.start_ns)] = _LastDump(stacks, native, ended, ended + gap)
        return stacks


def _copy(stacks: pb.RankStacks) -> pb.RankStacks:
    out = pb.RankStacks()
    out.CopyFrom(stacks)
    return out


def _cached(last: _LastDump, native: bool, now: float) -> pb.RankStacks:
    """The last dump, served again with its age; a native request served Python frames says so."""
    out = _copy(last.stacks)
    out.cached = True
    out.age_seconds = now - last.taken_at
    out.next_dump_in_seconds = last.quiet_until - now
    if native and not last.native and not out.error:
        out.error = (f"native frames not taken: this rank's last dump, {out.age_seconds:.1f} s old, has Python "
                     f"frames only, and the rank is left alone for {out.next_dump_in_seconds:.1f} s more "
                     "(py-spy stops the process)")
    return out


class StackTaker:
    def __init__(self, binary: pathlib.Path, hostname: str | None = None,
                 dumper: RankDumper | None = None) -> None:
        self.dumper = dumper or RankDumper(binary)
        self.hostname = hostname or socket.gethostname()

    def take(self, targets: Sequence[DumpTarget], native: bool) -> pb.StacksReply:
        """Every target's threads, and the ranks' stacks merged into one prefix tree."""
        ranks: list[pb.RankStacks] = []
        if targets:
            with ThreadPoolExecutor(min(MAX_PARALLEL_DUMPS, len(targets)), "stack-dump") as pool:
                ranks.extend(pool.map(lambda target: self.dumper.stacks(target, native), targets))
        return merged_reply(self.hostname, time.time_ns(), ranks)


def merged_reply(hostname: str, taken_unix_ns: int, ranks: Sequence[pb.RankStacks]) -> pb.StacksReply:
    """A StacksReply of ``ranks`` with the tree of those that have a rank number (the console places
    the others, each under its pid, among every host's ranks)."""
    reply = pb.StacksReply(hostname=hostname, taken_unix_ns=taken_unix_ns)
    reply.ranks.extend(ranks)
    reply.merged.CopyFrom(tree_to_proto(merge(samples_from_ranks(reply.ranks))))
    return reply
