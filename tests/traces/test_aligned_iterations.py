"""An --iterations capture starts every rank at the same step (real PyTorch CPU ranks under `tuiprof run`)."""

from __future__ import annotations

import asyncio
import gzip
import json
import pathlib

import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.traces.iterations import RATE_WINDOW_SECONDS, StepRates, common_start_iteration
from agentd.kineto.config import WARMUP_ITERATIONS
from testkit.agents import RunningAgent
from testkit.traces import run_cli, trainers, wait_registered
from tuiprof.client.channel import open_channel

SNAPSHOTS_TIMEOUT_SECONDS = 60.0
STEPS_BEFORE_CAPTURE = 80  # about 2 s of steps: enough snapshots for a step rate


def rates_after(samples: list[tuple[float, dict[int, int]]]) -> StepRates:
    rates = StepRates()
    for now, counts in samples:
        rates.observe([pb.RankStats(pid=pid, step_count=count) for pid, count in counts.items()], now)
    return rates


def test_projection_uses_the_step_rate_between_snapshots():
    # Rank 1 makes 100 steps/s, rank 2 50 steps/s (whatever its step-to-step times looked like).
    rates = rates_after([(t, {1: 100 * t, 2: 50 * t + 400}) for t in range(0, 6)])
    assert rates.projected_step(1, at=15.0) == (500 + 1000 + 1, "")
    assert rates.projected_step(2, at=15.0) == (650 + 500 + 1, "")
    start, why = common_start_iteration([rates.projected_step(1, 15.0), rates.projected_step(2, 15.0)])
    assert (start, why) == (1501 + WARMUP_ITERATIONS, "")


def test_rates_forget_old_samples_and_gone_ranks():
    rates = rates_after([(0.0, {1: 0}), (RATE_WINDOW_SECONDS, {1: 1000}), (RATE_WINDOW_SECONDS + 5, {1: 1100, 2: 7})])
    assert rates.projected_step(1, RATE_WINDOW_SECONDS + 6) == (1100 + 20 + 1, "")  # 100 steps in 5 s, not 1100 in 15
    rates.observe([pb.RankStats(pid=2, step_count=8)], RATE_WINDOW_SECONDS + 6)
    assert rates.projected_step(1, 20.0)[0] is None


def test_no_common_start_without_every_ranks_rate():
    rates = rates_after([(0.0, {1: 0, 2: 5}), (2.0, {1: 100, 2: 5})])
    stalled = rates.projected_step(2, 3.0)
    assert stalled[0] is None and "step rate" in stalled[1]
    unknown = rates.projected_step(3, 3.0)
    assert unknown[0] is None and "not started under `tuiprof run`" in unknown[1]
    assert common_start_iteration([rates.projected_step(1, 3.0), stalled]) == (0, stalled[1])
    young = rates_after([(0.0, {1: 0}), (0.5, {1: 50})]).projected_step(1, 3.0)
    assert young[0] is None


async def wait_steps(agent: RunningAgent, pids: set[int]) -> None:
    """Until the agent's snapshots show every one of ``pids`` past STEPS_BEFORE_CAPTURE steps."""
    async with open_channel(agent.address, None, None) as channel:
        async for snapshot in pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=SNAPSHOTS_TIMEOUT_SECONDS):
            if pids <= {r.pid for r in snapshot.ranks if r.step_count >= STEPS_BEFORE_CAPTURE}:
                return


@pytest.mark.slow
def test_ranks_trace_the_same_steps(agent, socket_dir, tmp_path):
    with trainers(socket_dir, [0, 1], under_tuiprof_run=True) as processes:
        pids = [p.pid for p in processes]
        for pid in pids:
            wait_registered(agent, pid)
        asyncio.run(wait_steps(agent, set(pids)))
        result = run_cli("trace", agent.address.target, "--iterations", "3", "--pids", ",".join(map(str, pids)),
                         "--output", str(tmp_path), "--timeout", "60", "--merge", "--json")
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
    for ts0, ts1 in zip(sorted(steps["rank 0"]), sorted(steps["rank 1"]), strict=True):
        assert abs(ts0 - ts1) < 15_000, steps
    assert doc["merged"]["linked_collectives"] > 0
