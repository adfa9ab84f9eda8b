"""A job's segments are removed after it ends, with no agent running (issue 25 item 8).

Real `tuiprof run` Python jobs in a private mount namespace (its own 8 MiB /dev/shm, room for three
segments: no agent reads it, no other test's files are there): one killed by Ctrl-C's SIGINT (Python
dies of the signal again: no exit handler of the hook runs) and one by SIGKILL. Each segment stays while
an agent would still report the exit, then goes with its side files; the segment of a job still running
stays. (A job that exits normally releases its segment the same way: its process ends.)
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from testkit.namespaces import Namespace, unavailable_reason, wait_ready
from tuiprof_native import segment, stale_segments
from tuiprof_native.stale_segments import GRACE_SECONDS, SETTLE_SECONDS, SIDECAR_SUFFIXES

pytestmark = pytest.mark.slow

JOB = textwrap.dedent("""
    import ctypes, os, sys, time
    ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"]).tuiprof_record_step()  # the hook makes its segment
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def namespace():
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with Namespace.create() as ns:
        yield ns


def start_job(namespace: Namespace) -> subprocess.Popen[str]:
    return wait_ready(namespace.popen([sys.executable, "-m", "tuiprof.cli", "run", "--no-kineto-daemon", "--",
                                       sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True))


def segment_of(shm: pathlib.Path, pid: int) -> pathlib.Path:
    (path,) = [p for p in shm.glob(f"tuiprof-{os.getuid()}-{pid}-*") if not p.suffix]
    return path


def test_ended_jobs_segments_go_after_the_grace_and_a_running_jobs_stays(namespace):
    shm = pathlib.Path(f"/proc/{namespace.holder.pid}/root/dev/shm")
    running, interrupted, killed = (start_job(namespace) for _ in range(3))
    paths = {job.pid: segment_of(shm, job.pid) for job in (running, interrupted, killed)}
    with segment.Segment(paths[killed.pid]) as seg:
        assert seg.header().flags & segment.FLAG_LOCKED  # held while the process lives
    try:
        interrupted.send_signal(signal.SIGINT)
        killed.kill()
        assert (interrupted.wait(30), killed.wait(30)) == (-signal.SIGINT, -signal.SIGKILL)
        ended = time.monotonic()
        ended_paths = [paths[job.pid] for job in (interrupted, killed)]
        sidecars = [path.with_name(path.name + suffix) for path in ended_paths for suffix in (".exception", ".flight")]
        assert all(path.exists() for path in ended_paths + sidecars)
        assert {".exception", ".flight"} <= set(SIDECAR_SUFFIXES)

        deadline = ended + SETTLE_SECONDS + GRACE_SECONDS + 20
        while any(path.exists() for path in ended_paths) and time.monotonic() < deadline:
            time.sleep(0.5)
            if time.monotonic() - ended < SETTLE_SECONDS + GRACE_SECONDS - 1:  # an agent may still report them
                assert all(path.exists() for path in ended_paths), "removed before the grace ended"
        assert not [path for path in ended_paths + sidecars if path.exists()]
        assert paths[running.pid].exists()  # its writer lives: not touched by the others' watchers
    finally:
        running.kill()
        running.wait(30)


def test_another_watchers_look_is_not_taken_for_a_writer(namespace):
    """Ranks killed together start their watchers together, and each watcher locks every segment of its user
    exclusively for the moment it looks: a lock held that briefly must not read as a live writer's (the
    segment would then be left in /dev/shm for good), while a running job's lock always does."""
    shm = pathlib.Path(f"/proc/{namespace.holder.pid}/root/dev/shm")
    running, killed = start_job(namespace), start_job(namespace)
    ended, live = segment_of(shm, killed.pid), segment_of(shm, running.pid)
    try:
        killed.kill()
        killed.wait(30)
        fd = os.open(ended, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)  # another watcher looking, for 30 ms
        release = threading.Timer(0.03, fcntl.flock, (fd, fcntl.LOCK_UN))
        release.start()
        try:
            assert stale_segments.unwritten(str(shm), os.getuid()) == {ended.name}
        finally:
            release.join()
            os.close(fd)
        assert live.exists() and live.name not in stale_segments.unwritten(str(shm), os.getuid())
    finally:
        running.kill()
        running.wait(30)
