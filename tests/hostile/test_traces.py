"""The trace items of issue 10, by the user tuiprof-hostile against the root agent in its namespace:
the Kineto config injection through ``CaptureTraceRequest.output_subdir`` is refused and their trace
lands in their own folder, a symlink swap race never makes FetchFile serve a file from outside, they
fetch only their own files and cannot trace root's processes, the dynolog RPC triggers only their own
processes (a ``--log-file`` of their choosing is written by their own trainer, with their rights), and the trace
dir is not listable. After each, the agent is healthy.

Everything is real: the agent (root), a PyTorch CPU trainer run as the user, the user's swap loop,
their gRPC and dynolog calls (their uid read by the agent from the kernel), all inside the namespace.
The Kineto endpoint is a socket dir both users reach, so that a root process of this test can play
libkineto on the wire (``KinetoClient``) next to the namespaced agent.
"""

from __future__ import annotations

import json
import os
import pathlib
import select
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from agentd.kineto import wire
from agentd.traces.paths import TraceDir
from hostile.conftest import PYTHON, HostileAgent
from testkit.agents import stop_process
from testkit.namespaces import Namespace, User, wait_ready
from testkit.ports import free_port
from testkit.traces import TRAINER, KinetoClient, kineto_env, wait_registered

pytestmark = pytest.mark.slow
START_DELAY_MS = "6000"
READY_TIMEOUT_SECONDS = 90.0
INJECTION = "y\nACTIVITIES_LOG_FILE=/tmp/x.json\nREQUEST_TRACE_ID="
DYNO_GPUTRACE = pathlib.Path(__file__).parents[1] / "traces" / "data" / "dyno" / "gputrace-iterations.bin"
RACE_SECONDS = "2.5"
# The user's loop in their own folder until killed: "real" is a folder holding a decoy "shadow",
# then for a moment a symlink to /etc, over and over.
SWAPPER = """
import os, sys
os.chdir(sys.argv[1])
os.mkdir("real"); open("real/shadow", "w").write("decoy")
print("ready", flush=True)
while True:
    os.rename("real", "parked"); os.symlink("/etc", "real")
    os.unlink("real"); os.rename("parked", "real")
"""
# One dynolog RPC request, as `dyno` frames it; prints the reply (or null when the agent closes).
DYNO_CLIENT = """
import json, socket, struct, sys
body = sys.argv[2].encode()
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as conn:
    conn.sendall(struct.pack("<i", len(body)) + body)
    header = conn.recv(4)
    data = b""
    if header:
        length = struct.unpack("<i", header)[0]
        while len(data) < length:
            data += conn.recv(length - len(data))
print(json.dumps(json.loads(data) if data else None))
"""


class Traced:
    """The root agent with the dynolog RPC on and its Kineto endpoint in ``socket_dir``."""

    def __init__(self, agent: HostileAgent, socket_dir: pathlib.Path, rpc_port: int) -> None:
        self.agent, self.socket_dir, self.rpc_port = agent, socket_dir, rpc_port


@pytest.fixture
def traced(agent_in_namespace, namespace) -> Iterator[Traced]:
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    socket_dir.chmod(0o777)  # the trainers of both users bind their client sockets here
    rpc_port = free_port()
    env = namespace.env(None) | {"KINETO_IPC_SOCKET_DIR": str(socket_dir)}
    try:
        yield Traced(agent_in_namespace("--dynolog-rpc-port", str(rpc_port), env=env), socket_dir, rpc_port)
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
def user_home(hostile_user) -> Iterator[pathlib.Path]:
    """The user's own folder (0700): their HOME, and where their `tuiprof trace` writes."""
    home = pathlib.Path(tempfile.mkdtemp(prefix="tphome", dir="/tmp"))
    os.chown(home, hostile_user.uid, hostile_user.gid)
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def user_trace_folder(traced, hostile_user) -> pathlib.Path:
    """The user's folder in the agent's trace dir, made as the agent makes it."""
    trace_dir = TraceDir(traced.agent.trace_dir)
    trace_dir.prepare()
    return trace_dir.path / trace_dir.user_folder(hostile_user.uid)


def started_trainer(namespace: Namespace, user: User, socket_dir: pathlib.Path,
                    home: pathlib.Path) -> subprocess.Popen[bytes]:
    """tests/traces/trainer.py as ``user`` inside the namespace, polling the agent's Kineto endpoint."""
    env = kineto_env(socket_dir, HOME=str(home))
    with tempfile.TemporaryFile() as stderr:
        trainer = namespace.popen([PYTHON, TRAINER, "--seconds", "90"], user=user, env=env, stdout=subprocess.PIPE,
                                  stderr=stderr)  # a file: an unread pipe could fill and stall it
    assert trainer.stdout is not None
    readable, _, _ = select.select([trainer.stdout], [], [], READY_TIMEOUT_SECONDS)
    if not readable or trainer.stdout.readline().strip() != b"ready":
        stop_process(trainer)
        raise AssertionError(f"trainer {trainer.pid} not ready after {READY_TIMEOUT_SECONDS} s")
    return trainer


def mode_and_owner(path: pathlib.Path) -> tuple[int, int]:
    info = path.lstat()
    return info.st_uid, stat.S_IMODE(info.st_mode)


def test_injection_is_refused_and_the_users_trace_lands_in_their_own_folder(traced, namespace, hostile_user,
                                                                          user_home):
    agent, uid = traced.agent, hostile_user.uid
    trainer = started_trainer(namespace, hostile_user, traced.socket_dir, user_home)
    try:
        wait_registered(agent, trainer.pid)
        refused = agent.client("capture", "--pids", str(trainer.pid), "--output-subdir", INJECTION)
        time.sleep(3)  # three polls: time enough to take a config, had one been queued
        # Nothing was queued: the next capture, the user's own through `tuiprof trace`, is not BUSY,
        # and is written into the user's folder.
        result = namespace.run([PYTHON, "-m", "tuiprof.cli", "trace", f"127.0.0.1:{agent.port}", "--duration-ms",
                                "800", "--pids", str(trainer.pid), "--output", str(user_home),
                                "--start-delay-ms", START_DELAY_MS, "--fetch", "all", "--json"],
                               user=hostile_user, env=namespace.env(hostile_user) | {"HOME": str(user_home)},
                               timeout=120)
    finally:
        stop_process(trainer)
    assert refused["code"] == "INVALID_ARGUMENT", refused
    assert "output_subdir" in refused["details"] and "\n" not in refused["details"]
    assert not list(pathlib.Path("/tmp").glob(f"x_{trainer.pid}*.json"))
    assert result.returncode == 0, result.stderr + result.stdout
    [target] = json.loads(result.stdout)["hosts"][0]["targets"]
    assert target["state"] == "written" and target["file"].startswith(f"{uid}/")
    trace = json.loads(pathlib.Path(target["local"]).read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    assert mode_and_owner(agent.trace_dir) == (0, 0o711)
    assert mode_and_owner(agent.trace_dir / str(uid)) == (uid, 0o700)
    assert mode_and_owner(agent.trace_dir / target["file"])[0] == uid
    assert {p.name for p in agent.trace_dir.iterdir()} <= {str(uid), "0", "timeline"}  # no other folder made
    agent.assert_healthy(user=hostile_user)


def test_a_symlink_swap_race_never_serves_a_file_from_outside(traced, namespace, hostile_user, user_trace_folder):
    agent, uid = traced.agent, hostile_user.uid
    (user_trace_folder / "direct.json").symlink_to("/etc/shadow")
    os.lchown(user_trace_folder / "direct.json", uid, -1)
    swapper = namespace.popen([PYTHON, "-c", SWAPPER, user_trace_folder], user=hostile_user,
                              stdout=subprocess.PIPE, text=True)
    try:
        wait_ready(swapper)
        direct = agent.client("fetch", "--path", f"{uid}/direct.json", user=hostile_user)
        race = agent.client("fetch-race", "--path", f"{uid}/real/shadow", "--seconds", RACE_SECONDS,
                            user=hostile_user)
        assert swapper.poll() is None, "the swap loop stopped before the race ended"
    finally:
        stop_process(swapper)
    assert direct["code"] == "INVALID_ARGUMENT", direct
    outcomes = race["outcomes"]
    # Anything served is the decoy (/etc/shadow's text would be a key of its own).
    assert set(outcomes) <= {"decoy", "INVALID_ARGUMENT", "NOT_FOUND"}, outcomes
    # Both sides of the race were hit: the decoy was served, and a swapped path was refused.
    assert outcomes.get("decoy", 0) > 0, outcomes
    assert outcomes.get("INVALID_ARGUMENT", 0) + outcomes.get("NOT_FOUND", 0) > 0, outcomes
    agent.assert_healthy(user=hostile_user)


def test_a_user_fetches_their_own_files_only_and_cannot_trace_roots_processes(traced, hostile_user):
    agent, uid = traced.agent, hostile_user.uid
    trace_dir = TraceDir(agent.trace_dir)
    trace_dir.prepare()
    for owner in (0, uid):
        folder = trace_dir.path / trace_dir.user_folder(owner)
        (folder / "t.json").write_text(f"of {owner}")
        os.chown(folder / "t.json", owner, -1)
    own = agent.client("fetch", "--path", f"{uid}/t.json", user=hostile_user)
    assert own == {"code": "OK", "text": f"of {uid}"}, own
    denied = agent.client("fetch", "--path", "0/t.json", user=hostile_user)
    assert denied["code"] == "PERMISSION_DENIED", denied
    assert denied["details"].startswith(f"'0/t.json' is in another user's folder; you (uid {uid}) may fetch "
                                        f"only files under {uid}/"), denied
    client = KinetoClient(traced.socket_dir)  # a root process polling (job 4243: only this one)
    try:
        client.send(wire.poll_request(3, 4243, (os.getpid(),)))
        assert client.reply() == wire.poll_reply("")
        refused = agent.client("capture", "--pids", str(os.getpid()), "--job-id", "4243", "--duration-ms", "100",
                               user=hostile_user)
        client.send(wire.poll_request(3, 4243, (os.getpid(),)))
        assert client.reply() == wire.poll_reply("")  # nothing was queued for it
    finally:
        client.close()
    assert refused["code"] == "OK", refused
    [target] = refused["reply"]["targets"]
    assert (target["state"], target["reason"]) == (
        "TRACE_TARGET_STATE_REFUSED", f"the process belongs to uid 0; you (uid {uid}) may trace only your own processes"), target
    agent.assert_healthy(user=hostile_user)


def dyno(traced: Traced, namespace: Namespace, request: dict | str, user: User | None = None) -> dict | None:
    body = request if isinstance(request, str) else json.dumps(request)
    done = namespace.run([PYTHON, "-c", DYNO_CLIENT, str(traced.rpc_port), body], user=user, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_dynolog_rpc_triggers_only_the_callers_own_processes_and_refuses_garbage_in_one_line(
        traced, namespace, hostile_user):
    agent = traced.agent
    client = KinetoClient(traced.socket_dir)  # a root process polling, as a root trainer would
    try:
        client.send(wire.poll_request(1, 4242, (os.getpid(),)))  # no activities bit: nothing handed out yet
        assert client.reply() == wire.poll_reply("")
        request = {"fn": "setKinetOnDemandRequest", "config": "ACTIVITIES_DURATION_MSECS=100", "job_id": 4242,
                   "pids": [os.getpid()]}
        assert dyno(traced, namespace, request, hostile_user) == {
            "activityProfilersBusy": 0, "activityProfilersTriggered": [], "eventProfilersBusy": 0,
            "eventProfilersTriggered": [], "processesMatched": []}
        root_reply = dyno(traced, namespace, request)
        assert root_reply is not None and root_reply["activityProfilersTriggered"] == [os.getpid()]  # root: any
        client.send(wire.poll_request(3, 4242, (os.getpid(),)))
        config = client.reply()[wire.HEADER_SIZE:].decode()
        assert f"ACTIVITIES_LOG_FILE={agent.trace_dir}/0/dyno-" in config
    finally:
        client.close()
    garbage = {"rpc-bad-json": '{"fn": "setKinetOnDemandRequest", "job_id": Infinity, "pids": [1]}',
               "rpc-too-deep": '{"fn": "getStatus", "x": ' + "[" * 5000 + "]" * 5000 + "}",
               "rpc-bad-request": '{"fn": "setKinetOnDemandRequest", "config": "", "pids": [1e400]}'}
    for cause, body in garbage.items():
        for _ in range(3):
            assert dyno(traced, namespace, body, hostile_user) in (None, {"status": "failed"}), cause
    log = agent.log()
    assert "Traceback" not in log, log
    for cause in garbage:
        assert sum(f"{cause}:" in line for line in log.splitlines()) == 1, cause
    assert dyno(traced, namespace, {"fn": "getStatus"}, hostile_user) == {"status": 1}  # and it still answers
    agent.assert_healthy(user=hostile_user)


def captured_gputrace(log_file: str, pid: int, job_id: int = 0) -> dict:
    """The request a real `dyno gputrace --log-file /tmp/trace.json --iterations 3` sent
    (tests/traces/data/dyno), with ``log_file``, ``pid`` and ``job_id`` in place of its own."""
    request = json.loads(DYNO_GPUTRACE.read_bytes()[4:])
    request["config"] = request["config"].replace("ACTIVITIES_LOG_FILE=/tmp/trace.json", f"ACTIVITIES_LOG_FILE={log_file}")
    return request | {"pids": [pid], "job_id": job_id}


def test_dyno_log_file_of_the_users_own_is_written_by_their_trainer_and_never_reaches_roots_process(
        traced, namespace, hostile_user, user_home):
    agent, uid = traced.agent, hostile_user.uid
    client = KinetoClient(traced.socket_dir)  # a root process polling (job 4244: only this one)
    trainer = started_trainer(namespace, hostile_user, traced.socket_dir, user_home)
    try:
        client.send(wire.poll_request(3, 4244, (os.getpid(),)))
        assert client.reply() == wire.poll_reply("")
        wait_registered(agent, trainer.pid)
        roots = dyno(traced, namespace, captured_gputrace(f"{user_home}/x.json", os.getpid(), 4244), hostile_user)
        assert roots == {"activityProfilersBusy": 0, "activityProfilersTriggered": [], "eventProfilersBusy": 0,
                         "eventProfilersTriggered": [], "processesMatched": []}
        client.send(wire.poll_request(3, 4244, (os.getpid(),)))
        assert client.reply() == wire.poll_reply("")  # nothing was queued for root's process
        for log_file, why in (("x.json", "log file 'x.json' is relative: give an absolute path"),
                              (f"{user_home}/a\x01.json", "holds a control character; give a path of printable")):
            refused = dyno(traced, namespace, captured_gputrace(log_file, trainer.pid), hostile_user)
            assert refused is not None and refused["processesMatched"] == [] and why in refused["refused"], refused
        own = dyno(traced, namespace, captured_gputrace(f"{user_home}/libkineto_trace.json", trainer.pid),
                   hostile_user)
        assert own is not None and own["activityProfilersTriggered"] == [trainer.pid], own
        written = user_home / f"libkineto_trace_{trainer.pid}.json"  # where dyno prints it: Kineto's _<pid>
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not written.exists():
            assert time.monotonic() < deadline, f"no {written}: {list(user_home.iterdir())}"
            time.sleep(0.2)
    finally:
        stop_process(trainer)
        client.close()
    assert mode_and_owner(written)[0] == uid  # the trainer wrote it, as its owner
    assert any(e.get("name") == "aten::mm" for e in json.loads(written.read_text())["traceEvents"])
    assert not [p for p in agent.trace_dir.rglob("*") if p.is_file()]  # the agent wrote nothing of its own
    agent.assert_healthy(user=hostile_user)


def test_trace_dir_is_not_listable_by_the_user(traced, run_as_hostile, hostile_user, user_trace_folder):
    agent = traced.agent
    listing = run_as_hostile(["ls", str(agent.trace_dir)])
    assert listing.returncode != 0 and "Permission denied" in listing.stderr
    own = run_as_hostile(["ls", str(user_trace_folder)])
    assert own.returncode == 0, own.stderr
    agent.assert_healthy(user=hostile_user)
