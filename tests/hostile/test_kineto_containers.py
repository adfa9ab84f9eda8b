"""Kineto's daemon protocol across network namespaces (issue 28 item 2), all real.

The root agent runs in its namespace (the "host" here); a ``KINETO_USE_DAEMON=1`` PyTorch trainer runs
in a container made with unshare (own pid, mount, network, IPC and UTS namespaces, its own /tmp), under a
shell launcher. The agent serves ``@dynolog@`` inside the container's network namespace: the trainer
registers under its host pid with its ancestry in host pids; ``tuiprof trace --pids <host pid>`` and
dyno's gputrace request (the bytes a real ``dyno`` sent) naming the launcher's host pid trace it, and the
trace, written in the container's own /tmp, lands in the trace dir where the agent serves it; dyno's own
``--log-file /tmp/trace.json`` is written in the container's file system, as a dynolog beside it would have it.

A process in a second container that claims the first container's trainer (or a host pid) as itself or
as its parent is not believed: the poll is refused or cut to its own pid, and logged as forged.
"""

from __future__ import annotations

import gzip
import json
import pathlib
import re
import subprocess
import time

import pytest

from hostile.conftest import PYTHON
from testkit.agents import stop_process
from testkit.containers import Container
from testkit.namespaces import wait_ready
from testkit.ports import free_port
from testkit.traces import TRAINER, wait_registered

pytestmark = pytest.mark.slow
REGISTER_SECONDS = 60.0
COPIED_SECONDS = 60.0
DYNO_REQUEST = pathlib.Path(__file__).parents[1] / "traces" / "data" / "dyno" / "gputrace-iterations.bin"
# The trainer under a shell that stays its parent; the base config shortens libkineto's poll to 1 s.
LAUNCHER = (f"echo ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1 > /tmp/kineto.conf && "
            f"{PYTHON} {TRAINER} --seconds 150; true")
# dyno's RPC framing: a little-endian int32 length, then the JSON; the reply likewise.
DYNO = """
import json, socket, struct, sys
body = sys.stdin.buffer.read()
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as sock:
    sock.sendall(struct.pack("<i", len(body)) + body)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
print(json.dumps(json.loads(data[4:])))
"""
# Polls @dynolog@ in its own namespace, claiming argv[1] as itself, then itself with argv[1] as its parent.
FORGER = """
import os, socket, sys, time
from agentd.kineto import wire
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind(b"\\0tuiprof-container-forger")
sock.settimeout(1)
print("ready", flush=True)
while True:
    for claim in ((int(sys.argv[1]),), (os.getpid(), int(sys.argv[1]))):
        try:
            sock.sendto(wire.poll_request(3, 0, claim), b"\\0dynolog\\0")
            sock.recv(65536)
        except OSError:
            pass  # not served yet in this namespace, or no answer: try again
    time.sleep(0.5)
"""


def container_env(namespace) -> dict[str, str]:
    env = namespace.env(None)
    for name in ("KINETO_IPC_SOCKET_DIR", "RANK"):
        env.pop(name, None)
    return env | {"KINETO_USE_DAEMON": "1", "KINETO_CONFIG": "/tmp/kineto.conf"}


def load_json(path: pathlib.Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def registered_line(log: str, pid: int) -> str:
    return next(line for line in log.splitlines() if "Kineto client registered" in line and f"pid={pid}" in line)


@pytest.fixture
def container():
    with Container.create(private_tmp=True) as box:
        yield box


@pytest.fixture
def trainer_in(container, namespace, tmp_path):
    """(launcher's host pid, trainer's host pid) of a real trainer in ``container``."""
    stderr = tmp_path / "trainer.stderr"
    with open(stderr, "w") as errors:  # a file, not a pipe: Kineto logs a lot and nobody reads it meanwhile
        launcher = container.popen(["sh", "-c", LAUNCHER], env=container_env(namespace), stdout=subprocess.PIPE,
                                   stderr=errors, text=True)
    try:
        try:
            wait_ready(launcher)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the trainer's stderr ends:\n{stderr.read_text()[-3000:]}") from None
        trainer = container.host_pid_of(launcher, PYTHON, str(TRAINER))
        shell = container.host_pid_of(launcher, "sh", str(TRAINER))
        yield shell, trainer
    finally:
        stop_process(launcher)


def test_a_containerised_trainer_registers_by_host_pid_and_its_traces_land_in_the_trace_dir(
        agent_in_namespace, namespace, container, trainer_in, tmp_path):
    rpc_port = free_port()
    agent = agent_in_namespace("--dynolog-rpc-port", str(rpc_port))
    assert container.holder.namespace("net") != namespace.holder.namespace("net")
    shell, trainer = trainer_in
    wait_registered(agent, trainer, REGISTER_SECONDS)
    line = registered_line(agent.log(), trainer)
    # Host pids for the trainer and its launcher; the trainer's own pid as the container numbers it.
    assert ancestry_of(agent.log(), trainer) == f"{trainer},{shell}", line
    assert f"pid_in_namespace={container.pid_inside(trainer)}" in line, line
    assert "Kineto IPC socket served in another network namespace" in agent.log()

    output = tmp_path / "out"
    done = namespace.run([PYTHON, "-m", "tuiprof.cli", "trace", f"127.0.0.1:{agent.port}", "--duration-ms", "1000",
                          "--pids", str(trainer), "--start-delay-ms", "6000", "--output", str(output),
                          "--fetch", "all", "--json"], timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr + agent.log()[-3000:]
    [target] = json.loads(done.stdout)["hosts"][0]["targets"]
    assert target["pid"] == trainer and target["state"] == "written", target
    assert target["file"].startswith("0/") and target["file"].endswith(f"_{container.pid_inside(trainer)}.pt.trace.json")
    mm = [e for e in load_json(pathlib.Path(target["local"]))["traceEvents"] if e.get("name") == "aten::mm"]
    assert mm, "no aten::mm in the container's trace"
    assert (agent.trace_dir / target["file"]).stat().st_uid == 0

    # dyno's own gputrace request, naming the launcher's host pid: the trainer under it is traced.
    request = json.loads(DYNO_REQUEST.read_bytes()[4:])
    log_file = agent.trace_dir / "0" / "dyno.json"
    request["config"] = request["config"].replace("/tmp/trace.json", str(log_file))
    request["pids"] = [shell]
    done = namespace.run([PYTHON, "-c", DYNO, str(rpc_port)], input=json.dumps(request))
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["processesMatched"] == [trainer] and reply["activityProfilersTriggered"] == [trainer], reply
    copied = agent.trace_dir / "0" / f"dyno_{trainer}.json"
    deadline = time.monotonic() + COPIED_SECONDS
    while not copied.exists():
        assert time.monotonic() < deadline, f"no {copied}:\n{agent.log()[-3000:]}"
        time.sleep(0.5)
    steps = [e for e in load_json(copied)["traceEvents"] if e.get("name", "").startswith("Optimizer.step#")]
    assert len(steps) == 3, [e["name"] for e in steps]

    # dyno's own --log-file /tmp/trace.json: a path of the caller's choosing is the trainer's, in its own file
    # system, as with a dynolog beside it; Kineto names it with the pid it has there, and nothing is copied out.
    request["config"] = request["config"].replace(str(log_file), "/tmp/trace.json")
    done = namespace.run([PYTHON, "-c", DYNO, str(rpc_port)], input=json.dumps(request))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["activityProfilersTriggered"] == [trainer], done.stdout
    inside = pathlib.Path(f"/proc/{trainer}/root/tmp/trace_{container.pid_inside(trainer)}.json")
    deadline = time.monotonic() + COPIED_SECONDS
    while not inside.exists():
        assert time.monotonic() < deadline, f"no {inside}:\n{agent.log()[-3000:]}"
        time.sleep(0.5)
    assert len([e for e in load_json(inside)["traceEvents"] if e.get("name", "").startswith("Optimizer.step#")]) == 3
    assert not pathlib.Path(f"/tmp/trace_{trainer}.json").exists()
    assert not list(agent.trace_dir.glob("0/trace_*"))
    agent.assert_healthy()


def test_a_process_in_another_container_cannot_claim_the_first_ones_trainer(
        agent_in_namespace, namespace, container, trainer_in):
    agent = agent_in_namespace()
    _, trainer = trainer_in
    wait_registered(agent, trainer, REGISTER_SECONDS)
    with Container.create(private_tmp=True) as other:
        forger_entered = other.popen([PYTHON, "-c", FORGER, str(trainer)], env=container_env(namespace),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=namespace_repo())
        try:
            wait_ready(forger_entered)
            forger = other.host_pid_of(forger_entered, PYTHON, "tuiprof-container-forger")
            wait_registered(agent, forger, REGISTER_SECONDS)
            capture = agent.client("capture", "--pids", str(trainer), "--duration-ms", "100")
            log = agent.log()
        finally:
            stop_process(forger_entered)
    # Claiming the trainer as itself is refused; as its parent, cut to its own pid: believed only as itself.
    assert ancestry_of(log, forger) == str(forger), registered_line(log, forger)
    assert f"pid {forger} claims the ancestry [" in log and "forged-ancestry" in log, log[-3000:]
    targets = capture.get("reply", {}).get("targets", [])
    assert [int(t["pid"]) for t in targets] == [trainer], capture
    agent.assert_healthy()


def namespace_repo() -> str:
    return str(pathlib.Path(__file__).resolve().parents[2])


def ancestry_of(log: str, pid: int) -> str:
    """The ancestry the agent registered ``pid`` with (host pids, comma-separated)."""
    found = re.search(r"ancestry=([0-9,]+)", registered_line(log, pid))
    assert found is not None, registered_line(log, pid)
    return found.group(1)
