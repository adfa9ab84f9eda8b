"""GetStacks over real gRPC on loopback, real py-spy on real processes, and `tuiprof stacks` against it
(the agent is the ``agent_with_ranks`` fixture in conftest.py)."""

import asyncio
import json
import os
import signal
import sys
import time
import xml.etree.ElementTree as ET

import grpc
import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.stacks.merge import equivalence_classes, find_suspects
from agentd.stacks.wire import tree_from_proto
from tuiprof.client.channel import open_channel


async def test_get_stacks_merges_the_hosts_ranks(agent_with_ranks):
    address, procs, _ = agent_with_ranks
    async with open_channel(address) as channel:
        stub = pb_grpc.AgentStub(channel)
        reply = await stub.GetStacks(pb.GetStacksRequest(take_now=True), timeout=60)
        assert reply.hostname == "node-a"
        assert sorted((r.rank, r.pid) for r in reply.ranks) == sorted((r, p.pid) for r, p in procs.items())
        assert all(r.error == "" and r.threads for r in reply.ranks), reply.ranks
        (suspect,) = find_suspects(equivalence_classes(tree_from_proto(reply.merged)))
        assert suspect.ranks == 1 << 3 and "stuck_in_loader" in suspect.reason

        only = await stub.GetStacks(pb.GetStacksRequest(take_now=True, pids=[procs[1].pid]), timeout=60)
        assert [r.rank for r in only.ranks] == [1]


async def test_get_stacks_refuses_processes_that_are_not_ranks(agent_with_ranks):
    address, _, _ = agent_with_ranks
    async with open_channel(address) as channel:
        stub = pb_grpc.AgentStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetStacks(pb.GetStacksRequest(take_now=True, pids=[os.getpid()]), timeout=30)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"pid {os.getpid()} is not a live rank on this host" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetStacks(pb.GetStacksRequest(take_now=False), timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_stopped_rank_becomes_a_hang_incident_with_stacks(agent_with_ranks):
    address, procs, tmp_path = agent_with_ranks
    os.kill(procs[2].pid, signal.SIGSTOP)
    try:
        async with open_channel(address) as channel:
            stub = pb_grpc.AgentStub(channel)
            deadline = time.monotonic() + 30
            while True:
                try:
                    incident = await stub.GetStacks(pb.GetStacksRequest(take_now=False), timeout=30)
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.NOT_FOUND
                    assert time.monotonic() < deadline, "no hang incident within 30 s"
                    await asyncio.sleep(0.2)
            call = stub.Watch(pb.WatchRequest(), timeout=10)
            snapshot = await call.read()
            call.cancel()
    finally:
        os.kill(procs[2].pid, signal.SIGCONT)
    assert snapshot.hang.level == "hung"
    assert "rank 2: stopped (SIGSTOP or a debugger)" in snapshot.hang.explanation
    assert "rank 2: stopped" in incident.incident
    assert {r.rank for r in incident.ranks} == {0, 1, 2, 3}
    stopped = next(r for r in incident.ranks if r.rank == 2)
    assert not stopped.threads and "py-spy cannot read a stopped process" in stopped.error
    assert all(r.threads for r in incident.ranks if r.rank != 2), [r.error for r in incident.ranks]
    saved = list((tmp_path / "hangs").glob("hang-*.json"))
    assert len(saved) == 1 and "stuck_in_loader" in saved[0].read_text()


async def _tuiprof(*args):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tuiprof.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode(), err.decode()


async def test_tuiprof_stacks_json_names_the_suspect(agent_with_ranks, tmp_path):
    address, _, _ = agent_with_ranks
    svg = tmp_path / "flame.svg"
    code, out, err = await _tuiprof("stacks", "--json", "--svg", str(svg), address.target)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ranks"] == 4 and doc["thread"] == "MainThread"
    assert [(c["ranks"], c["count"]) for c in doc["classes"]] == [("3", 1), ("0-2", 3)]
    assert doc["classes"][0]["where"].startswith("stuck_in_loader")
    assert [s["ranks"] for s in doc["suspects"]] == ["3"]
    assert "stuck_in_loader" in doc["suspects"][0]["reason"]
    assert doc["hosts"][0]["ranks"] == "0-3" and doc["hosts"][0]["error"] is None
    assert {t["thread"] for t in doc["tree"]} == {"MainThread", "helper"}
    ET.parse(svg)


async def test_tuiprof_stacks_text_and_unreachable_host(agent_with_ranks):
    address, _, _ = agent_with_ranks
    code, out, _ = await _tuiprof("stacks", address.target)
    assert code == 0
    assert "stuck_in_loader" in out and "not: [0-2]" in out and "Suspects:" in out
    code, out, _ = await _tuiprof("stacks", "--folded", address.target)
    assert any(line.startswith("MainThread;") and line.endswith(" 3") for line in out.splitlines())
    code, out, _ = await _tuiprof("stacks", "--json", "--timeout", "5", address.target, "127.0.0.1:1")
    assert code == 1
    doc = json.loads(out)
    assert doc["hosts"][1]["error"].startswith("cannot connect")
    assert [s["ranks"] for s in doc["suspects"]] == ["3"]


async def test_tuiprof_stacks_refuses_to_mix_jobs_and_takes_the_chosen_one(agent_with_two_jobs):
    address = agent_with_two_jobs
    code, out, err = await _tuiprof("stacks", "--json", address.target)
    assert code == 2 and out == ""
    assert "these hosts run several jobs: a (4 ranks), b (2 ranks); choose one with --job ID" in err
    code, out, err = await _tuiprof("stacks", "--json", "--job", "b", address.target)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ranks"] == 2 and doc["suspects"] == []
    assert [c["where"].split()[0] for c in doc["classes"]] == ["other_job_wait"]
    code, out, err = await _tuiprof("stacks", "--json", "--job", "a", address.target)
    assert [s["ranks"] for s in json.loads(out)["suspects"]] == ["3"]


async def test_the_same_rank_on_two_hosts_is_warned_about(agent_with_ranks):
    address, _, _ = agent_with_ranks
    same_agent_twice = f"localhost:{address.port}"  # the same agent under another name: its ranks twice
    code, out, err = await _tuiprof("stacks", "--json", address.target, same_agent_twice)
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    assert len(warnings) == 4
    assert warnings[0].startswith("rank 0 is reported by 2 processes (127.0.0.1")
