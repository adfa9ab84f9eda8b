"""A user who spent their hang-incident budget cannot veto another user's incident (issue 24 item 10).

The second user fakes hangs until their budget is spent, then keeps a rank hung, so every later
hang on the host involves one of their ranks. Root's real hang must still get its stacks
recorded; the second user's rank in it is listed with the reason it has none.
"""

from __future__ import annotations

import json
import subprocess
import time

from agentd.hang.service import MAX_INCIDENTS_PER_OWNER
from hostile.conftest import PYTHON, wait_ready
from tuiprof.commands.run import launch_environment

HANG_FLAGS = ("--hang-timeout-s", "1", "--hang-suspect-s", "1")
INCIDENT_WAIT_SECONDS = 20.0

# A rank that steps every 0.1 s until a line arrives on stdin, then stops stepping for good
# (a stall py-spy can read, unlike a stopped process).
STALLING_RANK = """
import ctypes, os, select, sys, time
lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
lib.tuiprof_record_step()
print("ready", flush=True)
def stepping():
    while not select.select([sys.stdin], [], [], 0.1)[0]:
        lib.tuiprof_record_step()
def stalled_in_rank_main():
    while True:
        time.sleep(1)
stepping()
stalled_in_rank_main()
"""


def _incidents(agent) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((agent.trace_dir / "hangs").glob("hang-*.json"))]


def test_a_spent_budget_does_not_veto_another_owners_hang(agent_in_namespace, start_rank, hostile_user,
                                                          run_as_hostile, namespace):
    agent = agent_in_namespace(*HANG_FLAGS)
    roots = wait_ready(namespace.popen([PYTHON, "-c", STALLING_RANK],
                                       env=launch_environment(namespace.env(None), kineto_daemon=False),
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True))
    theirs = start_rank(hostile_user, "their-rank")
    for rank in (roots, theirs):
        assert agent.client("snapshot", "--rank-pid", str(rank.pid))["code"] == "OK"
    for _ in range(MAX_INCIDENTS_PER_OWNER):  # fake hangs: the second user's whole budget
        assert run_as_hostile(["kill", "-STOP", str(theirs.pid)]).returncode == 0
        time.sleep(1.8)  # stopped: a suspect at once, hung past the 1 s timeout
        assert run_as_hostile(["kill", "-CONT", str(theirs.pid)]).returncode == 0
        time.sleep(0.8)
    assert len(_incidents(agent)) == MAX_INCIDENTS_PER_OWNER, agent.log()
    assert run_as_hostile(["kill", "-STOP", str(theirs.pid)]).returncode == 0  # and kept hung from now on
    time.sleep(1.8)
    assert len(_incidents(agent)) == MAX_INCIDENTS_PER_OWNER, agent.log()  # over budget: nothing taken

    try:
        roots.stdin.write("stall\n")  # root's real hang: the rank stops stepping
        roots.stdin.flush()
        deadline = time.monotonic() + INCIDENT_WAIT_SECONDS
        while len(_incidents(agent)) == MAX_INCIDENTS_PER_OWNER and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        roots.kill()
        roots.wait(10)
        run_as_hostile(["kill", "-CONT", str(theirs.pid)])
    incidents = _incidents(agent)
    assert len(incidents) == MAX_INCIDENTS_PER_OWNER + 1, agent.log()  # was vetoed: no file, no stacks
    by_pid = {r["pid"]: r for r in incidents[-1]["ranks"]}
    assert {roots.pid, theirs.pid} <= set(by_pid)  # (a root agent also lists the host's ranks, outside the namespace)
    assert "stalled_in_rank_main" in json.dumps(by_pid[roots.pid].get("threads")), by_pid[roots.pid]
    assert not by_pid[theirs.pid].get("threads")
    assert f"uid {hostile_user.uid} already had {MAX_INCIDENTS_PER_OWNER} hang incidents" in \
        by_pid[theirs.pid]["error"]

    # Root sees the incident; the second user still sees their own last one, not root's stacks.
    seen_by_root = agent.client("stacks", "--incident")["reply"]
    assert {roots.pid, theirs.pid} <= {r["pid"] for r in seen_by_root["ranks"]}  # and any other ranks of the host
    seen_by_them = agent.client("stacks", "--incident", user=hostile_user)["reply"]
    assert [r["pid"] for r in seen_by_them["ranks"]] == [theirs.pid]
    agent.assert_healthy(user=hostile_user)
