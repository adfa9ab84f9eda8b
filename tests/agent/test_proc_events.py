"""The kernel's process events (``agentd.proc_events``), heard on the real kernel.

A real process changes its real uid, execs and exits on cue; each is named by the next ``drain``.
A queue the kernel overflowed is reported as lost events. Then the ranks collector that relies on
them: a rank that changes its real uid after it was claimed loses its claim in the next interval (also
when its event was dropped), and a rank stopped and continued shows it in the interval it happened.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from agentd import procfs, proc_events
from agentd.collectors import rank_claims
from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from native.segment_forge import recorded_segment
from testkit.op_segments import with_ops, write_claim
from tuiprof_native import segment

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: processes that change their uid, root's ranks")

# Waits for a line on stdin before each step it is given: "uid" (setresuid to nobody's), "thread" (a thread
# started and ended), "exec" (becomes sleep), anything else: exit. Says "ready" once started and "done" after
# each step.
ON_CUE = """
import os, sys, threading
print("ready", flush=True)
for step in sys.stdin:
    step = step.strip()
    if step == "uid":
        os.setresuid(65534, 65534, 65534)
    elif step == "thread":
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()
    elif step == "exec":
        os.execv("/bin/sleep", ["sleep", "300"])
    else:
        break
    print("done", flush=True)
"""
NOBODY = 65534


@pytest.fixture
def events() -> Iterator[proc_events.ProcessEvents]:
    listener = proc_events.ProcessEvents.subscribe()
    yield listener
    listener.close()


@contextlib.contextmanager
def on_cue() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen([sys.executable, "-c", ON_CUE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        yield process
    finally:
        process.kill()
        process.wait(10)


def cue(process: subprocess.Popen[str], step: str) -> None:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(step + "\n")
    process.stdin.flush()
    if step in ("uid", "thread"):
        assert process.stdout.readline() == "done\n"


def test_a_process_that_changes_its_real_uid_is_named(events):
    with on_cue() as process:
        assert process.pid in events.drain().execs  # its start (python's exec) is heard; nothing since
        assert process.pid not in events.drain().pids
        cue(process, "uid")
        changes = events.drain()
        assert process.pid in changes.pids and process.pid not in changes.execs
        assert procfs.real_uid(process.pid) == NOBODY


def heard_of(events, pid: int, which) -> set[int]:
    """The pids ``which`` takes from the events drained until it names ``pid``, or for 10 s."""
    heard: set[int] = set()
    deadline = time.monotonic() + 10
    while pid not in heard and time.monotonic() < deadline:
        time.sleep(0.01)
        heard |= which(events.drain())
    return heard


def test_a_process_that_execs_is_named_as_such(events):
    with on_cue() as process:
        events.drain()
        cue(process, "exec")
        # the kernel says so once the new program is loaded
        assert process.pid in heard_of(events, process.pid, lambda changes: changes.execs)


def test_a_process_that_exits_is_named(events):
    with on_cue() as process:
        events.drain()
        cue(process, "exit")
        process.wait(10)
        # told after its parent could wait for it
        assert process.pid in heard_of(events, process.pid, lambda changes: changes.exits)


def test_a_thread_that_exits_is_no_process_exit(events):
    """The kernel tells every thread's exit: one of a process's threads names the process, not as exited."""
    with on_cue() as process:
        events.drain()
        cue(process, "thread")
        named: set[int] = set()
        exits: set[int] = set()
        deadline = time.monotonic() + 10  # join() may return before the thread is quite gone
        while process.pid not in named and time.monotonic() < deadline:
            time.sleep(0.01)
            changes = events.drain()
            named |= changes.pids
            exits |= changes.exits
        assert process.pid in named and process.pid not in exits


def test_a_full_queue_is_reported_as_lost_events(events):
    # The listener's queue shrunk to the least the kernel allows (same socket, another descriptor), then
    # overflowed by the events of many short processes.
    with socket.socket(fileno=os.dup(events.fileno())) as same:
        same.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    for _ in range(40):
        subprocess.run(["/bin/true"], check=True)
    assert events.drain().lost
    assert not events.drain().lost  # said once: the kernel reports an overflow to one read


# ------------------------------------------------------------------ the ranks collector that relies on them


@pytest.fixture
def folder() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(dir=segment.SEGMENT_DIR))
    yield path
    shutil.rmtree(path)


def claim(folder: pathlib.Path, pid: int) -> None:
    """A valid segment (4 GEMM ops) claiming root's process ``pid``."""
    write_claim(folder / f"{segment.SEGMENT_PREFIX}0-{pid}", with_ops(recorded_segment(), 4), pid)


def ranks_now(collector: RanksCollector) -> dict[int, pb.RankStats]:
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    return {rank.pid: rank for rank in snapshot.ranks}


def test_the_collector_hears_process_events_as_root(folder):
    collector = RanksCollector(1.0, directory=str(folder))
    try:
        assert collector._events is not None
    finally:
        collector.close()


@pytest.mark.parametrize("drop_its_event", [False, True])
def test_a_rank_that_changes_its_real_uid_loses_its_claim_in_the_next_interval(folder, drop_its_event):
    """Claimed as root's, then it turns nobody's: refused in the next interval, as when its status was read
    every interval; also when the kernel dropped the event that said so (the queue was full)."""
    with on_cue() as process:
        time.sleep(0.05)
        claim(folder, process.pid)
        collector = RanksCollector(1.0, directory=str(folder))
        try:
            for _ in range(3):  # verified, then at rest
                assert ranks_now(collector)[process.pid].state == pb.RANK_STATE_RUNNING
            if drop_its_event:
                assert collector._events is not None
                with socket.socket(fileno=os.dup(collector._events.fileno())) as same:
                    same.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
                for _ in range(40):
                    subprocess.run(["/bin/true"], check=True)
            cue(process, "uid")
            assert process.pid not in ranks_now(collector)
            assert collector.refused()[rank_claims.PROCESS_UID] == 1
        finally:
            collector.close()


def test_a_rank_stopped_and_continued_shows_it_in_the_interval_it_happened(folder):
    """Stopping is done by the process's main thread itself (it ran: its counters moved), continuing by
    whoever sends SIGCONT: a stopped rank's status is read every interval."""
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        time.sleep(0.05)
        claim(folder, sleeper.pid)
        collector = RanksCollector(1.0, directory=str(folder))
        try:
            for _ in range(3):
                assert ranks_now(collector)[sleeper.pid].state == pb.RANK_STATE_RUNNING
            sleeper.send_signal(19)  # SIGSTOP
            wait_for_state(sleeper.pid, procfs.STOPPED)
            assert ranks_now(collector)[sleeper.pid].state == pb.RANK_STATE_STOPPED
            assert ranks_now(collector)[sleeper.pid].state == pb.RANK_STATE_STOPPED
            sleeper.send_signal(18)  # SIGCONT
            wait_for_state(sleeper.pid, procfs.SLEEPING)
            assert ranks_now(collector)[sleeper.pid].state == pb.RANK_STATE_RUNNING
            sleeper.kill()
            sleeper.wait(10)
            assert ranks_now(collector)[sleeper.pid].state == pb.RANK_STATE_EXITED
        finally:
            collector.close()
    finally:
        sleeper.kill()
        sleeper.wait(10)


def wait_for_state(pid: int, state: str) -> None:
    deadline = time.monotonic() + 10
    while procfs.state_of(pid) != state:
        assert time.monotonic() < deadline, f"process {pid} is {procfs.state_of(pid)}, not {state}"
        time.sleep(0.01)
