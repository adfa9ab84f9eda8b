"""dynolog's TCP RPC on agentd (off by default): requests the real `dyno` CLI sent (tests/traces/data/dyno),
a real PyTorch trainer traced through it, both loopbacks, and the deliberate deviations (log files only in the
traced user's folder, the local caller traces only their own processes)."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import struct
import time
import asyncio

import pytest

from agentd.kineto.registry import Registry
from agentd.kineto.rpc import DynologRpc, client_config


def call(port: int, request: dict | bytes, host: str = "127.0.0.1") -> dict | None:
    """One request as `dyno` sends it: int32 length (little endian) + JSON; None when the agent closes silently."""
    body = request if isinstance(request, bytes) else json.dumps(request).encode()
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(struct.pack("<i", len(body)) + body)
        header = conn.recv(4)
        if not header:
            return None
        length = struct.unpack("<i", header)[0]
        data = b""
        while len(data) < length:
            data += conn.recv(length - len(data))
    return json.loads(data)


@pytest.mark.slow
def test_dyno_style_on_demand_request_traces_a_real_trainer_into_the_trace_dir(dynolog_served):
    agent, rpc_port, pid = dynolog_served
    assert call(rpc_port, {"fn": "getStatus"}) == {"status": 1}
    assert call(rpc_port, {"fn": "getVersion"})["version"].startswith("tuiprof-agentd")
    assert call(rpc_port, {"fn": "noSuchFn"}) is None
    assert call(rpc_port, b"not json") is None
    start = int(time.time() * 1000) + 4000
    config = "\n".join([f"PROFILE_START_TIME={start}", "ACTIVITIES_DURATION_MSECS=500",
                        "ACTIVITIES_WARMUP_PERIOD_SECS=1", "PROFILE_REPORT_INPUT_SHAPES=false"])
    outside = call(rpc_port, {"fn": "setKinetOnDemandRequest", "job_id": 0, "pids": [pid],
                              "config": "ACTIVITIES_LOG_FILE=/etc/tuiprof-should-not-exist.json\n" + config})
    assert outside is not None and "outside the trace folder of uid 0" in outside["refused"]
    reply = call(rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "job_id": 0,
                            "pids": [pid], "process_limit": 3})
    assert reply == {"activityProfilersBusy": 0, "activityProfilersTriggered": [pid],
                     "eventProfilersBusy": 0, "eventProfilersTriggered": [],
                     "processesMatched": [pid]}
    deadline = time.monotonic() + 60
    written: list[pathlib.Path] = []
    while not written and time.monotonic() < deadline:
        written = list(agent.trace_dir.glob(f"0/dyno-*-pid{pid}_{pid}.pt.trace.json"))
        time.sleep(0.2)
    assert written, f"no trace under {agent.trace_dir}: {list(agent.trace_dir.rglob('*'))}"
    trace = json.loads(written[0].read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    assert not pathlib.Path("/etc/tuiprof-should-not-exist.json").exists()
    none = call(rpc_port, {"fn": "setKinetOnDemandRequest", "config": "", "job_id": 0, "pids": [999999]})
    assert none["processesMatched"] == [] and none["activityProfilersTriggered"] == []


DYNO_DATA = pathlib.Path(__file__).parent / "data" / "dyno"


def captured(name: str) -> bytes:
    """The JSON body a real `dyno` command sent (see data/dyno/README.md), its length prefix checked."""
    raw = (DYNO_DATA / f"{name}.bin").read_bytes()
    assert struct.unpack("<i", raw[:4])[0] == len(raw) - 4
    return raw[4:]


def with_log_file(body: bytes, log_file: pathlib.Path, **fields: int) -> bytes:
    """A captured gputrace request with dyno's --log-file swapped for ``log_file`` (and fields replaced)."""
    request = json.loads(body)
    request["config"] = request["config"].replace("/tmp/trace.json", str(log_file))
    return json.dumps({**request, **fields}).encode()


@pytest.fixture
def rpc(tmp_path):
    """The RPC over a registry where this (root) process polls as job 0, as if in a container where it is pid 1234:
    the registry and the replies name it by its host pid."""
    registry = Registry()
    registry.poll(0, (os.getpid(),), os.getpid(), os.getuid(), True, pid_in_namespace=1234)
    with socket.socket() as unused:
        yield DynologRpc([unused], registry, lambda uid: tmp_path / str(uid), "v")


def pending_lines(rpc: DynologRpc) -> list[str]:
    pending = rpc.registry.entries()[0].pending
    assert pending is not None
    return pending.text.splitlines()


def test_captured_status_version_and_dcgm_calls_get_dynologs_answers(rpc):
    uid = os.getuid()
    assert rpc.answer(captured("status"), uid) == {"status": 1}
    assert rpc.answer(captured("version"), uid) == {"version": "v"}
    # As dynolog without DCGM: false, so `dyno dcgm-pause` prints it and exits 0 instead of panicking.
    assert rpc.answer(captured("dcgm-pause"), uid) == {"status": False}
    assert rpc.answer(captured("dcgm-resume"), uid) == {"status": False}
    assert rpc.answer(b'{"fn": "dcgmProfPause"}', uid) == {"status": "failed"}


def test_captured_gputrace_writing_outside_the_users_folder_is_refused_with_a_reason_dyno_prints(rpc, tmp_path):
    reply = rpc.answer(captured("gputrace-iterations"), os.getuid())
    assert reply is not None and reply["processesMatched"] == [] and reply["activityProfilersTriggered"] == []
    assert reply["refused"] == (f"log file /tmp/trace.json is outside the trace folder of uid {os.getuid()}; "
                                f"give --log-file {tmp_path / str(os.getuid())}/<name>.json "
                                f"(Kineto adds _<pid> before .json)")
    assert rpc.registry.entries()[0].pending is None
    for sneaky in ["/x/../tmp/a.json", f"{tmp_path}/{os.getuid()}/../9/a.json", "rel.json"]:
        refused = rpc.answer(with_log_file(captured("gputrace-iterations"), sneaky), os.getuid())
        assert refused is not None and "must be an absolute path without '..'" in refused["refused"], sneaky


def test_captured_gputrace_start_time_in_the_past_is_refused(rpc):
    rpc.registry.poll(42, (os.getppid(),), os.getppid(), os.getuid(), True)
    reply = rpc.answer(captured("gputrace-duration"), os.getuid())  # --profile-start-time 1790000000000
    assert reply is not None and "profile start time 1790000000000 is" in reply["refused"]
    assert "s in the past; give 0" in reply["refused"]


def test_captured_gputrace_iterations_honoured_in_the_users_folder_with_a_trace_id(rpc, tmp_path):
    log_file = tmp_path / str(os.getuid()) / "trace.json"
    reply = rpc.answer(with_log_file(captured("gputrace-iterations"), log_file), os.getuid())
    assert reply == {"activityProfilersBusy": 0, "activityProfilersTriggered": [os.getpid()], "eventProfilersBusy": 0,
                     "eventProfilersTriggered": [], "processesMatched": [os.getpid()]}
    lines = pending_lines(rpc)
    assert lines[:-1] == [f"ACTIVITIES_LOG_FILE={log_file}", "PROFILE_START_ITERATION=0",
                          "PROFILE_START_ITERATION_ROUNDUP=10", "ACTIVITIES_ITERATIONS=3",
                          "PROFILE_REPORT_INPUT_SHAPES=false", "PROFILE_WITH_STACK=false",
                          "PROFILE_WITH_FLOPS=false", "PROFILE_WITH_MODULES=false",
                          "ACTIVITY_TYPES=cpu_op,user_annotation,cpu_instant_event"]
    assert lines[-1].startswith("REQUEST_TRACE_ID=") and lines[-1].removeprefix("REQUEST_TRACE_ID=").isdigit()


def test_captured_gputrace_options_all_reach_the_trainer(rpc, tmp_path):
    log_file = tmp_path / str(os.getuid()) / "sub" / "t.pt.trace.json"
    reply = rpc.answer(with_log_file(captured("gputrace-options"), log_file), os.getuid())
    assert reply is not None and reply["activityProfilersTriggered"] == [os.getpid()]
    lines = pending_lines(rpc)
    assert lines[:-1] == [f"ACTIVITIES_LOG_FILE={log_file}", "PROFILE_START_TIME=0", "ACTIVITIES_DURATION_MSECS=500",
                          "PROFILE_REPORT_INPUT_SHAPES=true", "PROFILE_PROFILE_MEMORY=true", "PROFILE_MEMORY=true",
                          "PROFILE_MEMORY_DURATION_MSECS=500", "PROFILE_WITH_STACK=true", "PROFILE_WITH_FLOPS=true",
                          "PROFILE_WITH_MODULES=true",
                          # stacks and modules come from libkineto's Python tracer: python_function must be on
                          "ACTIVITY_TYPES=cpu_op,user_annotation,cpu_instant_event,python_function"]


def test_process_limit_counts_triggered_processes_and_the_rest_stay_matched(rpc, tmp_path):
    rpc.registry.poll(0, (os.getppid(),), os.getppid(), os.getuid(), True)
    body = with_log_file(captured("gputrace-iterations"), tmp_path / str(os.getuid()) / "t.json", process_limit=1)
    reply = rpc.answer(body, os.getuid())
    assert reply is not None and sorted(reply["processesMatched"]) == sorted([os.getpid(), os.getppid()])
    assert len(reply["activityProfilersTriggered"]) == 1


@pytest.mark.parametrize("line, named", [
    ("EVENTS_LOG_FILE=/etc/x", "agentd does not pass EVENTS_LOG_FILE on to trainers; accepted keys: "
                               "ACTIVITIES_LOG_FILE, ACTIVITIES_DURATION_MSECS"),
    ("ACTIVITIES_DURATION_MSECS=9 ACTIVITIES_LOG_FILE=/x", "must be ACTIVITIES_DURATION_MSECS=<letters"),
    ("REQUEST_TRACE_ID=a=b", "must be REQUEST_TRACE_ID=<letters"),
    ("PROFILE_START_TIME=1\x00", "must be PROFILE_START_TIME=<letters"),
    ("ACTIVITY_TYPES=" + "c" * 300, "must be ACTIVITY_TYPES=<letters"),
])
def test_a_config_line_agentd_will_not_pass_on_refuses_the_request_never_dropped(rpc, line, named):
    request = {"fn": "setKinetOnDemandRequest", "config": "ACTIVITIES_DURATION_MSECS=9\n" + line, "pids": [0]}
    reply = rpc.answer(json.dumps(request).encode(), os.getuid())
    assert reply is not None and reply["processesMatched"] == [] and named in reply["refused"]
    assert rpc.registry.entries()[0].pending is None


def test_without_a_log_file_agentd_names_one_in_the_users_folder():
    checked = client_config("ACTIVITIES_DURATION_MSECS=9  # a comment\n\n# only a comment", now_ms=0)
    assert checked.log_file is None and checked.lines == ["ACTIVITIES_DURATION_MSECS=9"]
    assert checked.text("/traces/0/p.json", cuda=True, trace_id="7").splitlines() == [
        "ACTIVITIES_LOG_FILE=/traces/0/p.json", "ACTIVITIES_DURATION_MSECS=9",
        "ACTIVITY_TYPES=cpu_op,user_annotation,cpu_instant_event,gpu_user_annotation,gpu_memcpy,gpu_memset,"
        "kernel,cuda_runtime,cuda_driver", "REQUEST_TRACE_ID=7"]


def test_rpc_listens_on_both_loopbacks_and_identifies_the_caller_on_each(tmp_path):
    rpc = DynologRpc.bind(0, Registry(), lambda uid: tmp_path / str(uid), "v")
    assert sorted(sock.getsockname()[0] for sock in rpc.socks) == ["127.0.0.1", "::1"]

    async def status(host: str) -> bytes:
        reader, writer = await asyncio.open_connection(host, rpc.port)
        body = captured("status")
        writer.write(struct.pack("<i", len(body)) + body)
        answer = await reader.read()
        writer.close()
        return answer

    async def both() -> list[bytes]:
        await rpc.serve()
        try:
            return [await status("127.0.0.1"), await status("::1")]
        finally:
            rpc.close()

    # The peer uid is found for each family (no reply at all when the caller cannot be identified).
    assert asyncio.run(both()) == [struct.pack("<i", 12) + b'{"status":1}'] * 2


def test_local_user_triggers_only_their_own_processes(tmp_path):
    registry = Registry()
    registry.poll(0, (os.getpid(),), os.getpid(), os.getuid(), True)  # this (root) process polls
    folders = []

    def folder(uid: int) -> pathlib.Path:
        folders.append(uid)
        return tmp_path / str(uid)

    with socket.socket() as unused:
        rpc = DynologRpc([unused], registry, folder, "v")
        request = json.dumps({"fn": "setKinetOnDemandRequest", "config": "ACTIVITIES_DURATION_MSECS=5",
                              "pids": [os.getpid()], "job_id": 0}).encode()
        assert rpc.answer(request, None) is None  # the caller's socket has no known owner: refused
        other = rpc.answer(request, os.getuid() + 4242)
        assert other is not None and other["processesMatched"] == [] and other["activityProfilersTriggered"] == []
        assert folders == [] and registry.entries()[0].pending is None
        own = rpc.answer(request, os.getuid())
    assert own is not None and own["activityProfilersTriggered"] == [os.getpid()]
    assert folders == [os.getuid()]
    pending = registry.entries()[0].pending
    assert pending is not None and f"ACTIVITIES_LOG_FILE={tmp_path / str(os.getuid())}/dyno-" in pending.text
