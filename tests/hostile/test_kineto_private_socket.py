"""Kineto's own sockets against the user tuiprof-hostile (issue 24 items 1, 8, 11a), all real, in the namespace.

- A root job started with `tuiprof run`'s environment polls the root agent over file sockets in
  root's own Kineto folder: the user finds its client socket in /proc/net/unix but reaches it
  neither from a named nor from an unnamed socket, the job keeps running and writes nothing where
  the user asked, the user cannot reach root's folder, and root's capture through the agent works.
- The user who binds ``@dynolog@`` before the agent starts is named (pid, uid) in the kineto
  collector's reason; the agent takes the name once the squatter leaves.
- A poll whose pid ancestry names root's process as the user's ancestor is not believed: root's
  capture of that process does not take the user's process in.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
import time

import pytest

from hostile.conftest import PYTHON, HostileAgent, wait_ready
from testkit.agents import stop_process
from testkit.traces import TRAINER, wait_registered
from tuiprof.commands.run import launch_environment

pytestmark = pytest.mark.slow
REGISTER_SECONDS = 60.0

# As the user: every dynoconfigclient socket in /proc/net/unix, and a forged trace config sent to
# each from a named and from an unnamed socket; what happened to each send.
ATTACK = """
import errno, json, socket, sys
from agentd.kineto import wire
config = wire.poll_reply("ACTIVITIES_DURATION_MSECS=500\\nACTIVITIES_LOG_FILE=%s/stolen.json\\n" % sys.argv[1])
found, outcomes = [], []
for line in open("/proc/net/unix").read().splitlines()[1:]:
    fields = line.split()
    if len(fields) >= 8 and "dynoconfigclient" in fields[7]:
        found.append(fields[7])
for name in found + sys.argv[2:]:
    address = b"\\0" + name[1:].replace("@", "\\0").encode() if name.startswith("@") else name
    for named in (True, False):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if named:
            sock.bind(b"\\0tuiprof-hostile-sender")
        try:
            sock.sendto(config, address)
            outcomes.append([name, named, "delivered"])
        except OSError as exc:
            outcomes.append([name, named, errno.errorcode[exc.errno]])
        sock.close()
print(json.dumps({"found": found, "outcomes": outcomes}))
"""
SQUATTER = """
import socket, time
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind(b"\\0dynolog\\0")
print("ready", flush=True)
time.sleep(600)
"""
# As the user: polls @dynolog@ claiming argv[1] (root's process) as its parent, twice a second.
FORGER = """
import os, socket, sys, time
from agentd.kineto import wire
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind(b"\\0tuiprof-hostile-forger")
sock.settimeout(2)
print("ready", flush=True)
while True:
    sock.sendto(wire.poll_request(3, 0, (os.getpid(), int(sys.argv[1]))), b"\\0dynolog\\0")
    try:
        sock.recv(65536)
    except socket.timeout:
        pass
    time.sleep(0.5)
"""
FOLDERS = """
import json, sys
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.local import local_agent_folders
folders = local_agent_folders(int(sys.argv[1]), ConnectionOptions(timeout=10))
print(json.dumps({"kineto": folders.kineto_socket_dir, "problem": folders.kineto_problem}))
"""


@pytest.fixture
def private_run(namespace) -> None:
    """A fresh /run in the namespace: the agent's per-user folders go under /run/tuiprof/kineto."""
    done = namespace.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"])
    assert done.returncode == 0, done.stderr


def folders_of(agent: HostileAgent, user=None) -> dict:
    done = agent.namespace.run([PYTHON, "-c", FOLDERS, str(agent.port)], user=user)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_tuiprof_run_job_cannot_be_reached_by_another_user(private_run, agent_in_namespace, namespace,
                                                             hostile_user, run_as_hostile, tmp_path):
    agent = agent_in_namespace()
    root_folders = folders_of(agent)
    folder = root_folders["kineto"]
    assert folder == "/run/tuiprof/kineto/0", root_folders
    # The user's own folder is theirs; root's is not reachable by them.
    own = folders_of(agent, user=hostile_user)
    assert own["kineto"] == f"/run/tuiprof/kineto/{hostile_user.uid}", own

    base = tmp_path / "kineto-base.conf"
    base.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
    env = launch_environment(namespace.env(None), kineto_socket_dir=folder) | {"KINETO_CONFIG": str(base)}
    assert env["KINETO_USE_DAEMON"] == "1" and env["KINETO_IPC_SOCKET_DIR"] == folder
    loot = pathlib.Path(tempfile.mkdtemp(prefix="tploot", dir="/tmp"))
    os.chown(loot, hostile_user.uid, hostile_user.gid)
    with tempfile.TemporaryFile() as stderr:
        trainer = namespace.popen([PYTHON, TRAINER, "--seconds", "120"], env=env, stdout=subprocess.PIPE,
                                  stderr=stderr)
    try:
        assert trainer.stdout is not None and trainer.stdout.readline().strip() == b"ready"
        wait_registered(agent, trainer.pid, REGISTER_SECONDS)
        attack = run_as_hostile([PYTHON, "-c", ATTACK, str(loot), f"{folder}/dynolog"])
        assert attack.returncode == 0, attack.stderr
        report = json.loads(attack.stdout)
        # The job's client socket is listed (by path), and it is the only kind there is: no abstract name.
        assert report["found"] and all(name.startswith(f"{folder}/dynoconfigclient") for name in report["found"]), \
            report
        assert report["outcomes"] and all(outcome == "EACCES" for _, _, outcome in report["outcomes"]), report
        time.sleep(3)  # three polls: time to act on a config, had one arrived
        assert trainer.poll() is None, f"the job died with {trainer.returncode}"
        assert list(loot.iterdir()) == []
        # Root's own capture of its job, through the agent, still reaches it.
        out = tmp_path / "traces"
        traced = namespace.run([PYTHON, "-m", "tuiprof.cli", "trace", f"127.0.0.1:{agent.port}", "--duration-ms",
                                "500", "--pids", str(trainer.pid), "--output", str(out), "--start-delay-ms",
                                "3000", "--fetch", "all", "--json"], timeout=120)
        assert traced.returncode == 0, traced.stdout + traced.stderr
        assert any(path.suffix == ".json" or path.name.endswith(".json.gz") for path in out.rglob("*")), \
            traced.stdout
        assert trainer.poll() is None
    finally:
        stop_process(trainer)
        subprocess.run(["rm", "-rf", str(loot)], check=False)
    agent.assert_healthy(user=hostile_user)


def test_a_squatter_on_dynolog_is_named_and_the_agent_takes_the_name_after(private_run, agent_in_namespace,
                                                                           namespace, hostile_user):
    squatter = wait_ready(namespace.popen([PYTHON, "-c", SQUATTER], user=hostile_user, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    try:
        agent = agent_in_namespace()
        [kineto] = [c for c in agent.client("info")["reply"]["collectors"] if c["name"] == "kineto"]
        assert "@dynolog@" in kineto["reason"], kineto
        assert f"pid {squatter.pid} " in kineto["reason"], kineto
        assert f"(uid {hostile_user.uid})" in kineto["reason"], kineto
        assert f"pid {squatter.pid} " in agent.log()
        # Per-user folders are still served while the name is held.
        assert folders_of(agent)["kineto"] == "/run/tuiprof/kineto/0"
    finally:
        stop_process(squatter)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        [kineto] = [c for c in agent.client("info")["reply"]["collectors"] if c["name"] == "kineto"]
        if not kineto.get("reason"):
            break
        time.sleep(0.5)
    assert kineto.get("available") and not kineto.get("reason"), kineto
    assert "Kineto IPC socket bound after all" in agent.log()
    agent.assert_healthy(user=hostile_user)


def test_a_forged_ancestry_does_not_join_roots_capture(agent_in_namespace, namespace, hostile_user):
    agent = agent_in_namespace()
    root_process = namespace.popen(["sleep", "120"])
    forger = wait_ready(namespace.popen([PYTHON, "-c", FORGER, str(root_process.pid)], user=hostile_user,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        wait_registered(agent, forger.pid, REGISTER_SECONDS)
        capture = agent.client("capture", "--pids", str(root_process.pid), "--duration-ms", "100")
        log = agent.log()
    finally:
        stop_process(forger)
        stop_process(root_process)
    assert "forged-ancestry" in log and f"pid {forger.pid} claims the ancestry" in log, log[-3000:]
    targets = capture.get("reply", {}).get("targets", [])
    assert all(int(target.get("pid", 0)) != forger.pid for target in targets), capture
    agent.assert_healthy(user=hostile_user)
