"""The ranks collector's cost for real idle ranks under ``tuiprof run``, against ``ranks_cost.py``'s sleeps.

``N`` Python processes run with ``tuiprof run``'s environment (the hook library preloaded, the startup
hook), each recording one training step (so the hook makes its segment and starts its writer thread) and
then sleeping: a job that waits. Unlike a ``sleep`` the hook's writer thread wakes every few milliseconds,
so the rank's CPU counters move every interval. They run as root in a mount namespace of their own whose
/dev/shm is a private folder, read by ``RanksCollector(1.0, directory=<folder>)`` once a second for
``SECONDS`` after a cold interval; CPU time of ``collect()`` + ``fill()`` per rank and interval.

    .venv/bin/python bench/containers/idle_hooked_ranks.py 100 30

Root (unshare). Every rank is killed at the end, by its pid.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.commands.run import launch_environment
from tuiprof_native import segment

IDLE_RANK = """
import ctypes, os, time
ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"]).tuiprof_record_step()
os.write(1, f"{os.getpid()}\\n".encode())  # one write: the ranks share the pipe
time.sleep(3600)  # until the bench kills it
"""
READY_SECONDS = 120.0


def main() -> None:
    ranks, seconds = int(sys.argv[1]), int(sys.argv[2])
    folder = pathlib.Path(tempfile.mkdtemp(dir=segment.SEGMENT_DIR))
    folder.chmod(0o1777)
    env = launch_environment({**os.environ, "HOME": "/tmp"}, kineto_daemon=False)
    starts = " ".join(f"{shlex.quote(sys.executable)} -c {shlex.quote(IDLE_RANK)} &" for _ in range(ranks))
    group = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         f"mount --bind {shlex.quote(str(folder))} /dev/shm && {starts} wait"],
        env=env, stdout=subprocess.PIPE, text=True)
    pids: set[int] = set()
    try:
        assert group.stdout is not None
        lines = [group.stdout.readline() for _ in range(ranks)]
        pids.update(int(line) for line in lines)
        deadline = time.monotonic() + READY_SECONDS
        while len([p for p in folder.iterdir() if p.name.startswith(segment.SEGMENT_PREFIX) and "." not in p.name]) \
                < ranks:
            assert time.monotonic() < deadline, "the ranks' segments did not appear"
            time.sleep(0.2)
        collector = RanksCollector(1.0, directory=str(folder))
        try:
            cold = measured(collector, pids)
            intervals = []
            for _ in range(seconds):
                time.sleep(1.0)
                intervals.append(measured(collector, pids))
        finally:
            collector.close()
        median = statistics.median(intervals)
        print(f"{ranks} idle ranks under tuiprof run, read once a second for {seconds} s: cold interval "
              f"{cold * 1e3:.0f} ms; median interval {median * 1e3:.1f} ms, {median / ranks * 1e6:.0f} µs a rank, "
              f"{sum(intervals) / seconds * 100:.2f} % of a core; load average {os.getloadavg()[0]:.1f}")
    finally:
        for pid in _children(group.pid):  # the ranks, also those that never said their pid
            os.kill(pid, signal.SIGKILL)
        group.kill()
        group.wait(30)
        shutil.rmtree(folder)


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (its threads' children, from /proc)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    children = []
    for tid in tasks:
        with open(f"/proc/{pid}/task/{tid}/children") as listed:
            children += [int(child) for child in listed.read().split()]
    return children


def measured(collector: RanksCollector, pids: set[int]) -> float:
    """One interval's CPU seconds; every rank must be in it, running."""
    started = time.process_time()
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    spent = time.process_time() - started
    running = {rank.pid for rank in snapshot.ranks if rank.state == pb.RANK_STATE_RUNNING}
    if not pids <= running:
        raise RuntimeError(f"{len(pids - running)} ranks missing or not running; refused: {collector.refused()}")
    return spent


if __name__ == "__main__":
    main()
