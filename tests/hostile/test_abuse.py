"""A second real user tries to make the root agent dump everyone, bloat, or give its place away."""

from __future__ import annotations

import json
import stat
import subprocess
import time

import pytest

from agentd.hang.service import MAX_INCIDENTS_PER_OWNER, MAX_REQUEST_PIDS
from hostile.conftest import AGENTD, PYTHON, wait_ready

LISTENER_PROGRAM = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("ready", flush=True)
time.sleep(600)
"""

EMBEDDED_PROGRAM = """
import sys, tempfile, time, pathlib
from agentd.embedded import start_embedded_agent
agent = start_embedded_agent(trace_dir=pathlib.Path(tempfile.mkdtemp()), host_kineto_socket=sys.argv[1] == "opt-in")
print("ready", flush=True)
time.sleep(600)
"""


ROOT_CONSOLE_PROGRAM = """
import sys, tempfile, pathlib
from agentd.embedded import start_embedded_agent
agent = start_embedded_agent(trace_dir=pathlib.Path(tempfile.mkdtemp()))
print(agent.address.port, flush=True)
sys.stdin.readline()  # serve once told
agent.serve_grpc()
print("serving", flush=True)
sys.stdin.readline()
"""

SQUAT_PROGRAM = """
import json, socket, sys
port, results = int(sys.argv[1]), {}
for name, options in (("plain", []), ("reuseaddr", [socket.SO_REUSEADDR]), ("reuseport", [socket.SO_REUSEPORT]),
                      ("both", [socket.SO_REUSEADDR, socket.SO_REUSEPORT])):
    with socket.socket() as s:
        for option in options:
            s.setsockopt(socket.SOL_SOCKET, option, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            results[name] = "listening"
        except OSError as exc:
            results[name] = exc.strerror
print(json.dumps(results))
"""


def test_a_users_socket_cannot_take_the_port_a_root_console_holds_for_its_agent(namespace, hostile_user):
    """A root console's embedded agent binds its gRPC port at start and serves it only once asked:
    meanwhile and after, another user's socket can bind and listen there with no socket option."""
    console = namespace.popen([PYTHON, "-c", ROOT_CONSOLE_PROGRAM], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert console.stdout is not None and console.stdin is not None
        port = int(console.stdout.readline())
        for stage in ("held", "serving"):
            squat = namespace.run([PYTHON, "-c", SQUAT_PROGRAM, str(port)], user=hostile_user)
            assert json.loads(squat.stdout) == dict.fromkeys(["plain", "reuseaddr", "reuseport", "both"],
                                                             "Address already in use"), (stage, squat.stderr)
            if stage == "held":
                console.stdin.write("\n")
                console.stdin.flush()
                assert console.stdout.readline().strip() == "serving"
        owner = namespace.run([PYTHON, "-c", "import sys; from agentd.peer import tcp_socket_uid; "
                               "print(tcp_socket_uid(('127.0.0.1', int(sys.argv[1])), None))", str(port)])
        assert owner.stdout.strip() == "0", owner.stderr  # the listener is root's
    finally:
        console.kill()
        console.communicate(timeout=10)


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_users_listener_on_the_agents_port_is_told_apart_from_roots(namespace, hostile_user, agent_in_namespace,
                                                                       tmp_path):
    real = agent_in_namespace()
    assert real.client("listener-owner")["uid"] == 0
    squatted = real.port + 1
    fake = wait_ready(namespace.popen([PYTHON, "-c", LISTENER_PROGRAM, str(squatted)], user=hostile_user,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        done = namespace.run([PYTHON, "-c", "import sys; from agentd.peer import tcp_socket_uid; "
                              "print(tcp_socket_uid(('127.0.0.1', int(sys.argv[1])), None))", str(squatted)])
        assert done.stdout.strip() == str(hostile_user.uid), done.stderr
        # And root's agent does not start on a port someone else holds.
        refused = namespace.run([AGENTD, "--port", str(squatted), "--metrics-port", str(real.port + 2),
                                 "--trace-dir", str(tmp_path / "second")])
        assert refused.returncode == 4 and f"gRPC port {squatted} on 127.0.0.1 is already in use" in refused.stderr
    finally:
        fake.kill()
        fake.wait(10)
    real.assert_healthy(user=hostile_user)


def test_oversized_requests_are_refused_before_they_cost_memory(agent_in_namespace, hostile_user):
    agent = agent_in_namespace()
    over = agent.client("many-pids", "--count", str(MAX_REQUEST_PIDS + 1), user=hostile_user)
    assert over["codes"] == {"INVALID_ARGUMENT": 1}, over
    before = _rss_bytes(agent.process.pid)
    # 50 requests of about 2.5 MB each (125 MB in all): an agent that kept what it refused would pass 32 MiB
    huge = agent.client("many-pids", "--count", "500000", "--requests", "50", user=hostile_user, timeout=240)
    assert huge["codes"] == {"RESOURCE_EXHAUSTED": 50}, huge
    grown = _rss_bytes(agent.process.pid) - before
    assert grown < 32 * 1024 * 1024, f"agentd grew by {grown / 2**20:.0f} MiB"
    agent.assert_healthy(user=hostile_user)


def test_a_user_toggling_a_hang_causes_few_private_incidents_of_their_own_ranks(
        agent_in_namespace, start_rank, hostile_user, run_as_hostile):
    agent = agent_in_namespace("--hang-timeout-s", "1", "--hang-suspect-s", "1")
    roots = start_rank(None, "root-rank")
    theirs = start_rank(hostile_user, "their-rank")
    for rank in (roots, theirs):
        assert agent.client("snapshot", "--rank-pid", str(rank.pid))["code"] == "OK"
    toggles = MAX_INCIDENTS_PER_OWNER + 3
    for _ in range(toggles):
        assert run_as_hostile(["kill", "-STOP", str(theirs.pid)]).returncode == 0
        time.sleep(1.8)  # stopped: a suspect at once, hung past the 1 s timeout
        assert run_as_hostile(["kill", "-CONT", str(theirs.pid)]).returncode == 0
        time.sleep(0.8)
    incidents = sorted((agent.trace_dir / "hangs").glob("hang-*.json"))
    assert len(incidents) == MAX_INCIDENTS_PER_OWNER, (incidents, agent.log())
    for path in incidents:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert [r["pid"] for r in json.loads(path.read_text())["ranks"]] == [theirs.pid]  # never root's rank
        assert run_as_hostile(["cat", str(path)]).returncode != 0
    assert agent.log().count("hang incidents capped") == 1
    mine = agent.client("stacks", "--incident", user=hostile_user)
    assert [r["pid"] for r in mine["reply"]["ranks"]] == [theirs.pid]
    agent.assert_healthy(user=hostile_user)


@pytest.mark.parametrize("mode", ["default", "opt-in"])
def test_a_users_console_takes_the_host_kineto_socket_only_when_it_opts_in(namespace, hostile_user,
                                                                           agent_in_namespace, mode):
    """By default a user's embedded agent leaves @dynolog@ to the root agent; opting in takes it first."""
    console = wait_ready(namespace.popen([PYTHON, "-c", EMBEDDED_PROGRAM, mode], user=hostile_user,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        agent = agent_in_namespace()
        (kineto,) = [c for c in agent.client("info")["reply"]["collectors"] if c["name"] == "kineto"]
        if mode == "default":
            assert kineto["available"] is True and not kineto.get("reason"), kineto
        else:  # the name is the console's: the root agent says so, names the holder, retries, serves per-user folders
            assert kineto["reason"].startswith("cannot bind the Kineto IPC socket @dynolog@"), kineto
            assert f"of user {hostile_user.name} (uid {hostile_user.uid})" in kineto["reason"], kineto
            assert kineto["reason"].endswith("retrying; per-user folders still served"), kineto
    finally:
        console.kill()
        console.wait(10)
