"""End to end, real processes, no GPU: the slowdown verdict on a 2-rank DDP (gloo) job under
`tuiprof run`, watched by a real agentd.

One rank is slowed on purpose, from inside (a slow DataLoader, a GC storm) or from outside
(busy processes pinned to its CPU, SIGSTOP/SIGCONT on a duty cycle); the agent must name
that rank and the cause, and its cost must agree with the job's own step timer. A healthy
job must get no verdict. The same judge runs in the console (``tuiprof status --json``).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid

import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.proto.words import slowdown_cause
from testkit.agents import running_agent
from testkit.jobs import stop_job
from testkit.ports import free_port
from tuiprof.client.channel import open_channel

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch", reason="the slowdown tests need the PyTorch CPU build")

JOB = pathlib.Path(__file__).with_name("slow_job.py")
SLOW_RANK = 1
VERDICT_WITHIN_S = 10.0
if (os.cpu_count() or 1) < 2:
    pytest.skip("the slowdown jobs pin their 2 ranks to 2 CPUs", allow_module_level=True)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with running_agent(tmp_path_factory.mktemp("slowdown-agent"), interval_ms=500) as agent:
        yield agent


class Job:
    """The 2-rank job under `tuiprof run -- torchrun`, with its own job id and step logs."""

    def __init__(self, tmp_path: pathlib.Path, job_args: tuple[str, ...]) -> None:
        self.id = f"slowtest-{uuid.uuid4().hex[:8]}"
        self.step_log = tmp_path / f"{self.id}.steps"
        command = [sys.executable, "-m", "tuiprof.cli", "run", "--",
                   sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port("127.0.0.1")),
                   "--rdzv-id", self.id, str(JOB), "--step-log", str(self.step_log), *job_args]
        with open(tmp_path / f"{self.id}.log", "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, "OMP_NUM_THREADS": "1"})

    def steps(self, rank: int) -> list[tuple[float, float]]:
        """The job's own step timer: (Unix time, step seconds) of each step of ``rank``."""
        lines = pathlib.Path(f"{self.step_log}-{rank}").read_text().splitlines()
        return [(float(t), float(s)) for t, s in (line.split() for line in lines if line.count(" ") == 1)]

    def step_seconds(self, since: float, until: float) -> float:
        """Rank 0's median step time between two Unix times."""
        return statistics.median(s for t, s in self.steps(0) if since <= t <= until)

    def stop(self) -> None:
        stop_job(self.process)


@pytest.fixture
def start_job(tmp_path):
    jobs: list[Job] = []

    def start(*job_args: str) -> Job:
        jobs.append(Job(tmp_path, job_args))
        return jobs[-1]

    yield start
    for job in jobs:
        job.stop()


async def watch(agent, job: Job, until, timeout: float) -> tuple[pb.HostSnapshot, pb.JobSlowdown | None]:
    """Snapshots until ``until(snapshot, the job's verdict)`` holds; the last one and its verdict."""
    verdict = None
    async with open_channel(agent.address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest())
        try:
            async with asyncio.timeout(timeout):
                async for snapshot in call:
                    assert job.process.poll() is None, f"the job ended with {job.process.returncode}"
                    verdict = next((s for s in snapshot.slowdowns if s.job_id == job.id), None)
                    if until(snapshot, verdict):
                        return snapshot, verdict
        except TimeoutError:
            raise AssertionError(f"not within {timeout} s; the last verdict: {verdict}") from None
        finally:
            call.cancel()
    raise AssertionError("the stream ended")


def job_pid(snapshot: pb.HostSnapshot, job: Job, rank: int) -> int:
    return next(r.pid for r in snapshot.ranks if r.job_id == job.id and r.HasField("rank") and r.rank == rank)


async def healthy_for(agent, job: Job, seconds: float) -> pb.HostSnapshot:
    """Wait for both ranks stepping with a verdict, then ``seconds`` of snapshots with no slow verdict."""
    snapshot, _ = await watch(agent, job, lambda s, v: v is not None and v.HasField("baseline_step_seconds"), 120)
    deadline = time.monotonic() + seconds

    def until(snapshot, verdict):
        assert verdict is not None and not verdict.slow, f"a false verdict on a healthy job: {verdict}"
        return time.monotonic() >= deadline

    await watch(agent, job, until, seconds + 30)
    return snapshot


async def named(agent, job: Job, cause: str, fault_at: float) -> pb.JobSlowdown:
    """The verdict naming SLOW_RANK, once its cause is ``cause``; checks it came within VERDICT_WITHIN_S."""
    def until(snapshot, verdict):
        return verdict is not None and verdict.slow and slowdown_cause(verdict.cause) == cause
    _, verdict = await watch(agent, job, until, 90)
    took = time.time() - fault_at
    assert verdict is not None
    assert [c.rank for c in verdict.culprits] == [SLOW_RANK], verdict
    assert took <= VERDICT_WITHIN_S, f"named after {took:.1f} s: {verdict}"
    return verdict


def assert_cost_matches_step_timer(job: Job, verdict: pb.JobSlowdown, fault_at: float) -> None:
    """The verdict's cost against the slowdown the job's own step timer measured (±35 % on this shared CPU)."""
    healthy = job.step_seconds(fault_at - 10, fault_at)
    slow = job.step_seconds(time.time() - 6, time.time())
    assert verdict.culprits[0].cost_seconds == pytest.approx(slow - healthy, rel=0.35), (healthy, slow, verdict)


async def status_job(agent, job: Job) -> dict:
    """The job's entry in `tuiprof status --json`."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tuiprof.cli", "status", "--json", agent.address.target,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return next(entry for entry in json.loads(out)["jobs"] if entry["job_id"] == job.id)


async def test_a_healthy_job_gets_no_verdict(agent, start_job):
    job = start_job()
    await healthy_for(agent, job, 20)
    entry = await status_job(agent, job)
    assert entry["ranks"] == 2 and entry["slowdown"] is None


async def test_a_slow_dataloader_on_one_rank(agent, start_job):
    job = start_job("--slow-rank", str(SLOW_RANK), "--fault", "dataloader", "--fault-ms", "40", "--after", "250")
    await watch(agent, job, lambda s, v: v is not None and v.HasField("baseline_step_seconds"), 120)
    fault_at = wait_for_step(job, 250)
    verdict = await named(agent, job, "input_pipeline", fault_at)
    assert any("waited for its DataLoader" in line for line in verdict.evidence), verdict.evidence
    await asyncio.sleep(6)
    _, verdict = await watch(agent, job, lambda s, v: v is not None and v.slow, 30)
    assert_cost_matches_step_timer(job, verdict, fault_at)
    slowdown = (await status_job(agent, job))["slowdown"]
    assert slowdown["cause"] == "input_pipeline" and [r["rank"] for r in slowdown["ranks"]] == [SLOW_RANK]
    assert slowdown["cost_ms"] > 0 and slowdown["cost_percent"] > 10 and slowdown["hosts"] == [verdict.culprits[0].host]


async def test_a_gc_storm_on_one_rank(agent, start_job):
    job = start_job("--slow-rank", str(SLOW_RANK), "--fault", "gc", "--fault-ms", "40", "--after", "250")
    await watch(agent, job, lambda s, v: v is not None and v.HasField("baseline_step_seconds"), 120)
    fault_at = wait_for_step(job, 250)
    verdict = await named(agent, job, "gc_pauses", fault_at)
    assert any("paused for garbage collection" in line for line in verdict.evidence), verdict.evidence


async def test_busy_processes_on_one_ranks_cpu(agent, start_job):
    job = start_job()
    snapshot = await healthy_for(agent, job, 5)
    pid = job_pid(snapshot, job, SLOW_RANK)
    cpu = sorted(os.sched_getaffinity(pid))
    # each in a session of its own, as other users' work would be: the scheduler shares a CPU
    # between sessions (autogroups) first, so six of them leave the rank a seventh of its CPU
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                             preexec_fn=lambda: os.sched_setaffinity(0, cpu)) for _ in range(6)]
    try:
        fault_at = time.time()
        verdict = await named(agent, job, "cpu_starved", fault_at)
        assert any("run-queue delay" in line for line in verdict.evidence), verdict.evidence
        await asyncio.sleep(8)
        _, verdict = await watch(agent, job, lambda s, v: v is not None and v.slow, 30)
        assert_cost_matches_step_timer(job, verdict, fault_at)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


async def test_a_rank_stopped_and_continued_on_a_duty_cycle(agent, start_job):
    job = start_job()
    snapshot = await healthy_for(agent, job, 5)
    pid = job_pid(snapshot, job, SLOW_RANK)
    done = threading.Event()

    def duty_cycle() -> None:
        """Stopped about a third of the time, from outside, at no fixed period (one would be in step
        with the agent's snapshots, or never)."""
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(random.uniform(0.2, 0.4))
            os.kill(pid, signal.SIGCONT)
            time.sleep(random.uniform(0.4, 0.8))

    thread = threading.Thread(target=duty_cycle, daemon=True)
    fault_at = time.time()
    thread.start()
    try:
        verdict = await named(agent, job, "stopped", fault_at)
        assert any("seen stopped" in line for line in verdict.evidence), verdict.evidence
    finally:
        done.set()
        thread.join()
        os.kill(pid, signal.SIGCONT)


def wait_for_step(job: Job, step: int, timeout: float = 120) -> float:
    """When rank SLOW_RANK finished ``step`` steps (Unix time), by the job's own step log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = job.steps(SLOW_RANK) if pathlib.Path(f"{job.step_log}-{SLOW_RANK}").exists() else []
        if len(steps) >= step:
            return steps[step - 1][0]
        time.sleep(0.2)
    raise AssertionError(f"the job did not reach step {step} in {timeout} s")
