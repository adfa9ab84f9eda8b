"""GetStacks over real gRPC on loopback, real py-spy on real processes, and `tuiprof stacks` against it
(the agent is the ``agent_with_ranks`` fixture in conftest.py)."""

import asyncio
import json
import os
import signal
import stat
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from agentd.hang.service import IncidentBudget, write_private
from agentd.hang.stacks import MAX_DUTY, MAX_GAP_SECONDS, MIN_GAP_SECONDS, DumpTarget, RankDumper
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.stacks.merge import equivalence_classes, find_suspects
from agentd.stacks.wire import tree_from_proto
from hangs.conftest import tuiprof_cli
from tuiprof.analysis.stacks_report import job_report
from tuiprof.client.channel import open_channel
from tuiprof.commands.stacks import _host_lines, document
from tuiprof.model.stacks import HostStacks


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


async def _first_incident(stub) -> pb.StacksReply:
    """The hang incident the agent kept, once it has one (NOT_FOUND until then; 30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await stub.GetStacks(pb.GetStacksRequest(take_now=False), timeout=30)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            assert time.monotonic() < deadline, "no hang incident within 30 s"
            await asyncio.sleep(0.2)


async def test_a_stopped_rank_becomes_a_hang_incident_with_stacks(agent_with_ranks):
    address, procs, tmp_path = agent_with_ranks
    os.kill(procs[2].pid, signal.SIGSTOP)
    try:
        async with open_channel(address) as channel:
            stub = pb_grpc.AgentStub(channel)
            incident = await _first_incident(stub)
            call = stub.Watch(pb.WatchRequest(), timeout=10)
            snapshot = await call.read()
            call.cancel()
    finally:
        os.kill(procs[2].pid, signal.SIGCONT)
    assert snapshot.hang.level == pb.HANG_LEVEL_HUNG
    assert "rank 2: stopped (SIGSTOP or a debugger)" in snapshot.hang.explanation
    assert "rank 2: stopped" in incident.incident
    assert {r.rank for r in incident.ranks} == {0, 1, 2, 3}
    stopped = next(r for r in incident.ranks if r.rank == 2)
    assert not stopped.threads and "py-spy cannot read a stopped process" in stopped.error
    assert all(r.threads for r in incident.ranks if r.rank != 2), [r.error for r in incident.ranks]
    saved = list((tmp_path / "hangs").glob("hang-*.json"))
    assert len(saved) == 1 and "stuck_in_loader" in saved[0].read_text()


async def test_tuiprof_stacks_json_names_the_suspect(agent_with_ranks, tmp_path):
    address, _, _ = agent_with_ranks
    svg = tmp_path / "flame.svg"
    code, out, err = await tuiprof_cli("stacks", "--json", "--svg", str(svg), address.target)
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
    code, out, _ = await tuiprof_cli("stacks", address.target)
    assert code == 0
    assert "stuck_in_loader" in out and "not: [0-2]" in out and "Suspects:" in out
    code, out, _ = await tuiprof_cli("stacks", "--folded", address.target)
    assert any(line.startswith("MainThread;") and line.endswith(" 3") for line in out.splitlines())
    code, out, _ = await tuiprof_cli("stacks", "--json", "--timeout", "5", address.target, "127.0.0.1:1")
    assert code == 1
    doc = json.loads(out)
    assert doc["hosts"][1]["error"].startswith("cannot connect")
    assert [s["ranks"] for s in doc["suspects"]] == ["3"]


async def test_tuiprof_stacks_refuses_to_mix_jobs_and_takes_the_chosen_one(agent_with_two_jobs):
    address = agent_with_two_jobs
    code, out, err = await tuiprof_cli("stacks", "--json", address.target)
    assert code == 2 and out == ""
    assert "these hosts run several jobs: a (4 ranks), b (2 ranks); choose one with --job ID" in err
    code, out, err = await tuiprof_cli("stacks", "--json", "--job", "b", address.target)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ranks"] == 2 and doc["suspects"] == []
    assert [c["where"].split()[0] for c in doc["classes"]] == ["other_job_wait"]
    code, out, err = await tuiprof_cli("stacks", "--json", "--job", "a", address.target)
    assert [s["ranks"] for s in json.loads(out)["suspects"]] == ["3"]


async def test_the_same_rank_on_two_hosts_is_warned_about(agent_with_ranks):
    address, _, _ = agent_with_ranks
    same_agent_twice = f"localhost:{address.port}"  # the same agent under another name: its ranks twice
    code, out, err = await tuiprof_cli("stacks", "--json", address.target, same_agent_twice)
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    assert len(warnings) == 4
    assert warnings[0].startswith("rank 0 is reported by 2 processes (127.0.0.1")


# ---------------------------------------------------------------- bounded cost and pinned targets


def test_concurrent_requests_for_a_rank_share_one_dump_and_the_rank_is_then_left_alone(parked, pyspy_binary):
    proc = parked("all_reduce_wait")
    dumper = RankDumper(pyspy_binary)
    target = DumpTarget.pin(proc.pid, 0, None)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: dumper.stacks(target, native=False), range(4)))
    assert dumper.dumps_run == 1
    assert all(r.threads and r == results[0] for r in results), [r.error for r in results]
    assert not any(r.cached for r in results)
    again = dumper.stacks(target, native=True)  # within the quiet gap: the last dump, said so
    assert dumper.dumps_run == 1 and again.threads and "native frames not taken" in again.error
    assert again.cached and again.age_seconds > 0 and again.next_dump_in_seconds > 0
    deadline = time.monotonic() + 10
    while dumper.dumps_run == 1:
        assert time.monotonic() < deadline, "no second dump after the quiet gap"
        dumper.stacks(target, native=False)
        time.sleep(0.2)


def test_a_pid_that_names_another_process_now_is_not_dumped(parked, pyspy_binary):
    proc = parked("all_reduce_wait")
    now = DumpTarget.pin(proc.pid, 0, None)
    assert now.uid == os.getuid()
    registered_earlier = DumpTarget(proc.pid, 0, now.uid, now.start_ns - 60 * 1_000_000_000)
    dumper = RankDumper(pyspy_binary)
    stacks = dumper.stacks(registered_earlier, native=False)
    assert not stacks.threads and "newer process" in stacks.error and dumper.dumps_run == 0
    other_owner = DumpTarget(proc.pid, 0, now.uid + 1, now.start_ns)
    assert "changed owner" in dumper.stacks(other_owner, native=False).error
    proc.kill()
    proc.wait()
    assert "gone" in dumper.stacks(now, native=False).error and dumper.dumps_run == 0


def test_incidents_are_capped_per_owner_and_window():
    clock = [0.0]
    budget = IncidentBudget(limit=2, window_s=100, clock=lambda: clock[0])
    assert budget.spend({1000}) == {1000} and budget.spend({1000}) == {1000}
    assert budget.spend({1000}) == set()
    assert budget.spend({1001}) == {1001}           # another owner has its own budget
    assert budget.spend({1000, 1001}) == {1001}     # one owner out of budget vetoes no one else
    assert budget.spend({1001}) == set()            # 1001's second incident was spent just above
    clock[0] = 101
    assert budget.spend({1000, 1001}) == {1000, 1001}


def test_incident_files_are_private_and_never_written_through_links(tmp_path):
    path = write_private(tmp_path / "hangs", "hang-1.json", "{}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "hangs").stat().st_mode) == 0o700
    with pytest.raises(FileExistsError):
        write_private(tmp_path / "hangs", "hang-1.json", "{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").symlink_to(elsewhere)
    with pytest.raises(OSError):
        write_private(tmp_path / "linked", "hang-2.json", "{}")
    (tmp_path / "hangs" / "hang-3.json").symlink_to(elsewhere / "target")
    with pytest.raises(FileExistsError):
        write_private(tmp_path / "hangs", "hang-3.json", "{}")
    assert not list(elsewhere.iterdir())


async def test_an_incident_dumps_only_the_hung_job(agent_with_two_jobs, tmp_path):
    address = agent_with_two_jobs
    async with open_channel(address) as channel:
        stub = pb_grpc.AgentStub(channel)
        snapshot = await stub.Watch(pb.WatchRequest(), timeout=10).read()
        job_b = sorted(r.pid for r in snapshot.ranks if r.job_id == "b")
        os.kill(job_b[0], signal.SIGSTOP)
        try:
            incident = await _first_incident(stub)
        finally:
            os.kill(job_b[0], signal.SIGCONT)
    assert sorted(r.pid for r in incident.ranks) == job_b


async def test_stacks_right_after_a_native_dump_come_at_once_from_that_dump_with_its_age(agent_with_ranks):
    """Issue 29 item 6: a request in a rank's quiet gap (50× its last dump's time, up to 60 s) used to wait
    the gap out; it is answered at once with the last dump, marked cached, its age and when a new one comes."""
    address, procs, _ = agent_with_ranks
    pids = [procs[0].pid]
    started = time.monotonic()
    async with open_channel(address) as channel:
        stub = pb_grpc.AgentStub(channel)
        native = await stub.GetStacks(pb.GetStacksRequest(take_now=True, native=True, pids=pids), timeout=60)
        asked = time.monotonic()
        again = await stub.GetStacks(pb.GetStacksRequest(take_now=True, pids=pids), timeout=60)
    answered = time.monotonic()
    (fresh,), (cached,) = native.ranks, again.ranks
    assert fresh.threads and not fresh.cached and fresh.age_seconds == 0 and fresh.next_dump_in_seconds == 0
    assert answered - asked < MIN_GAP_SECONDS  # not the gap waited out: at least 1 s, here ~50 × a native dump
    assert cached.cached and list(cached.threads) == list(fresh.threads) and cached.error == ""
    assert 0 < cached.age_seconds < answered - started
    gap = min(MAX_GAP_SECONDS, max(MIN_GAP_SECONDS, fresh.dump_seconds / MAX_DUTY))
    assert cached.age_seconds + cached.next_dump_in_seconds == pytest.approx(gap, abs=0.1)

    host = HostStacks(address.target, reply=again)
    (process,) = document([host], job_report([host], lines=False, native=False))["hosts"][0]["processes"]
    assert process["cached"] is True and process["age_seconds"] == round(cached.age_seconds, 3)
    assert process["next_dump_in_seconds"] == round(cached.next_dump_in_seconds, 3)
    (note,) = [line for line in _host_lines([host]) if "last dump" in line]
    assert note.startswith("  ranks [0]: stacks of their last dump, up to ")
