"""An --iterations capture starts every rank at the same step (real PyTorch CPU ranks under `tuiprof run`)."""

from __future__ import annotations

import asyncio
import gzip
import json
import pathlib

import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.traces.iterations import SLACK_SECONDS, common_start_iteration
from agentd.traces.kineto_config import WARMUP_ITERATIONS
from testkit.agents import RunningAgent
from testkit.traces import run_cli, trainers, wait_registered
from tuiprof.client.channel import open_channel

STEP_TIMES_TIMEOUT_SECONDS = 60.0


def stats(pid: int, steps: int, step_time: float | None) -> pb.RankStats:
    rank = pb.RankStats(pid=pid, step_count=steps)
    if step_time is not None:
        rank.step_time_seconds = step_time
    return rank


def test_start_is_past_every_ranks_projected_step():
    # 1 s lead + 2 s slack: 30 steps of 0.1 s, 15 of 0.2 s; the furthest projection wins, then the warmup.
    start, why = common_start_iteration([stats(1, 100, 0.1), stats(2, 110, 0.2)], lead_seconds=1.0)
    assert (start, why) == (max(100 + 30, 110 + 15) + WARMUP_ITERATIONS, "")
    assert SLACK_SECONDS == 2.0


def test_no_common_start_without_every_ranks_step_time():
    assert common_start_iteration([stats(1, 100, 0.1), None], 1.0)[0] == 0
    start, why = common_start_iteration([stats(1, 100, 0.1), stats(2, 3, None)], 1.0)
    assert start == 0 and "pid 2 has no step time" in why


async def wait_step_times(agent: RunningAgent, pids: set[int]) -> None:
    """Until the agent's snapshot has a step time for every one of ``pids`` (their segments are read)."""
    async with open_channel(agent.address, None, None) as channel:
        async for snapshot in pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=STEP_TIMES_TIMEOUT_SECONDS):
            if pids <= {r.pid for r in snapshot.ranks if r.HasField("step_time_seconds")}:
                return


@pytest.mark.slow
def test_ranks_trace_the_same_steps(agent, socket_dir, tmp_path):
    with trainers(socket_dir, [0, 1], under_tuiprof_run=True) as processes:
        pids = [p.pid for p in processes]
        for pid in pids:
            wait_registered(agent, pid)
        asyncio.run(wait_step_times(agent, set(pids)))
        result = run_cli("trace", agent.address.target, "--iterations", "3", "--pids", ",".join(map(str, pids)),
                         "--output", str(tmp_path), "--timeout", "60", "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    doc = json.loads(result.stdout)
    assert doc["hosts"][0]["message"].startswith("every process starts at iteration ")
    merged = json.loads(gzip.decompress(pathlib.Path(doc["merged"]["path"]).read_bytes()))
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    steps: dict[str, list[float]] = {"rank 0": [], "rank 1": []}
    for event in merged["traceEvents"]:
        if event.get("name", "").startswith("Optimizer.step#"):
            steps[names[event["pid"]].split(" ·")[0]].append(event["ts"])
    assert len(steps["rank 0"]) == len(steps["rank 1"]) == 3, steps
    # The same three steps: the ranks step together (an all-reduce each), a step takes over 20 ms.
    for ts0, ts1 in zip(sorted(steps["rank 0"]), sorted(steps["rank 1"])):
        assert abs(ts0 - ts1) < 15_000, steps
    assert doc["merged"]["linked_collectives"] > 0
