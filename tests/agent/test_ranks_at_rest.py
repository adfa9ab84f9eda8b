"""A rank at rest (issue 28's cost): its segment's ``data_seq`` unchanged since the last full reading.

Root's own ``sleep`` processes with real segments of 4 GEMM ops (tests/testkit/op_segments.py) in a
private folder on /dev/shm. A rank whose segment did not change is served from its last full reading
with the figures a reading with no change gives; one whose segment changed (its ``data_seq`` bumped,
as the hook does after a pass that wrote) is read again in that interval; a segment of the layout
before ``data_seq`` is read in full every interval.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentd.collectors import rank_claims, rank_sched, ranks
from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from native.segment_forge import PID_OFFSET, recorded_segment
from testkit.op_segments import SLOT_COUNT, check_ops, with_ops, write_claim
from tuiprof_native import segment

OPS = 4
LAYOUT_VERSION_OFFSET = 8  # tp_header.layout_version
DATA_SEQ_OFFSET = 384      # tp_header.data_seq

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the collector checks segment owners as root")


@pytest.fixture
def folder() -> Iterator[pathlib.Path]:
    """A private folder on the segments' tmpfs."""
    path = pathlib.Path(tempfile.mkdtemp(dir=segment.SEGMENT_DIR))
    yield path
    shutil.rmtree(path)


@contextlib.contextmanager
def rank_running(folder: pathlib.Path, *command: str, **popen: Any) -> Iterator[tuple[pathlib.Path, subprocess.Popen]]:
    """``command`` running (``popen``: subprocess.Popen's options), with a segment of OPS GEMM ops (each
    called once) claiming it in ``folder``."""
    prefix = with_ops(recorded_segment(), OPS)
    check_ops(prefix, OPS)
    process = subprocess.Popen(command, **popen)
    try:
        time.sleep(0.05)  # started before its segment
        path = folder / f"{segment.SEGMENT_PREFIX}{os.getuid()}-{process.pid}"
        write_claim(path, prefix, process.pid)
        yield path, process
    finally:
        process.kill()
        process.wait(10)


@pytest.fixture
def one_rank(folder) -> Iterator[tuple[pathlib.Path, subprocess.Popen]]:
    """A sleeper and its segment, in a private folder."""
    with rank_running(folder, "sleep", "300") as rank:
        yield rank


def read(collector: RanksCollector, pid: int) -> pb.RankStats:
    collector.collect()
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    [rank] = [rank for rank in snapshot.ranks if rank.pid == pid]
    return rank


def call_first_op_again(path: pathlib.Path, calls: int, bump_data_seq: bool) -> None:
    """What the hook does when the first GEMM shape is called ``calls`` more times: its slot's count, and
    (``bump_data_seq``) the header's data_seq at the end of the writer's pass."""
    with path.open("r+b") as f:
        slot_count = segment.SLOTS_OFFSET + SLOT_COUNT
        count = struct.unpack("<Q", os.pread(f.fileno(), 8, slot_count))[0]
        os.pwrite(f.fileno(), struct.pack("<Q", count + calls), slot_count)
        if bump_data_seq:
            data_seq = struct.unpack("<Q", os.pread(f.fileno(), 8, DATA_SEQ_OFFSET))[0]
            os.pwrite(f.fileno(), struct.pack("<Q", data_seq + 1), DATA_SEQ_OFFSET)


@pytest.fixture
def rested(monkeypatch) -> list[int]:
    """The pids of the ranks served at rest, one entry per interval each was."""
    pids: list[int] = []
    serve = ranks._rested

    def counted(rank, pulse, now_ns):
        pids.append(rank.pid)
        return serve(rank, pulse, now_ns)

    monkeypatch.setattr(ranks, "_rested", counted)
    return pids


def without_time(stats: pb.RankStats) -> pb.RankStats:
    """``stats`` less what differs between two readings of an unchanged segment: the interval's length, the
    heartbeat's age, and the kernel's figures of the interval."""
    out = pb.RankStats()
    out.CopyFrom(stats)
    for field in ("interval_seconds", "heartbeat_age_seconds", "pmu", "run_delay_seconds_per_s",
                  "cpu_throttled_seconds_per_s"):
        out.ClearField(field)
        out.unavailable.pop(field, None)
    return out


def test_an_unchanged_rank_is_served_at_rest_as_a_full_reading_reports_it(one_rank, rested, monkeypatch):
    path, sleeper = one_rank
    collector = RanksCollector(1.0, directory=str(path.parent))
    try:
        first = read(collector, sleeper.pid)  # since the segment's creation: every op called once
        assert [op.count_per_s > 0 for op in first.gemm] == [True] * OPS
        time.sleep(0.05)
        at_rest = read(collector, sleeper.pid)
        assert rested == [sleeper.pid]
        assert at_rest.pmu.scope == "process" and at_rest.state == pb.RANK_STATE_RUNNING and at_rest.interval_seconds > 0.04
        assert [(op.count_total, op.count_per_s) for op in at_rest.gemm] == [(1, 0.0)] * OPS
        monkeypatch.setattr(ranks, "_rests", lambda *_: False)  # the same segment read in full
        time.sleep(0.05)
        full = read(collector, sleeper.pid)
        assert rested == [sleeper.pid]
        assert without_time(at_rest) == without_time(full)
    finally:
        collector.close()


def test_a_rank_whose_segment_changed_is_read_again_in_that_interval(one_rank, rested):
    path, sleeper = one_rank
    collector = RanksCollector(1.0, directory=str(path.parent))
    try:
        read(collector, sleeper.pid)
        read(collector, sleeper.pid)
        assert rested == [sleeper.pid]
        call_first_op_again(path, calls=5, bump_data_seq=True)
        changed = read(collector, sleeper.pid)
        assert rested == [sleeper.pid]  # read in full
        assert [op.count_total for op in changed.gemm] == [6] + [1] * (OPS - 1)
        assert changed.gemm[0].count_per_s * changed.interval_seconds == pytest.approx(5)
        assert read(collector, sleeper.pid).gemm[0].count_per_s == 0.0  # at rest again: nothing new
    finally:
        collector.close()


def test_a_segment_without_data_seq_is_read_in_full_every_interval(one_rank, rested):
    path, sleeper = one_rank
    with path.open("r+b") as f:
        os.pwrite(f.fileno(), struct.pack("<I", segment.LAYOUT_VERSION_NO_DATA_SEQ), LAYOUT_VERSION_OFFSET)
    collector = RanksCollector(1.0, directory=str(path.parent))
    try:
        read(collector, sleeper.pid)
        read(collector, sleeper.pid)
        assert not rested
        call_first_op_again(path, calls=3, bump_data_seq=False)  # an earlier hook: no data_seq to bump
        assert read(collector, sleeper.pid).gemm[0].count_total == 4
    finally:
        collector.close()


def test_a_rank_that_did_not_run_has_its_scheduler_figures_without_reading_them(folder, monkeypatch):
    """A process none of whose threads had a CPU since the last interval (its CPU counters, task clock
    included, did not move) waited on no run queue either: its run-queue delay is 0 without reading its
    threads' schedstat files. One that spins a CPU without touching its segment (at rest) has them read
    every interval, and its CPU figures show the spinning."""
    read_tasks: list[str] = []
    task_delays = rank_sched._task_delays

    def counted(task_dir, unchanged):
        read_tasks.append(task_dir)
        return task_delays(task_dir, unchanged)

    monkeypatch.setattr(rank_sched, "_task_delays", counted)
    spin = (sys.executable, "-c", "while True: pass")
    with rank_running(folder, "sleep", "300") as (_, sleeper), rank_running(folder, *spin) as (_, spinner):
        collector = RanksCollector(1.0, directory=str(folder))
        try:
            for _ in range(2):  # discovery, then the first interval with rates
                collector.collect()
                time.sleep(0.3)
            del read_tasks[:]
            collector.collect()
            snapshot = pb.HostSnapshot()
            collector.fill(snapshot)
        finally:
            collector.close()
    at_rest = {rank.pid: rank for rank in snapshot.ranks}
    assert read_tasks == [f"/proc/{spinner.pid}/task"]
    resting, spinning = at_rest[sleeper.pid], at_rest[spinner.pid]
    assert resting.run_delay_seconds_per_s == 0.0 and resting.pmu.task_clock_cpus == 0.0
    assert [op.count_per_s for op in resting.gemm] == [0.0] * OPS  # served at rest, as the spinner is
    assert spinning.HasField("run_delay_seconds_per_s")
    assert spinning.pmu.task_clock_cpus > 0.3, "the spinner hardly ran; the machine is overloaded"
    assert [op.count_per_s for op in spinning.gemm] == [0.0] * OPS


def test_a_thread_that_did_not_run_has_its_schedstat_file_left_unread(folder, monkeypatch):
    """A rank whose main thread spins while its other thread sleeps: its counters move, so its threads are
    listed, but only the spinning thread's schedstat file is read (the sleeper's own counter group did not
    move)."""
    two_threads = "import threading, time\nthreading.Thread(target=time.sleep, args=(300,)).start()\nwhile True: pass"
    read_files: list[str] = []
    read_attribute = rank_sched.read_attribute

    def counted(path):
        read_files.append(path)
        return read_attribute(path)

    monkeypatch.setattr(rank_sched, "read_attribute", counted)
    with rank_running(folder, sys.executable, "-c", two_threads) as (_, process):
        task = f"/proc/{process.pid}/task"
        deadline = time.monotonic() + 10
        while len(os.listdir(task)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        sleeper_tid = max(int(tid) for tid in os.listdir(task))
        collector = RanksCollector(1.0, directory=str(folder))
        try:
            for _ in range(2):  # discovery opens a counter group per thread, then the first rates
                collector.collect()
                time.sleep(0.3)
            del read_files[:]
            rank = read(collector, process.pid)
        finally:
            collector.close()
    assert [path for path in read_files if path.endswith("/schedstat")] == [f"{task}/{process.pid}/schedstat"]
    assert rank.pmu.task_clock_cpus > 0.3, "the spinner hardly ran; the machine is overloaded"
    assert rank.HasField("run_delay_seconds_per_s") and sleeper_tid != process.pid


def test_a_rank_that_did_nothing_keeps_its_report_as_a_reading_gives_it(one_rank, rested, monkeypatch):
    """A rank at rest whose threads did not run and that has no side files keeps its last report, its times
    brought up to date: the same report as one built anew for the interval."""
    path, sleeper = one_rank
    collector = RanksCollector(1.0, directory=str(path.parent))
    try:
        for _ in range(2):  # in full, then served at rest
            read(collector, sleeper.pid)
            time.sleep(0.05)
        kept = read(collector, sleeper.pid)
        assert rested == [sleeper.pid]  # not built again
        monkeypatch.setattr(ranks, "_quiet", lambda *_: False)
        monkeypatch.setattr(ranks, "_counters_still", lambda *_: False)  # nor kept by ``_stays_quiet``
        time.sleep(0.05)
        built = read(collector, sleeper.pid)
        assert rested == [sleeper.pid] * 2
        assert kept.interval_seconds > 0.04 and kept.heartbeat_age_seconds > built.heartbeat_age_seconds - 0.5
        for report in (kept, built):
            report.ClearField("interval_seconds")
            report.ClearField("heartbeat_age_seconds")
        assert kept == built
    finally:
        collector.close()


# A rank that writes its own segment as the hook does, through a shared mapping (which leaves the file's
# times as they were), on cue: "map" maps it and rewrites a word with its own value (the mapping's first
# write done before the rank rests), "bump" calls the first op 5 times more and bumps data_seq.
WRITES_ITS_SEGMENT = f"""
import mmap, os, struct, sys
for line in sys.stdin:
    cue, path = line.split()
    if cue == "map":
        segment = mmap.mmap(os.open(path, os.O_RDWR), {segment.SLOTS_OFFSET + 4096})
        segment[{DATA_SEQ_OFFSET}:{DATA_SEQ_OFFSET + 8}] = segment[{DATA_SEQ_OFFSET}:{DATA_SEQ_OFFSET + 8}]
    else:
        count_at, seq_at = {segment.SLOTS_OFFSET + SLOT_COUNT}, {DATA_SEQ_OFFSET}
        count, seq = struct.unpack_from("<Q", segment, count_at)[0], struct.unpack_from("<Q", segment, seq_at)[0]
        struct.pack_into("<Q", segment, count_at, count + 5)
        struct.pack_into("<Q", segment, seq_at, seq + 1)
    print("done", flush=True)
"""


def test_a_quiet_rank_that_writes_its_segment_shows_it_in_that_interval(folder, rested):
    """A rank whose threads did not run is not looked at (its file's lstat as before): only its own threads
    write its segment. One that writes it through its mapping ran, and is read in full in that interval."""
    with rank_running(folder, sys.executable, "-c", WRITES_ITS_SEGMENT, stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE, text=True) as (path, process):
        def cue(word: str) -> None:
            process.stdin.write(f"{word} {path}\n")
            process.stdin.flush()
            assert process.stdout.readline() == "done\n"

        cue("map")
        time.sleep(0.2)  # it has answered; let it be back in its read of stdin before the first interval
        mtime = path.stat().st_mtime_ns
        collector = RanksCollector(1.0, directory=str(path.parent))
        try:
            for _ in range(4):  # in full, at rest, then quiet: its report kept, its header not read
                read(collector, process.pid)
                time.sleep(0.05)
            assert rested == [process.pid]
            cue("bump")
            assert path.stat().st_mtime_ns == mtime  # nothing but its having run tells
            changed = read(collector, process.pid)
            assert [op.count_total for op in changed.gemm] == [6] + [1] * (OPS - 1)
            assert changed.gemm[0].count_per_s * changed.interval_seconds == pytest.approx(5)
        finally:
            collector.close()


def test_a_quiet_ranks_segment_rewritten_by_another_process_is_judged_again_once_its_folder_changes(one_rank):
    """Another process's write(2) (its owner's or root's: no one else can) changes the file's times, not its
    folder's: the file is looked at again when its folder is next listed (``rank_claims.FolderListings``; its
    owner could as well write through a mapping, which changes no time). Its header is then read again, its
    pid checked."""
    path, sleeper = one_rank
    collector = RanksCollector(1.0, directory=str(path.parent))
    try:
        for _ in range(4):  # in full, at rest, then quiet
            read(collector, sleeper.pid)
            time.sleep(0.05)
        with path.open("r+b") as f:
            os.pwrite(f.fileno(), struct.pack("<i", os.getpid()), PID_OFFSET)
        (path.parent / "another-file").touch()  # the folder changed
        collector.collect()
        assert collector.refused()[rank_claims.HEADER_PID] == 1
    finally:
        collector.close()
