"""`tuiprof doctor` inside the private namespaces: what it says with and without the node's agent, when
another user holds the agent's port, with a process in another PID namespace, and with a small /dev/shm
(the namespace's is 8 MiB: room for a few segments only)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import time

from hostile.conftest import PYTHON, wait_ready
from testkit.namespaces import SHM_BYTES
from testkit.ports import free_port
from tuiprof_native import segment

ROOT = "user root (uid 0)"
SQUAT = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("ready", flush=True)
sys.stdin.read()
"""


def doctor(namespace, *args: str) -> tuple[int, dict[str, dict]]:
    done = namespace.run([PYTHON, "-m", "tuiprof.cli", "doctor", "--json", *args], timeout=120)
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, {check["area"]: check for check in json.loads(done.stdout)["checks"]}


def test_doctor_sees_the_agent_its_kineto_socket_and_the_small_shm(agent_in_namespace, namespace):
    quiet_port, quiet_metrics = free_port(), free_port()
    code, checks = doctor(namespace, "--agent-port", str(quiet_port), "--metrics-port", str(quiet_metrics))
    assert code == 1
    assert not checks["agentd"]["ok"] and checks["agentd"]["finding"].startswith(
        f"no agent listens on ports {quiet_port}/{quiet_metrics}")
    assert not checks["Kineto"]["ok"] and checks["Kineto"]["fix"] == "run agentd as root on this host"
    shm = checks["/dev/shm"]
    room = int(re.search(r"room for (\d+) rank segment", shm["finding"]).group(1))
    assert not shm["ok"] and room == SHM_BYTES // segment.SEGMENT_SIZE, shm  # nothing else in it yet

    agent = agent_in_namespace()
    _, checks = doctor(namespace, "--agent-port", str(agent.port), "--metrics-port", str(agent.metrics_port))
    assert checks["agentd"]["ok"], checks["agentd"]
    assert checks["agentd"]["finding"] == (  # both loopback twins held
        f"listening: 127.0.0.1:{agent.port} ({ROOT}), [::1]:{agent.port} ({ROOT}), "
        f"127.0.0.1:{agent.metrics_port} ({ROOT}), [::1]:{agent.metrics_port} ({ROOT})")
    assert checks["Kineto"]["ok"], checks["Kineto"]  # the root agent serves @dynolog@ in this network namespace


def test_doctor_names_another_user_on_the_agents_port(namespace, hostile_user):
    port = free_port()
    squatter = wait_ready(namespace.popen([PYTHON, "-c", SQUAT, str(port)], user=hostile_user,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    try:
        code, checks = doctor(namespace, "--agent-port", str(port), "--metrics-port", str(free_port()))
        text = namespace.run([PYTHON, "-m", "tuiprof.cli", "doctor", "--agent-port", str(port)], timeout=120)
    finally:
        squatter.kill()
        squatter.wait(10)
    assert code == 1
    assert checks["agentd"]["finding"] == (f"the agent's ports are held by another user: 127.0.0.1:{port} "
                                           f"(user {hostile_user.name} (uid {hostile_user.uid}))")
    assert checks["agentd"]["fix"].startswith("that process is not the node's agent")
    assert text.returncode == 1 and "Traceback" not in text.stderr
    lines = text.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("NO  agentd"))
    assert f"held by another user: 127.0.0.1:{port} (user {hostile_user.name} (uid {hostile_user.uid}))" in lines[at]
    assert lines[at + 1].strip().startswith("fix: that process is not the node's agent")


def test_doctor_counts_processes_in_other_pid_namespaces(namespace):
    _, before = doctor(namespace)
    inside = namespace.popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sleep", "60"])
    try:
        children = pathlib.Path(f"/proc/{inside.pid}/task/{inside.pid}/children")
        deadline = time.monotonic() + 10
        while not children.read_text().split():  # the sleep runs in the new namespace once unshare forked
            assert time.monotonic() < deadline, "unshare did not fork"
            time.sleep(0.05)
        _, after = doctor(namespace)
    finally:
        inside.kill()
        inside.wait(10)
    assert not after["containers"]["ok"]
    assert processes_elsewhere(after) == processes_elsewhere(before) + 1, (before["containers"], after["containers"])


def processes_elsewhere(checks: dict[str, dict]) -> int:
    finding = checks["containers"]["finding"]
    return 0 if finding.startswith("no process") else int(finding.split()[0])


SQUAT_DYNOLOG = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(b"\\0dynolog\\0")
print("ready", flush=True)
sys.stdin.read()
"""


def test_doctor_names_another_user_holding_kinetos_socket(namespace, hostile_user):
    squatter = wait_ready(namespace.popen([PYTHON, "-c", SQUAT_DYNOLOG], user=hostile_user,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    try:
        command = pathlib.Path(f"/proc/{squatter.pid}/comm").read_text().strip()
        code, checks = doctor(namespace)
    finally:
        squatter.kill()
        squatter.wait(10)
    assert code == 1
    kineto = checks["Kineto"]
    assert not kineto["ok"] and kineto["finding"].startswith(
        f"@dynolog@ is held by pid {squatter.pid} ({command!r}) of user {hostile_user.name} (uid {hostile_user.uid})")
    assert kineto["fix"].startswith("stop that process")


def test_doctor_refuses_a_token_file_another_user_planted(namespace, hostile_user, tmp_path):
    planted = pathlib.Path("/tmp") / f"tp-doctor-token-{tmp_path.name}"
    done = namespace.run(["sh", "-c", f"umask 077 && echo stolen-token-0123456789 > {planted}"], user=hostile_user)
    assert done.returncode == 0, done.stderr
    try:
        code, checks = doctor(namespace, "--token-file", str(planted))
    finally:
        planted.unlink()
    assert code == 1
    assert checks["token"] == {
        "area": "token", "ok": False, "fix": "",
        "finding": f"token file {planted} belongs to user {hostile_user.name} (uid {hostile_user.uid}), not to you "
                   "or root; use a token file you own (mode 600)"}
