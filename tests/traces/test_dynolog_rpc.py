"""dynolog's TCP RPC on agentd (off by default): the `dyno` CLI's framing, a real PyTorch trainer
traced through it, and the deliberate deviations (trace path chosen by agentd, token)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import struct
import tempfile
import time

import pytest

from agentd.kineto.registry import Registry
from agentd.kineto.rpc import BadRequest, DynologRpc, client_config_lines, sanitized_config
from testkit.agents import running_agent
from testkit.ports import free_port
from testkit.traces import trainers, wait_registered


def call(port: int, request: dict | bytes) -> dict | None:
    """One request as `dyno` sends it: int32 length (little endian) + JSON; None when the agent closes silently."""
    body = request if isinstance(request, bytes) else json.dumps(request).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
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
def test_dyno_style_on_demand_request_traces_a_real_trainer_into_the_trace_dir(tmp_path):
    socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tpk", dir="/tmp"))
    rpc_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TUIPROF_TOKEN"}
    env["KINETO_IPC_SOCKET_DIR"] = str(socket_dir)
    try:
        with running_agent(tmp_path, env=env, extra_args=["--dynolog-rpc-port", str(rpc_port)]) as agent, \
                trainers(socket_dir, [None]) as [trainer]:
            wait_registered(agent, trainer.pid)
            assert call(rpc_port, {"fn": "getStatus"}) == {"status": 1}
            assert call(rpc_port, {"fn": "getVersion"})["version"].startswith("tuiprof-agentd")
            assert call(rpc_port, {"fn": "noSuchFn"}) is None
            assert call(rpc_port, b"not json") is None
            start = int(time.time() * 1000) + 4000
            config = "\n".join(["ACTIVITIES_LOG_FILE=/etc/tuiprof-should-not-exist.json",
                                f"PROFILE_START_TIME={start}", "ACTIVITIES_DURATION_MSECS=500",
                                "ACTIVITIES_WARMUP_PERIOD_SECS=1", "PROFILE_REPORT_INPUT_SHAPES=false"])
            reply = call(rpc_port, {"fn": "setKinetOnDemandRequest", "config": config, "job_id": 0,
                                    "pids": [trainer.pid], "process_limit": 3})
            assert reply == {"activityProfilersBusy": 0, "activityProfilersTriggered": [trainer.pid],
                             "eventProfilersBusy": 0, "eventProfilersTriggered": [],
                             "processesMatched": [trainer.pid]}
            deadline = time.monotonic() + 60
            written: list[pathlib.Path] = []
            while not written and time.monotonic() < deadline:
                written = list(agent.trace_dir.glob(f"0/dyno-*-pid{trainer.pid}_{trainer.pid}.pt.trace.json"))
                time.sleep(0.2)
            assert written, f"no trace under {agent.trace_dir}: {list(agent.trace_dir.rglob('*'))}"
            trace = json.loads(written[0].read_text())
            assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
            assert not pathlib.Path("/etc/tuiprof-should-not-exist.json").exists()
            none = call(rpc_port, {"fn": "setKinetOnDemandRequest", "config": "", "job_id": 0, "pids": [999999]})
            assert none["processesMatched"] == [] and none["activityProfilersTriggered"] == []
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


def test_token_required_when_configured_whoever_calls(tmp_path):
    with socket.socket() as unused:
        rpc = DynologRpc(unused, Registry(), lambda uid: tmp_path / str(uid), "s3cret", "v")
        assert rpc.answer(b'{"fn": "getStatus"}', 0) is None  # root's socket too: the token is the rule
        assert rpc.answer(b'{"fn": "getStatus", "token": "wrong"}', 0) is None
        assert rpc.answer('{"fn": "getStatus", "token": "sécret"}'.encode(), 0) is None  # not ASCII: refused
        assert rpc.answer(b'{"fn": "getStatus", "token": "s3cret"}', None) == {"status": 1}
        assert rpc.answer(b'{"fn": "setKinetOnDemandRequest", "token": "s3cret"}', None) == {"status": "failed"}


def test_client_config_keeps_known_keys_with_plain_values_and_the_agent_names_the_file():
    lines = client_config_lines("ACTIVITIES_LOG_FILE=/etc/x.json\nPROFILE_MEMORY=true\nACTIVITIES_DURATION_MSECS=9\n"
                                "EVENTS_LOG_FILE=/etc/y\nNOT_A_KINETO_KEY=1")
    assert lines == ["ACTIVITIES_DURATION_MSECS=9"]
    text = sanitized_config(lines, "/traces/0/p.json", cuda=False)
    assert text.splitlines() == ["ACTIVITIES_LOG_FILE=/traces/0/p.json", "ACTIVITIES_DURATION_MSECS=9",
                                 "ACTIVITY_TYPES=cpu_op,user_annotation,cpu_instant_event"]
    for bad in ["ACTIVITIES_DURATION_MSECS=9 ACTIVITIES_LOG_FILE=/x", "REQUEST_TRACE_ID=a=b",
                "PROFILE_START_TIME=1\x00", "ACTIVITY_TYPES=" + "c" * 300]:
        with pytest.raises(BadRequest, match="must be"):
            client_config_lines(bad)


def test_local_user_triggers_only_their_own_processes(tmp_path):
    registry = Registry()
    registry.poll(0, (os.getpid(),), os.getpid(), os.getuid(), True)  # this (root) process polls
    folders = []

    def folder(uid: int) -> pathlib.Path:
        folders.append(uid)
        return tmp_path / str(uid)

    with socket.socket() as unused:
        rpc = DynologRpc(unused, registry, folder, None, "v")
        request = json.dumps({"fn": "setKinetOnDemandRequest", "config": "ACTIVITIES_DURATION_MSECS=5",
                              "pids": [os.getpid()], "job_id": 0}).encode()
        assert rpc.answer(request, None) is None  # no token configured and no known peer: refused
        other = rpc.answer(request, os.getuid() + 4242)
        assert other is not None and other["processesMatched"] == [] and other["activityProfilersTriggered"] == []
        assert folders == [] and registry.entries()[0].pending is None
        own = rpc.answer(request, os.getuid())
    assert own is not None and own["activityProfilersTriggered"] == [os.getpid()]
    assert folders == [os.getuid()]
    pending = registry.entries()[0].pending
    assert pending is not None and f"ACTIVITIES_LOG_FILE={tmp_path / str(os.getuid())}/dyno-" in pending.text
