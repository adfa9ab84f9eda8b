"""Hang verdicts from successive RankStats, on a controlled clock."""

import os
import signal
import subprocess
import time

import pytest

from agentd.hang.detector import PUBLISH_ALLOWANCE_S, HangConfigError, HangDetector, Thresholds, hide_exceptions
from agentd import procfs
from agentd.proto import tuiprof_agent_pb2 as pb


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def detector(suspect=10, hang=30):
    clock = Clock()
    d = HangDetector(Thresholds(suspect, hang), clock=clock, wall_clock_ns=lambda: int(clock.now * 1e9))
    return d, clock


def rank(r, steps=0, **kw):
    return pb.RankStats(pid=100 + r, rank=r, step_count=steps, state=pb.RANK_STATE_RUNNING, **kw)


def watched(d, clock, ranks, seconds):
    """The status after the detector saw ``ranks`` (the same in-flight ops) for ``seconds``."""
    d.observe(ranks)
    clock.now += seconds
    return d.observe(ranks)


def test_steady_training_is_ok_and_a_stall_becomes_suspect_then_hung():
    d, clock = detector()
    for step in range(1, 6):
        status = d.observe([rank(0, step), rank(1, step)])
        clock.now += 0.5
    assert status.level == pb.HANG_LEVEL_OK and not status.explanation
    clock.now += 12
    status = d.observe([rank(0, 6), rank(1, 5)])
    assert status.level == pb.HANG_LEVEL_SUSPECT
    assert [v.level for v in status.ranks] == [pb.HANG_LEVEL_OK, pb.HANG_LEVEL_SUSPECT]
    assert status.ranks[1].explanation.startswith("rank 1: no optimizer step for 12 s (step 5, median step 0.50 s)")
    since = status.since_unix_ns
    clock.now += 20
    status = d.observe([rank(0, 7), rank(1, 5)])
    assert status.level == pb.HANG_LEVEL_HUNG and status.since_unix_ns == since
    assert "hung" in status.explanation and "rank 1: no optimizer step for 32 s" in status.explanation


def test_a_slow_job_is_not_hung():
    d, clock = detector(suspect=10, hang=30)
    for step in range(1, 4):
        d.observe([rank(0, step)])
        clock.now += 20  # 20 s per step: 5 × 20 = 100 s before a stall counts
    clock.now += 40
    status = d.observe([rank(0, 3)])
    assert status.level == pb.HANG_LEVEL_OK
    clock.now += 45
    assert d.observe([rank(0, 3)]).level == pb.HANG_LEVEL_HUNG


def test_a_rank_that_never_stepped_is_not_judged_by_steps():
    d, clock = detector()
    d.observe([rank(0)])
    clock.now += 1000
    assert d.observe([rank(0)]).level == pb.HANG_LEVEL_OK


def test_an_unfinished_collective_names_the_rank_that_never_launched_it():
    d, clock = detector()
    nccl = [pb.NcclOpStats(op="AllReduce", comm_hash="3fa1c0ffee")]
    waiting = [pb.InflightOp(kind="nccl", op="all_reduce", comm_hash="3fa1c0ffee", sequence=1042, age_seconds=312)]
    status = watched(d, clock, [rank(0, nccl=nccl, inflight=waiting), rank(1, nccl=nccl, inflight=waiting),
                                rank(2, nccl=nccl)], 312)
    assert status.level == pb.HANG_LEVEL_HUNG
    assert status.ranks[0].explanation == (
        "rank 0: all_reduce #1042 on comm 3fa1… launched 312 s ago, not finished")
    assert status.ranks[2].level == pb.HANG_LEVEL_HUNG
    assert status.ranks[2].explanation == (
        "rank 2: never launched all_reduce #1042 on comm 3fa1… (ranks 0-1 launched it)")
    gemm_only = watched(d, clock, [rank(0, inflight=[pb.InflightOp(kind="gemm", op="gemm", age_seconds=500)])], 500)
    assert gemm_only.level == pb.HANG_LEVEL_OK


def test_a_claimed_age_counts_only_as_long_as_the_agent_watched_it():
    """A forged "launched an hour ago" is not hung at once: the timeout runs from when the agent saw it."""
    d, clock = detector(suspect=10, hang=30)
    forged = [pb.InflightOp(kind="nccl", op="all_reduce", comm_hash="3fa1", sequence=9, age_seconds=3600)]
    assert PUBLISH_ALLOWANCE_S < 10
    assert d.observe([rank(0, inflight=forged)]).level == pb.HANG_LEVEL_OK
    clock.now += 10 - PUBLISH_ALLOWANCE_S
    assert d.observe([rank(0, inflight=forged)]).level == pb.HANG_LEVEL_SUSPECT
    clock.now += 20
    status = d.observe([rank(0, inflight=forged)])
    assert status.level == pb.HANG_LEVEL_HUNG and "launched 30 s ago" in status.ranks[0].explanation
    # A new operation (the next sequence number) starts from the allowance again.
    forged[0].sequence = 10
    assert d.observe([rank(0, inflight=forged)]).level == pb.HANG_LEVEL_OK
    # A reported age below what was watched is believed: watched 20 s, claims 5 s, not a suspect yet.
    clock.now += 20
    forged[0].age_seconds = 5
    assert d.observe([rank(0, inflight=forged)]).level == pb.HANG_LEVEL_OK


def test_a_crash_is_reported_with_signal_and_exception():
    d, _ = detector()
    status = d.observe([
        pb.RankStats(pid=100, rank=0, state=pb.RANK_STATE_EXITED, exit_signal=9),
        pb.RankStats(pid=101, rank=1, state=pb.RANK_STATE_EXITED, exit_code=1,
                     exception="Traceback (most recent call last):\n  ...\nRuntimeError: boom\n"),
    ])
    assert status.level == pb.HANG_LEVEL_SUSPECT
    assert status.ranks[0].explanation == "rank 0: killed by signal 9 (SIGKILL)"
    assert status.ranks[1].explanation == "rank 1: exited with code 1 after an uncaught exception: RuntimeError: boom"


THREAD_DIED = "Exception in thread prefetcher:\nTraceback (most recent call last):\n  ...\nValueError: bad sample\n"


def test_a_dead_thread_is_named_in_a_waiting_ranks_verdict_but_not_a_failure_after_exit_code_0():
    d, clock = detector()
    waiting = [pb.InflightOp(kind="fr", op="gloo:all_reduce", comm_hash="pg0", sequence=7, age_seconds=40)]
    member = [pb.ProcessGroupProgress(id="0", last_enqueued=6, last_completed=6)]
    status = watched(d, clock, [rank(0, inflight=waiting, exception=THREAD_DIED), rank(1, process_groups=member)], 40)
    assert [v.explanation for v in status.ranks] == [
        "rank 0: gloo:all_reduce #7 on comm pg0 launched 40 s ago, not finished; "
        "earlier an uncaught exception in thread prefetcher: ValueError: bad sample",
        "rank 1: never launched gloo:all_reduce #7 on comm pg0 (rank 0 launched it)"]
    d, _ = detector()
    done = d.observe([pb.RankStats(pid=100, rank=0, state=pb.RANK_STATE_EXITED, exit_code=0, exception=THREAD_DIED),
                      pb.RankStats(pid=101, rank=1, state=pb.RANK_STATE_EXITED, exit_code=0)])
    assert done.level == pb.HANG_LEVEL_OK
    assert done.ranks[0].explanation == (
        "rank 0: exited with code 0 after an uncaught exception in thread prefetcher: ValueError: bad sample")


def test_a_clean_exit_of_the_whole_job_is_not_a_problem_but_one_rank_leaving_is():
    d, _ = detector()
    done = d.observe([pb.RankStats(pid=100, rank=0, state=pb.RANK_STATE_EXITED, exit_code=0),
                      pb.RankStats(pid=101, rank=1, state=pb.RANK_STATE_EXITED, exit_code=0)])
    assert done.level == pb.HANG_LEVEL_OK and [v.level for v in done.ranks] == [pb.HANG_LEVEL_EXITED] * 2
    d, _ = detector()
    left = pb.RankStats(pid=100, rank=0, state=pb.RANK_STATE_EXITED)
    left.unavailable["exit_code"] = "only the process's parent learns its exit status"
    status = d.observe([left, rank(1)])
    assert status.level == pb.HANG_LEVEL_SUSPECT
    assert status.ranks[0].explanation == (
        "rank 0: process exited; exit status unknown (only the process's parent learns its exit status)")


def test_collectives_are_compared_within_a_job():
    d, clock = detector()
    waiting = [pb.InflightOp(kind="nccl", op="all_reduce", comm_hash="aaaa", sequence=5, age_seconds=100)]
    status = watched(d, clock, [
        rank(0, job_id="a", inflight=waiting), rank(1, job_id="a", nccl=[pb.NcclOpStats(comm_hash="aaaa")]),
        pb.RankStats(pid=201, rank=1, job_id="b", state=pb.RANK_STATE_RUNNING, nccl=[pb.NcclOpStats(comm_hash="bbbb")]),
    ], 100)
    assert "never launched all_reduce #5" in status.ranks[1].explanation
    assert status.ranks[2].level == pb.HANG_LEVEL_OK


def test_other_users_exception_text_can_be_hidden_from_the_explanations():
    d, clock = detector()
    waiting = [pb.InflightOp(kind="fr", op="gloo:all_reduce", comm_hash="pg0", sequence=7, age_seconds=40)]
    status = watched(d, clock, [rank(0, inflight=waiting, exception=THREAD_DIED), rank(1)], 40)
    assert "bad sample" in status.explanation
    hidden = hide_exceptions(status, [THREAD_DIED])
    assert "bad sample" not in hidden.explanation and "bad sample" not in hidden.ranks[0].explanation
    assert "an uncaught exception (text shown to its owner only)" in hidden.ranks[0].explanation
    assert "bad sample" in status.ranks[0].explanation  # the original is untouched


def test_thresholds_must_be_ordered():
    with pytest.raises(HangConfigError, match="at most the hang timeout"):
        Thresholds(10, 5)


def test_process_states_are_read_from_proc():
    """Real processes: a stopped child, a zombie, and a reaped pid, with a name full of parentheses."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        _wait_for_state(child.pid, "stopped")
        os.kill(child.pid, signal.SIGKILL)
        _wait_for_state(child.pid, "zombie")
    finally:
        child.kill()
        child.wait()
    assert procfs.state_of(child.pid) == "gone"
    stat = procfs.read_stat(os.getpid())
    assert stat is not None and stat.alive
    assert stat.started_by(time.time_ns()) and not stat.started_by(stat.start_ns - 10 * 1_000_000_000)


def _wait_for_state(pid: int, state: str) -> None:
    deadline = time.monotonic() + 5
    while procfs.state_of(pid) != state:
        assert time.monotonic() < deadline, f"pid {pid} never became {state}: {procfs.state_of(pid)}"
        time.sleep(0.01)


def test_a_blank_exception_text_does_not_stop_detection():
    d, _ = detector()
    status = d.observe([rank(0), pb.RankStats(pid=101, rank=1, state=pb.RANK_STATE_EXITED, exit_code=1, exception=" \n\t\n")])
    assert status.ranks[1].level == pb.HANG_LEVEL_EXITED
    assert status.ranks[1].explanation == "rank 1: exited with code 1 after an uncaught exception (no text recorded)"


def test_the_state_is_the_collectors_reading_not_a_new_look_at_a_pid_that_may_be_reused():
    """The ranks collector checked the pid against the process's start time in this tick; the
    detector judges that reading, so a pid recycled by another process cannot change a verdict."""
    d, clock = detector(suspect=10, hang=30)
    pid_of_this_test = os.getpid()  # a live process: a fresh /proc look would say "running"
    stopped = pb.RankStats(pid=pid_of_this_test, rank=0, state=pb.RANK_STATE_STOPPED)
    assert d.observe([stopped]).ranks[0].explanation == "rank 0: stopped (SIGSTOP or a debugger) for 0 s"
    clock.now += 31
    assert d.observe([stopped]).level == pb.HANG_LEVEL_HUNG
    exited = pb.RankStats(pid=pid_of_this_test, rank=0, state=pb.RANK_STATE_EXITED, exit_code=0)
    assert d.observe([exited]).ranks[0].level == pb.HANG_LEVEL_EXITED
    d, clock = detector(suspect=10, hang=30)
    waiting = pb.RankStats(pid=pid_of_this_test, rank=0, state=pb.RANK_STATE_DISK_SLEEP)
    assert "in D state (uninterruptible I/O wait) for 0 s" in d.observe([waiting]).ranks[0].explanation
