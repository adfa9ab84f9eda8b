"""Issue 24 item 5, by the user tuiprof-hostile against the root agent in its namespace: their job writes
a gzip bomb as its trace (one event, 1 GiB of one byte, about 1 MiB gzipped) while root's job writes a
real small trace. Root's summary comes promptly, and the bomb is refused with its reason, in one log line.

Both jobs are played on libkineto's wire (``TRAINER``: it polls the agent's Kineto endpoint as its
user, takes the config and writes its file where the config says), so the test needs no PyTorch.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import tempfile
import time

from agentd.traces.analysis.summarise import MAX_INFLATION_RATIO
from hostile.conftest import PYTHON
from hostile.test_traces import traced  # noqa: F401 (the fixture: the root agent with its Kineto endpoint)
from testkit.agents import stop_process
from testkit.traces import wait_registered
from traces.test_trace_bounds import CORPUS, gzip_bomb

BOMB_BYTES = 1 << 30
# Root's capture of a 1.7 MB trace, from the request to its summary: a second or two on this machine.
ROOT_DONE_WITHIN_SECONDS = 20.0

# Run as a user: polls the Kineto endpoint in argv[1] as libkineto does (job 4242, its own pid), and on
# the first config writes the file argv[2] where the config's ACTIVITIES_LOG_FILE says (libkineto's name
# for it: _<pid> before .pt.trace.json); prints "written", then waits for stdin to close.
TRAINER = """
import os, socket, sys, time, uuid
from agentd.kineto import config, wire
socket_dir, source = sys.argv[1], sys.argv[2]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind(f"{socket_dir}/dynoconfigclient{uuid.uuid4()}")
sock.settimeout(1.0)
text = ""
while not text:
    sock.sendto(wire.poll_request(3, 4242, (os.getpid(),)), f"{socket_dir}/dynolog")
    text = sock.recv(65536)[wire.HEADER_SIZE:].decode()
    time.sleep(0.1)
log_file = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)["ACTIVITIES_LOG_FILE"]
with open(source, "rb") as src, open(config.kineto_file_name(log_file, os.getpid()), "wb") as out:
    while piece := src.read(1 << 20):
        out.write(piece)
print("written", flush=True)
sys.stdin.read()
"""
# Run as a user: a capture of the pid argv[2] on the agent at port argv[1], followed until done; prints
# its targets (state, reason, the summary's error or whether it has a result) and the seconds it took.
CAPTURE = """
import json, sys, time
import grpc
from agentd.proto import tuiprof_agent_pb2 as pb, tuiprof_agent_pb2_grpc as pb_grpc
started = time.monotonic()
with grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}") as channel:
    stub = pb_grpc.AgentStub(channel)
    reply = stub.CaptureTrace(pb.CaptureTraceRequest(duration_ms=500, pids=[int(sys.argv[2])]), timeout=20)
    while not reply.done and time.monotonic() - started < 600:
        time.sleep(0.1)
        reply = stub.GetCaptureStatus(pb.CaptureStatusRequest(capture_id=reply.capture_id), timeout=20)
print(json.dumps({"seconds": time.monotonic() - started, "done": reply.done, "targets": [
    {"state": pb.TraceTargetState.Name(t.state), "reason": t.reason, "file": t.file, "error": t.summary.error,
     "summarised": bool(t.summary.result_json)} for t in reply.targets]}))
"""


def start_trainer(namespace, user, socket_dir: pathlib.Path, source: pathlib.Path) -> subprocess.Popen[str]:
    return namespace.popen([PYTHON, "-c", TRAINER, str(socket_dir), str(source)], user=user, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_capture(namespace, user, agent, pid: int) -> subprocess.Popen[str]:
    return namespace.popen([PYTHON, "-c", CAPTURE, str(agent.port), str(pid)], user=user,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(capture: subprocess.Popen[str]) -> dict:
    out, err = capture.communicate(timeout=120)
    assert capture.returncode == 0, err
    return json.loads(out)


def test_a_users_gzip_bomb_is_refused_and_roots_capture_is_summarised_meanwhile(traced, namespace,  # noqa: F811
                                                                                hostile_user):
    agent = traced.agent
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="tpbomb") as folder:
        bomb = pathlib.Path(folder) / "bomb.json"
        gzip_bomb(bomb, BOMB_BYTES)
        pathlib.Path(folder).chmod(0o755)
        bomb.chmod(0o644)  # the other user's job reads it
        theirs = start_trainer(namespace, hostile_user, traced.socket_dir, bomb)
        roots = start_trainer(namespace, None, traced.socket_dir, CORPUS / "hta_nccl_rank0.json.gz")
        try:
            wait_registered(agent, theirs.pid)
            wait_registered(agent, roots.pid)
            their_capture = start_capture(namespace, hostile_user, agent, theirs.pid)
            assert theirs.stdout is not None and theirs.stdout.readline().strip() == "written"
            time.sleep(0.5)  # the agent has seen the bomb written and is summarising it
            root_capture = start_capture(namespace, None, agent, roots.pid)
            root_result, their_result = finished(root_capture), finished(their_capture)
        finally:
            for trainer in (theirs, roots):
                stop_process(trainer)
    [root_target] = root_result["targets"]
    assert root_result["done"] and root_target["state"] == "TRACE_TARGET_STATE_WRITTEN" and root_target["summarised"], root_result
    assert root_result["seconds"] < ROOT_DONE_WITHIN_SECONDS, root_result
    [their_target] = their_result["targets"]
    assert their_result["done"] and not their_target["summarised"], their_result
    assert f"more than {MAX_INFLATION_RATIO} times" in their_target["error"], their_target
    summarised = [line for line in agent.log().splitlines()
                  if "trace summarised" in line and their_target["file"] in line]
    assert len(summarised) == 1 and "more than" in summarised[0], summarised
    agent.assert_healthy(user=hostile_user)
