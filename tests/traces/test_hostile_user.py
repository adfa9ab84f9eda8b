"""A second, unprivileged local user against a root agent: their trainer traces only into their own
folder, the Kineto config injection of issue 10 is refused, a symlink swap race never makes FetchFile
serve a file from outside, and the dynolog RPC triggers only the caller's own processes.

Everything is real: the agent (root), a PyTorch CPU trainer run as ``tuiprof-hostile`` through
setpriv, the attacker's swap loop as that user, the RPC client as that user (its uid read by the
agent from the kernel through sock_diag).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import grpc
import pytest

from agentd.kineto import wire
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.traces.paths import TraceDir
from testkit.agents import RunningAgent, running_agent
from testkit.ports import free_port
from testkit.traces import KinetoClient, as_user, hostile_user, run_cli, trainers, wait_registered

pytestmark = pytest.mark.slow
START_DELAY_MS = "6000"
INJECTION = "y\nACTIVITIES_LOG_FILE=/tmp/x.json\nREQUEST_TRACE_ID="
SWAP_SECONDS = 2.5
# The attacker's loop, run as the hostile user in their own folder: "real" is a folder holding a
# decoy "shadow", then for a moment a symlink to /etc, over and over.
SWAPPER = """
import os, sys, time
folder = sys.argv[1]
os.chdir(folder)
os.mkdir("real"); open("real/shadow", "w").write("decoy")
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[2])
swaps = 0
while time.monotonic() < end:
    os.rename("real", "parked"); os.symlink("/etc", "real")
    os.unlink("real"); os.rename("parked", "real")
    swaps += 1
print(swaps, flush=True)
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


class Setup:
    def __init__(self, agent: RunningAgent, socket_dir: pathlib.Path, user: tuple[int, int], rpc_port: int,
                 home: pathlib.Path) -> None:
        self.agent, self.socket_dir, self.user, self.rpc_port = agent, socket_dir, user, rpc_port
        self.home = home  # the user's own folder (their HOME, and where their `tuiprof trace` writes)


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    """A root agent whose trace dir other users can reach (parents 0711), with the dynolog RPC on."""
    user = hostile_user()
    base = pathlib.Path(tempfile.mkdtemp(prefix="tph", dir="/tmp"))
    base.chmod(0o711)
    home = base / "home"
    home.mkdir(mode=0o700)
    os.chown(home, *user)
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    socket_dir.chmod(0o777)  # the trainers of both users bind their client sockets here
    rpc_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    env["KINETO_IPC_SOCKET_DIR"] = str(socket_dir)
    try:
        with running_agent(base, env=env, extra_args=["--dynolog-rpc-port", str(rpc_port)]) as agent:
            yield Setup(agent, socket_dir, user, rpc_port, home)
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


def mode_and_owner(path: pathlib.Path) -> tuple[int, int]:
    info = path.lstat()
    return info.st_uid, stat.S_IMODE(info.st_mode)


async def capture(agent: RunningAgent, request: pb.CaptureTraceRequest) -> pb.CaptureTraceReply:
    async with grpc.aio.insecure_channel(agent.address.target) as channel:
        return await pb_grpc.AgentStub(channel).CaptureTrace(request)


async def test_injection_is_refused_and_the_users_trace_lands_in_their_own_folder(setup):
    uid, _ = setup.user
    with trainers(setup.socket_dir, [None], user=setup.user) as [trainer]:
        wait_registered(setup.agent, trainer.pid)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await capture(setup.agent, pb.CaptureTraceRequest(duration_ms=500, pids=[trainer.pid],
                                                              output_subdir=INJECTION))
        time.sleep(3)  # three polls: time enough to take a config, had one been queued
        # Nothing was queued: the next capture, the user's own through `tuiprof trace`, is not BUSY,
        # and is written into the user's folder.
        result = run_cli("trace", setup.agent.address.target, "--duration-ms", "800", "--pids", str(trainer.pid),
                         "--output", str(setup.home), "--start-delay-ms", START_DELAY_MS, "--json",
                         user=setup.user, home=setup.home)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "output_subdir" in refused.value.details() and "\n" not in refused.value.details()
    assert not list(pathlib.Path("/tmp").glob(f"x_{trainer.pid}*.json"))
    assert result.returncode == 0, result.stderr + result.stdout
    [target] = json.loads(result.stdout)["hosts"][0]["targets"]
    assert target["state"] == "written" and target["file"].startswith(f"{uid}/")
    trace = json.loads(pathlib.Path(target["local"]).read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    trace_dir = setup.agent.trace_dir
    assert mode_and_owner(trace_dir) == (0, 0o711)
    assert mode_and_owner(trace_dir / str(uid)) == (uid, 0o700)
    assert mode_and_owner(trace_dir / target["file"])[0] == uid
    assert {p.name for p in trace_dir.iterdir()} <= {str(uid), "0", "timeline"}  # no other folder made


def fetch(stub: pb_grpc.AgentStub, path: str) -> bytes | grpc.StatusCode:
    try:
        return b"".join(chunk.data for chunk in stub.FetchFile(pb.FetchFileRequest(path=path), timeout=10))
    except grpc.RpcError as exc:
        return exc.code()


def test_a_symlink_swap_race_never_serves_a_file_from_outside(setup):
    uid, _ = setup.user
    trace_dir = TraceDir(setup.agent.trace_dir)
    trace_dir.prepare()
    folder = trace_dir.path / trace_dir.user_folder(uid)
    (folder / "direct.json").symlink_to("/etc/shadow")
    os.lchown(folder / "direct.json", uid, -1)
    shadow = pathlib.Path("/etc/shadow").read_bytes()
    swapper = subprocess.Popen(as_user(setup.user, [sys.executable, "-c", SWAPPER, str(folder), str(SWAP_SECONDS)]),
                               stdout=subprocess.PIPE, text=True)
    outcomes: dict[str, int] = {}
    try:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        with grpc.insecure_channel(setup.agent.address.target) as channel:
            stub = pb_grpc.AgentStub(channel)
            assert fetch(stub, f"{uid}/direct.json") == grpc.StatusCode.INVALID_ARGUMENT
            while swapper.poll() is None:
                got = fetch(stub, f"{uid}/real/shadow")
                assert got != shadow, "FetchFile served /etc/shadow"
                key = got.decode() if isinstance(got, bytes) else got.name
                outcomes[key] = outcomes.get(key, 0) + 1
        swaps = int(swapper.stdout.readline())
    finally:
        swapper.kill()
        swapper.wait(10)
    assert set(outcomes) <= {"decoy", "INVALID_ARGUMENT", "NOT_FOUND"}, outcomes
    # Both sides of the race were hit: the decoy was served, and a swapped path was refused.
    assert outcomes.get("decoy", 0) > 0 and outcomes.get("INVALID_ARGUMENT", 0) + outcomes.get("NOT_FOUND", 0) > 0, (
        outcomes, swaps)


# The user's own gRPC calls: FetchFile of a path, CaptureTrace of a pid; prints the status code and details.
GRPC_CLIENT = """
import sys, grpc
from agentd.proto import tuiprof_agent_pb2 as pb, tuiprof_agent_pb2_grpc as pb_grpc
stub = pb_grpc.AgentStub(grpc.insecure_channel(sys.argv[1]))
try:
    if sys.argv[2] == "fetch":
        data = b"".join(c.data for c in stub.FetchFile(pb.FetchFileRequest(path=sys.argv[3]), timeout=20))
        print("OK", data.decode())
    else:
        reply = stub.CaptureTrace(pb.CaptureTraceRequest(duration_ms=100, pids=[int(sys.argv[3])], job_id="4243"),
                                  timeout=20)
        print("OK", "|".join(f"{t.state}: {t.reason}" for t in reply.targets))
except grpc.RpcError as exc:
    print(exc.code().name, exc.details())
"""


def as_hostile(setup: Setup, *args: str) -> str:
    command = [sys.executable, "-c", GRPC_CLIENT, setup.agent.address.target, *args]
    done = subprocess.run(as_user(setup.user, command), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_user_fetches_their_own_files_only_and_cannot_trace_roots_processes(setup):
    uid, _ = setup.user
    trace_dir = TraceDir(setup.agent.trace_dir)
    trace_dir.prepare()
    for owner in (0, uid):
        folder = trace_dir.path / trace_dir.user_folder(owner)
        (folder / "t.json").write_text(f"of {owner}")
        os.chown(folder / "t.json", owner, -1)
    assert as_hostile(setup, "fetch", f"{uid}/t.json") == f"OK of {uid}"
    denied = as_hostile(setup, "fetch", "0/t.json")
    assert denied.startswith("PERMISSION_DENIED '0/t.json' is in another user's folder; "
                             f"you (uid {uid}) may fetch only files under {uid}/"), denied
    client = KinetoClient(setup.socket_dir)  # a root process polling (job 4243: only this one)
    try:
        client.send(wire.poll_request(3, 4243, (os.getpid(),)))
        assert client.reply() == wire.poll_reply("")
        refused = as_hostile(setup, "capture", str(os.getpid()))
        client.send(wire.poll_request(3, 4243, (os.getpid(),)))
        assert client.reply() == wire.poll_reply("")  # nothing was queued for it
    finally:
        client.close()
    assert refused == (f"OK refused: the process belongs to uid 0; you (uid {uid}) may trace only your own "
                       "processes"), refused


def dyno(setup: Setup, request: dict | str, user: tuple[int, int] | None = None) -> dict | None:
    body = request if isinstance(request, str) else json.dumps(request)
    command = [sys.executable, "-c", DYNO_CLIENT, str(setup.rpc_port), body]
    done = subprocess.run(as_user(user, command) if user else command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_dynolog_rpc_triggers_only_the_callers_own_processes_and_refuses_garbage_in_one_line(setup):
    client = KinetoClient(setup.socket_dir)  # a root process polling, as a root trainer would
    try:
        # Job 4242: only this client (the trainers of other tests name this process as an ancestor).
        client.send(wire.poll_request(1, 4242, (os.getpid(),)))  # no activities bit: nothing handed out yet
        assert client.reply() == wire.poll_reply("")
        request = {"fn": "setKinetOnDemandRequest", "config": "ACTIVITIES_DURATION_MSECS=100", "job_id": 4242,
                   "pids": [os.getpid()]}
        assert dyno(setup, request, setup.user) == {
            "activityProfilersBusy": 0, "activityProfilersTriggered": [], "eventProfilersBusy": 0,
            "eventProfilersTriggered": [], "processesMatched": []}
        assert dyno(setup, request)["activityProfilersTriggered"] == [os.getpid()]  # root: any process
        client.send(wire.poll_request(3, 4242, (os.getpid(),)))
        config = client.reply()[wire.HEADER_SIZE:].decode()
        assert f"ACTIVITIES_LOG_FILE={setup.agent.trace_dir}/0/dyno-" in config
    finally:
        client.close()
    garbage = {"rpc-bad-json": '{"fn": "setKinetOnDemandRequest", "job_id": Infinity, "pids": [1]}',
               "rpc-too-deep": '{"fn": "getStatus", "x": ' + "[" * 5000 + "]" * 5000 + "}",
               "rpc-bad-request": '{"fn": "setKinetOnDemandRequest", "config": "", "pids": [1e400]}'}
    for cause, body in garbage.items():
        for _ in range(3):
            assert dyno(setup, body, setup.user) in (None, {"status": "failed"}), cause
    log = setup.agent.log()
    assert "Traceback" not in log
    for cause in garbage:
        assert sum(f"{cause}:" in line for line in log.splitlines()) == 1, cause
    assert dyno(setup, {"fn": "getStatus"}, setup.user) == {"status": 1}  # and it still answers


def test_trace_dir_is_not_listable_by_the_user(setup):
    uid, _ = setup.user
    trace_dir = TraceDir(setup.agent.trace_dir)
    trace_dir.prepare()
    trace_dir.user_folder(uid)
    listing = subprocess.run(as_user(setup.user, ["ls", str(setup.agent.trace_dir)]), capture_output=True,
                             text=True, timeout=30)
    assert listing.returncode != 0 and "Permission denied" in listing.stderr
    own = subprocess.run(as_user(setup.user, ["ls", str(setup.agent.trace_dir / str(uid))]), capture_output=True,
                         text=True, timeout=30)
    assert own.returncode == 0, own.stderr

