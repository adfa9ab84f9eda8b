"""A rank that execs a set-user-ID program is no longer counted or ptraced on its owner's behalf
(issue 24 item 11, third point).

The exec keeps the pid and the start time, so the segment's claim still holds; but the process
now acts as root. The agent closes its CPU counters and refuses to py-spy it, each with the
reason, while the same user's ordinary rank keeps both.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from hostile.conftest import PYTHON, wait_ready
from tuiprof.commands.run import launch_environment

LEFT_ITS_OWNER = "no longer acts only as its owner"
WAIT_SECONDS = 15.0

# A rank (it made its segment) that execs the program in argv[1] when told; the pid stays.
EXEC_ON_CUE = """
import ctypes, os, sys
ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"]).tuiprof_record_step()
print("ready", flush=True)
sys.stdin.readline()
os.execv(sys.argv[1], [sys.argv[1], "600"])
"""


@pytest.fixture
def setuid_sleep() -> Iterator[pathlib.Path]:
    """A set-user-ID-root copy of sleep(1) that the other user may run."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tpsuid", dir="/tmp"))
    try:
        folder.chmod(0o755)
        program = folder / "sleep"
        shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
        os.chown(program, 0, 0)
        program.chmod(0o4755)
        yield program
    finally:
        shutil.rmtree(folder)


def _ids(pid: int, field: str) -> list[int]:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return [int(v) for v in line.split()[1:5]]
    raise AssertionError(f"no {field}: line for pid {pid}")


def _rank(agent, pid: int) -> dict:
    reply = agent.client("snapshot", "--rank-pid", str(pid))
    assert reply["code"] == "OK", reply
    (rank,) = [r for r in reply["reply"]["ranks"] if r["pid"] == pid]
    return rank


def _counted(rank: dict) -> bool:
    return "pmu" in rank and "pmu" not in rank.get("unavailable", {})


def test_a_rank_that_execs_a_setuid_program_loses_pmu_and_stacks(agent_in_namespace, start_rank, namespace,
                                                                  hostile_user, setuid_sleep):
    agent = agent_in_namespace()
    ordinary = start_rank(hostile_user, "ordinary-rank")
    env = launch_environment(namespace.env(hostile_user), kineto_daemon=False)
    turning = wait_ready(namespace.popen([PYTHON, "-c", EXEC_ON_CUE, str(setuid_sleep)], user=hostile_user,
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
    try:
        for rank in (ordinary, turning):
            deadline = time.monotonic() + WAIT_SECONDS
            while not _counted(_rank(agent, rank.pid)):
                assert time.monotonic() < deadline, (_rank(agent, rank.pid), agent.log())
        assert turning.stdin is not None
        turning.stdin.write("exec\n")
        turning.stdin.flush()
        deadline = time.monotonic() + WAIT_SECONDS
        while os.readlink(f"/proc/{turning.pid}/exe") != str(setuid_sleep):
            assert time.monotonic() < deadline, "the rank did not exec the set-user-ID program"
            time.sleep(0.05)
        # The kernel's view: same pid, real uid still the user's, effective and saved uid root.
        assert _ids(turning.pid, "Uid") == [hostile_user.uid, 0, 0, 0]
        assert os.stat(f"/proc/{turning.pid}").st_uid == 0  # not dumpable: /proc/<pid> turned root's

        deadline = time.monotonic() + WAIT_SECONDS
        while LEFT_ITS_OWNER not in (rank := _rank(agent, turning.pid)).get("unavailable", {}).get("pmu", ""):
            assert time.monotonic() < deadline, (rank, agent.log())
        assert "pmu" not in rank and f"{hostile_user.uid}/0/0/0" in rank["unavailable"]["pmu"], rank
        assert _counted(_rank(agent, ordinary.pid))  # the same user's ordinary rank is still counted

        for caller in (hostile_user, None):  # neither the owner nor root gets it dumped by the agent
            reply = agent.client("stacks", "--pids", str(turning.pid), user=caller)
            assert reply["code"] == "OK", reply
            (stacks,) = reply["reply"]["ranks"]
            assert not stacks.get("threads") and LEFT_ITS_OWNER in stacks["error"], stacks
        ordinary_stacks = agent.client("stacks", "--pids", str(ordinary.pid), user=hostile_user)
        assert ordinary_stacks["reply"]["ranks"][0].get("threads"), ordinary_stacks
    finally:
        turning.kill()
        turning.wait(10)
    agent.assert_healthy(user=hostile_user)
