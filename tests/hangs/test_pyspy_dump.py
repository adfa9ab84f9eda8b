"""Real py-spy against real processes: threads grouped by name, frames outermost first."""

import subprocess
import sys
import time

import pytest

from agentd.hang import pyspy
from agentd.hang.stacks import DumpTarget, StackTaker
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.stacks.merge import equivalence_classes, find_suspects, merge
from agentd.stacks.wire import samples_from_ranks, tree_from_proto


def _require_ptrace(result: pb.RankStacks):
    if "Permission denied" in result.error or "Operation not permitted" in result.error:
        pytest.skip(f"py-spy may not ptrace here: {result.error}")


def test_dump_lists_every_thread_with_its_function(pyspy_binary, parked):
    proc = parked("waiting_for_data")
    result = pyspy.dump(pyspy_binary, proc.pid, 3, native=False)
    _require_ptrace(result)
    assert result.error == "" and result.rank == 3 and result.pid == proc.pid
    threads = {t.thread_name: t for t in result.threads}
    assert set(threads) == {"MainThread", "helper"}
    main = [f.function for f in threads["MainThread"].frames]
    assert main == ["<module>", "waiting_for_data"]
    assert threads["helper"].frames[-1].function == "helper_loop"
    assert not any(f.native for f in threads["MainThread"].frames)
    assert 0 < result.dump_seconds < pyspy.PYTHON_TIMEOUT_S


def test_native_dump_adds_native_frames(pyspy_binary, parked):
    proc = parked("waiting_for_data")
    result = pyspy.dump(pyspy_binary, proc.pid, 0, native=True)
    _require_ptrace(result)
    main = next(t for t in result.threads if t.thread_name == "MainThread")
    native = [f for f in main.frames if f.native]
    assert native and all(f.module for f in native), result
    assert main.frames[-1].function.startswith("clock_nanosleep") or "sleep" in main.frames[-1].function


def test_no_dump_of_a_gone_or_zombie_process(pyspy_binary):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # not reaped yet: a zombie
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    result = pyspy.dump(pyspy_binary, proc.pid, 0, native=False)
    assert result.error == "process is zombie: no stacks to take"
    proc.wait()
    assert pyspy.dump(pyspy_binary, proc.pid, 0, native=False).error == "process is gone: no stacks to take"


def test_host_tree_names_the_odd_rank(pyspy_binary, parked):
    procs = {r: parked("all_reduce_wait") for r in (0, 1, 2)}
    procs[3] = parked("stuck_in_loader")
    targets = [DumpTarget.pin(p.pid, r, None) for r, p in procs.items()]
    reply = StackTaker(pyspy_binary, "test-host").take(targets, native=False)
    for rank in reply.ranks:
        _require_ptrace(rank)
        assert rank.error == ""
    merged = tree_from_proto(reply.merged)
    assert sorted(merged.threads) == ["MainThread", "helper"]
    (suspect,) = find_suspects(equivalence_classes(merged))
    assert suspect.ranks == 1 << 3
    assert "stuck_in_loader" in suspect.reason and "all_reduce_wait" in suspect.reason


def test_a_non_python_process_gets_py_spys_reason(pyspy_binary):
    proc = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.1)
        result = pyspy.dump(pyspy_binary, proc.pid, 0, native=False)
    finally:
        proc.kill()
        proc.wait()
    assert not result.threads
    assert result.error.startswith("py-spy failed (exit 1): ") and "Stack backtrace" not in result.error
    assert "python" in result.error.lower()


def test_unnamed_threads_line_up_across_ranks():
    """py-spy names no thread that Python did not start; such threads merge by position, not by TID."""
    ranks = []
    for rank, tids in ((0, (784, 785)), (1, (786, 787))):
        stacks = pb.RankStacks(pid=100 + rank, rank=rank)
        stacks.threads.extend(pyspy.thread_from_pyspy({"os_thread_id": tid, "thread_name": None, "frames": []})
                              for tid in tids)
        ranks.append(stacks)
    merged = merge(samples_from_ranks(ranks))
    assert sorted(merged.threads) == ["unnamed thread", "unnamed thread [2]"]
    assert all(root.ranks == 0b11 for root in merged.threads.values())
