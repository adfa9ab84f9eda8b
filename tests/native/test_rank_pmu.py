"""Per-rank CPU counters (RankStats.pmu): a real busy process under `tuiprof run`,
its task clock checked against the kernel's own CPU time in /proc/<pid>/stat,
the counter file descriptors released when the rank exits, and the per-rank
families in a real agentd's /metrics."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from native.support import segment_path, tuiprof_run, watch_rank
from testkit.agents import running_agent
from tuiprof_native import segment

# A rank that makes its segment, waits, then burns one CPU on a thread started
# only when told (after the agent opened its counters: that thread is counted
# through inherit, not because it existed at discovery).
BUSY_RANK = """
import ctypes, os, sys, threading
ctypes.CDLL(os.environ['TUIPROF_HOOK_LIBRARY']).tuiprof_record_step()
print('ready', flush=True)
sys.stdin.readline()
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
print('spinning', flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def busy_rank(cleanup_segments):
    proc = tuiprof_run(sys.executable, "-c", BUSY_RANK, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       env={"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    cleanup_segments.append(proc.pid)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def start_spinning(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "spinning"


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process, as the kernel accounts it."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def perf_fds() -> int:
    """perf_event file descriptors this process holds."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the fd listdir itself used
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[perf_event]"
    return count


@pytest.fixture
def shm_dir() -> Iterator[pathlib.Path]:
    """A folder on the segments' own tmpfs, for hard links to them (the collector refuses symlinks)."""
    path = pathlib.Path(tempfile.mkdtemp(dir=segment.SEGMENT_DIR))
    yield path
    shutil.rmtree(path)


def collector_for(directory: pathlib.Path, pid: int, **options) -> RanksCollector:
    """A ranks collector that sees only ``pid``'s segment (other tests' ranks run beside this one)."""
    os.link(segment_path(pid), directory / segment_path(pid).name)
    return RanksCollector(1.0, directory=str(directory), **options)


def rank_of(collector: RanksCollector, pid: int) -> pb.RankStats:
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    (rank,) = [r for r in snapshot.ranks if r.pid == pid]
    return rank


def test_busy_rank_task_clock_matches_proc_stat(busy_rank, shm_dir):
    pid = busy_rank.pid
    collector = collector_for(shm_dir, pid)
    try:
        collector.collect()  # discovery opens the counters
        first = rank_of(collector, pid)
        assert first.pmu.scope == "process"
        assert first.pmu.unavailable["task_clock_cpus"] == "first sample"
        start_spinning(busy_rank)
        collector.collect()
        cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
        time.sleep(1.5)
        collector.collect()
        cpu_after, wall_after = cpu_seconds(pid), time.monotonic()
        rank = rank_of(collector, pid)
    finally:
        collector.close()
    kernel_cpus = (cpu_after - cpu_before) / (wall_after - wall_before)
    assert kernel_cpus > 0.3, "the spinning thread hardly ran; the machine is overloaded"
    # clock ticks are 10 ms: over 1.5 s the kernel figure is good to about 0.02 CPUs
    assert rank.pmu.task_clock_cpus == pytest.approx(kernel_cpus, abs=0.06)
    assert rank.pmu.context_switches_per_s >= 0 and rank.pmu.page_faults_per_s >= 0
    if rank.pmu.hardware_available:
        assert rank.pmu.mips > 0 and rank.pmu.ipc > 0
    else:  # no PMU (a VM): every hardware figure absent, with the reason
        assert rank.pmu.hardware_reason
        assert not rank.pmu.HasField("mips") and not rank.pmu.HasField("ipc")
        assert rank.pmu.hardware_reason in rank.pmu.unavailable["ipc"]


def test_exited_rank_counters_are_released(busy_rank, shm_dir):
    before = perf_fds()
    collector = collector_for(shm_dir, busy_rank.pid, exited_keep_seconds=60)
    try:
        collector.collect()
        assert perf_fds() > before
        busy_rank.kill()
        busy_rank.wait(timeout=10)
        collector.collect()
        rank = rank_of(collector, busy_rank.pid)
        assert rank.state == pb.RANK_STATE_EXITED
        assert rank.HasField("pmu")  # the final reading, taken before closing
        assert perf_fds() == before
    finally:
        collector.close()


def test_rank_whose_counters_cannot_open_says_why(cleanup_segments, shm_dir):
    proc = tuiprof_run(sys.executable, "-c", BUSY_RANK, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    cleanup_segments.append(proc.pid)
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait(timeout=10)
    collector = collector_for(shm_dir, proc.pid)
    try:
        collector.collect()  # the segment is there, the process is not
        rank = rank_of(collector, proc.pid)
    finally:
        collector.close()
    assert rank.state == pb.RANK_STATE_EXITED and not rank.HasField("pmu")
    assert f"pid {proc.pid} could not be opened" in rank.unavailable["pmu"]
    assert "ESRCH" in rank.unavailable["pmu"]


async def test_agent_serves_rank_counters_over_grpc_and_metrics(tmp_path, busy_rank):
    pid = busy_rank.pid
    with running_agent(tmp_path) as agent:
        await watch_rank(agent, pid, lambda r: r.HasField("pmu"))
        start_spinning(busy_rank)
        rank = await watch_rank(agent, pid, lambda r: r.pmu.task_clock_cpus > 0.3)
        with urllib.request.urlopen(f"{agent.metrics_url}/metrics", timeout=10) as response:
            lines = [line for line in response.read().decode().splitlines() if f'pid="{pid}"' in line]
    task_clock = [line for line in lines if line.startswith("tuiprof_rank_pmu_task_clock_seconds_per_second{")]
    assert len(task_clock) == 1 and 'rank="0"' in task_clock[0], lines
    assert float(task_clock[0].rsplit(" ", 1)[1]) > 0
    (hardware,) = [line for line in lines if line.startswith("tuiprof_rank_pmu_hardware_available{")]
    assert hardware.endswith(f" {int(rank.pmu.hardware_available)}")
    if not rank.pmu.hardware_available:
        assert not any(line.startswith("tuiprof_rank_pmu_instructions_per_second{") for line in lines)


def test_a_counter_group_tells_whether_it_moved_since_its_last_read():
    """``CounterGroup.moved``: one read compared with the last ``read`` (counts and times), the quiet rank's
    check that none of its threads ran. A stopped process's group stays; one that ran moved."""
    from tuiprof_native import pmu

    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); sum(range(10**6))"],
                               stdin=subprocess.PIPE)
    try:
        time.sleep(0.2)  # started, waiting on stdin
        counters = pmu.CounterSet.for_process(process.pid, ["task_clock"])
        try:
            assert counters.moved()  # never read: nothing to compare with
            counters.sample()
            time.sleep(0.1)
            assert not counters.moved() and not counters.moved()
            process.stdin.write(b"go\n")
            process.stdin.flush()
            process.wait(10)  # it ran, then exited
            assert counters.moved()
            counters.sample()
            assert not counters.moved()
        finally:
            counters.close()
    finally:
        process.kill()
        process.wait(10)
