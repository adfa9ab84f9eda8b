"""`tuiprof stacks --pid` on processes started with `tuiprof run` but without RANK (issue 25 item 7).

Real processes under a real `tuiprof run`, a real root agent in a private namespace (its own /dev/shm,
so no other test's ranks are listed), real py-spy: a process without a rank number is in the merged tree
and in ``--json`` under ``pid N`` where a rank number would be; several pids at once; a pid that is not
such a process, or not the caller's, is refused in one line with exit status 2.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

import pytest

from agentd.hang.stacks import merged_reply
from agentd.proto import tuiprof_agent_pb2 as pb
from hostile.conftest import PYTHON, wait_ready
from tuiprof.analysis.stacks_report import job_report, render_text
from tuiprof.errors import BadInputError
from tuiprof.model.stacks import HostStacks

pytestmark = pytest.mark.slow

# A process that registers with the hook (one step recorded through the library tuiprof run preloads)
# and parks in a function of the name given on its command line.
UNRANKED_JOB = textwrap.dedent("""
    import ctypes, os, sys, time
    ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"]).tuiprof_record_step()
    exec(f"def {sys.argv[1]}():\\n    print('ready', flush=True)\\n    time.sleep(600)")
    globals()[sys.argv[1]]()
""")
# py-spy's attach stops the process for a moment (SIGSTOP): a snapshot the agent published meanwhile
# says "stopped", and the next command, reading that snapshot, would report a suspect (exit 3).
AFTER_DUMP_S = 1.0
# Every variable the hook reads a rank number from.
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "LOCAL_RANK", "WORLD_SIZE")


@pytest.fixture
def start_unranked(namespace):
    """``start(function)``: `tuiprof run -- python JOB function` in the namespace as root, without RANK."""
    started: list[subprocess.Popen[str]] = []

    def start(function: str) -> subprocess.Popen[str]:
        env = {k: v for k, v in namespace.env(None).items() if k not in RANK_VARIABLES}
        job = namespace.popen([PYTHON, "-m", "tuiprof.cli", "run", "--no-kineto-daemon", "--",
                               PYTHON, "-c", UNRANKED_JOB, function],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(job)
        return wait_ready(job)

    yield start
    for job in started:
        job.kill()
        job.wait(10)


def stacks(namespace, port: int, *args: str, user=None) -> subprocess.CompletedProcess[str]:
    return namespace.run([PYTHON, "-m", "tuiprof.cli", "stacks", f"127.0.0.1:{port}", *args], user=user,
                         timeout=120)


def test_a_process_without_rank_is_in_the_tree_under_its_pid(agent_in_namespace, namespace, start_unranked):
    agent = agent_in_namespace()
    job = start_unranked("training_loop_without_rank")
    seen = agent.client("snapshot", "--rank-pid", str(job.pid))
    assert seen["code"] == "OK", seen
    (listed,) = [r for r in seen["reply"]["ranks"] if r["pid"] == job.pid]
    assert "rank" not in listed  # no rank number: the case the issue was about

    done = stacks(namespace, agent.port, "--json", "--pid", str(job.pid))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ranks"] == 1 and doc["thread"] == "MainThread"
    (only,) = doc["classes"]
    assert only["ranks"] == f"pid {job.pid}" and only["where"].startswith("training_loop_without_rank")
    main = next(t for t in doc["tree"] if t["thread"] == "MainThread")
    assert main["ranks"] == f"pid {job.pid}" and main["missing"] == ""
    (process,) = doc["hosts"][0]["processes"]
    assert process == {**process, "pid": job.pid, "rank": None, "error": None}

    time.sleep(AFTER_DUMP_S)
    text = stacks(namespace, agent.port)  # no --pid: the host's one job, ranked or not
    assert text.returncode == 0, text.stderr
    assert f"MainThread  [pid {job.pid}] 1/1 ranks" in text.stdout
    assert "no rank number" not in text.stdout + text.stderr and "tuiprof run" not in text.stderr
    agent.assert_healthy()


def test_several_pids_each_under_its_own_name(agent_in_namespace, namespace, start_unranked):
    agent = agent_in_namespace()
    waiting = [start_unranked("waiting_for_data") for _ in range(2)]
    odd = start_unranked("stuck_elsewhere")
    for job in (*waiting, odd):
        assert agent.client("snapshot", "--rank-pid", str(job.pid))["code"] == "OK"
    pids = sorted(job.pid for job in (*waiting, odd))

    done = stacks(namespace, agent.port, "--json", "--pid", ",".join(map(str, pids)))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ranks"] == 3
    classes = {c["ranks"]: c for c in doc["classes"]}
    both = ",".join(f"pid {job.pid}" for job in sorted(waiting, key=lambda j: j.pid))
    assert set(classes) == {f"pid {odd.pid}", both}
    assert "stuck_elsewhere" in json.dumps(classes[f"pid {odd.pid}"]["frames"])
    (suspect,) = doc["suspects"]
    assert suspect["ranks"] == f"pid {odd.pid}"
    assert suspect["reason"] == (f"pid {odd.pid} is in `{classes[f'pid {odd.pid}']['where']}`; "
                                 f"{both.replace(',', ', ')} are in `{classes[both]['where']}`")
    assert sorted(p["pid"] for p in doc["hosts"][0]["processes"]) == pids

    time.sleep(AFTER_DUMP_S)
    text = stacks(namespace, agent.port, "--pid", ",".join(map(str, pids)))
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"pids {','.join(map(str, pids))}, 3 processes" in text.stdout
    assert f"not: [{both}]" in text.stdout  # the odd process's frame, and who did not reach it


def test_a_pid_that_is_not_a_tuiprof_process_or_not_yours_is_refused_in_one_line(
        agent_in_namespace, namespace, start_unranked, hostile_user):
    agent = agent_in_namespace()
    job = start_unranked("roots_own_job")
    assert agent.client("snapshot", "--rank-pid", str(job.pid))["code"] == "OK"
    plain = namespace.popen(["sleep", "300"])  # root's, not started with tuiprof run
    try:
        refused = stacks(namespace, agent.port, "--pid", f"{job.pid},{plain.pid}")
    finally:
        plain.kill()
        plain.wait(10)
    assert refused.returncode == BadInputError.exit_code and refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert line.startswith(f"tuiprof stacks: 127.0.0.1:{agent.port}: pid {plain.pid} is not a live rank on this "
                           "host: no process started with `tuiprof run`"), line
    assert f"yours here: {job.pid}" in line

    theirs = stacks(namespace, agent.port, "--pid", str(job.pid), user=hostile_user)
    assert theirs.returncode == BadInputError.exit_code and theirs.stdout == ""
    (line,) = theirs.stderr.splitlines()
    assert f"pid {job.pid} is not yours" in line and "its owner, root, or with the token" in line

    several = namespace.run([PYTHON, "-m", "tuiprof.cli", "stacks", "--pid", str(job.pid),
                             f"127.0.0.1:{agent.port}", "127.0.0.2:1"])
    assert several.returncode == BadInputError.exit_code
    assert several.stderr.splitlines() == ["tuiprof stacks: --pid names processes of one host (pids repeat across "
                                           "hosts); 2 hosts given: name one HOST, or none for this host"]
    malformed = namespace.run([PYTHON, "-m", "tuiprof.cli", "stacks", "--pid", "12,x"])
    assert malformed.returncode == BadInputError.exit_code and "--pid" in malformed.stderr
    agent.assert_healthy()


def test_unranked_processes_on_two_hosts_are_named_with_their_host():
    """Two hosts' processes without rank numbers (pids may repeat across hosts) get a host in their name."""
    def reply(hostname: str, function: str) -> pb.StacksReply:
        frame = pb.Frame(function=function, file="job.py", line=3)
        process = pb.RankStacks(pid=4242, threads=[pb.ThreadStack(thread_name="MainThread", frames=[frame])])
        ranked = pb.RankStacks(pid=7, rank=0, threads=[pb.ThreadStack(thread_name="MainThread", frames=[frame])])
        return merged_reply(hostname, 0, [process, ranked])  # as the agent answers

    hosts = [HostStacks("a:1779", reply=reply("node-a", "here")), HostStacks("b:1779", reply=reply("node-b", "there"))]
    report = job_report(hosts, lines=False, native=False)
    assert report.merged.unranked == {1: "node-a pid 4242", 2: "node-b pid 4242"}
    assert "[0,node-a pid 4242,node-b pid 4242] 3/3 ranks" in render_text(report)
    assert report.merged.ranks == 0b111  # bits next to the ranks, not at the pids (a 4-million-bit mask)
