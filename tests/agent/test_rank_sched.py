"""``rank_sched.SchedReader`` over a /proc and cgroup tree made in a folder: a rank's threads' run-queue delay
and its cgroup's CPU throttling as rates, and what is not read for threads that did not run."""

from __future__ import annotations

import pathlib

import pytest

from agentd.collectors import rank_sched
from agentd.collectors.readings import FIRST_SAMPLE, Unavailable
from agentd.collectors.rank_sched import NO_CGROUP_V2, CpuStatReads, SchedReader

PID = 4242


def threads(proc: pathlib.Path, delays_ns: dict[int, int]) -> None:
    """The process's threads (by id) with their run-queue delays, as schedstat writes them (run ns, wait ns,
    timeslices); a thread not named has exited."""
    task = proc / str(PID) / "task"
    for gone in task.glob("*"):
        (gone / "schedstat").unlink()
        gone.rmdir()
    for tid, delay in delays_ns.items():
        (task / str(tid)).mkdir(parents=True)
        (task / str(tid) / "schedstat").write_text(f"123456 {delay} 7\n")


def throttled(cgroup: pathlib.Path, usec: int) -> None:
    (cgroup / "job" / "cpu.stat").write_text(f"usage_usec 900\nuser_usec 800\nsystem_usec 100\nnr_periods 10\n"
                                             f"nr_throttled 2\nthrottled_usec {usec}\nnr_bursts 0\nburst_usec 0\n")


@pytest.fixture
def reader(tmp_path) -> tuple[SchedReader, pathlib.Path, pathlib.Path, CpuStatReads]:
    """A reader of process PID, whose cgroup is /job; its /proc and cgroup folders; the interval's cpu.stat reads."""
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    for pid in (PID, PID + 100):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text("0::/job\n")
    (cgroup / "job").mkdir(parents=True)
    reads = CpuStatReads()
    return SchedReader(PID, reads, proc=str(proc), cgroup_root=str(cgroup)), proc, cgroup, reads


def test_run_delay_and_throttling_are_rates_between_two_readings(reader):
    sched, proc, cgroup, reads = reader
    threads(proc, {PID: 1_000_000, PID + 1: 0})
    throttled(cgroup, 5_000)
    assert sched.run_delay_seconds_per_s(1.0, ran=True, idle_threads=frozenset()) == Unavailable(FIRST_SAMPLE)
    assert isinstance(sched.cpu_throttled_seconds_per_s(1.0), Unavailable)
    threads(proc, {PID: 201_000_000, PID + 2: 100_000_000})  # thread PID + 1 exited, PID + 2 started
    throttled(cgroup, 505_000)
    reads.next_interval()
    assert sched.run_delay_seconds_per_s(2.0, ran=True, idle_threads=frozenset()) == pytest.approx(0.15)
    assert sched.cpu_throttled_seconds_per_s(2.0) == pytest.approx(0.25)


def test_an_interval_in_which_no_thread_ran_has_no_delay_and_reads_nothing(reader):
    sched, proc, cgroup, reads = reader
    threads(proc, {PID: 1_000_000})
    assert sched.run_delay_seconds_per_s(1.0, ran=False, idle_threads=frozenset()) == Unavailable(FIRST_SAMPLE)  # no reading yet: read
    threads(proc, {})  # nothing left to read: a read would say so
    assert sched.run_delay_seconds_per_s(1.0, ran=False, idle_threads=frozenset()) == 0.0
    threads(proc, {PID: 301_000_000})  # it runs again: its wait counts from the last reading
    assert sched.run_delay_seconds_per_s(1.0, ran=True, idle_threads=frozenset()) == pytest.approx(0.3)


def test_no_cgroup_v2_cpu_stat_is_unavailable_with_the_reason(reader):
    sched, proc, cgroup, reads = reader
    assert sched.cpu_throttled_seconds_per_s(1.0) == Unavailable(NO_CGROUP_V2)


def test_a_thread_that_did_not_run_keeps_its_delay_without_a_read(reader):
    sched, proc, cgroup, reads = reader
    threads(proc, {PID: 1_000_000, PID + 1: 2_000_000})
    sched.run_delay_seconds_per_s(1.0, ran=True, idle_threads=frozenset())
    # PID + 1 did not run: its file is not read (what it says here would add 0.9 s), its delay stands
    threads(proc, {PID: 101_000_000, PID + 1: 902_000_000})
    assert sched.run_delay_seconds_per_s(1.0, ran=True, idle_threads=frozenset({PID + 1})) == pytest.approx(0.1)
    # a thread said idle but not listed at the last reading (new, or an id given again) is read
    threads(proc, {PID: 101_000_000, PID + 1: 2_000_000, PID + 2: 500_000_000})
    assert sched.run_delay_seconds_per_s(1.0, ran=True, idle_threads=frozenset({PID + 2})) == pytest.approx(0.5)


def test_the_ranks_of_one_cgroup_read_its_cpu_stat_once_an_interval(reader, monkeypatch):
    """A container's ranks share a cgroup: its cpu.stat is read once an interval, each rank's rate from it."""
    sched, proc, cgroup, reads = reader
    other = SchedReader(PID + 100, reads, proc=str(proc), cgroup_root=str(cgroup))
    opened: list[str] = []
    read_attribute = rank_sched.read_attribute
    monkeypatch.setattr(rank_sched, "read_attribute", lambda path: opened.append(path) or read_attribute(path))
    throttled(cgroup, 5_000)
    for reader_ in (sched, other):
        assert reader_.cpu_throttled_seconds_per_s(1.0) == Unavailable(FIRST_SAMPLE)
    assert opened == [str(cgroup / "job" / "cpu.stat")]
    throttled(cgroup, 105_000)
    assert sched.cpu_throttled_seconds_per_s(1.0) == 0.0  # the same interval: as read at its start
    reads.next_interval()
    assert [reader_.cpu_throttled_seconds_per_s(0.5) for reader_ in (sched, other)] == [pytest.approx(0.2)] * 2
    assert len(opened) == 2
