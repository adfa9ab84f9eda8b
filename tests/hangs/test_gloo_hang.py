"""End to end, real processes, no GPU: a 4-rank torch.distributed (gloo) job under
`tuiprof run`, a real agentd with a short hang timeout, and `tuiprof stacks --json`.

One rank (chosen here) stops joining the all_reduces and sleeps in a function of
its own: the agent must flag the hang, PyTorch's Flight Recorder counters (which
the startup hook publishes) must say which collective that rank never launched,
and the merged stacks must name exactly that rank and its function. Then a job
whose ranks all wait in the same place: hung, but no single suspect.
"""

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from testkit.agents import running_agent
from testkit.jobs import stop_job
from testkit.ports import free_port
from tuiprof.client.channel import open_channel

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch", reason="the gloo hang test needs the PyTorch CPU build")

JOB = pathlib.Path(__file__).with_name("gloo_job.py")
STUCK_RANK = 2
HANG_TIMEOUT_S = 4


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with running_agent(tmp_path_factory.mktemp("hang-agent"), interval_ms=250,
                       extra_args=["--hang-timeout-s", str(HANG_TIMEOUT_S), "--hang-suspect-s", "2"]) as agent:
        yield agent


class Job:
    """The gloo job under `tuiprof run -- torchrun`, with its own job id (torchrun's run id)."""

    def __init__(self, tmp_path: pathlib.Path, job_args: tuple[str, ...]) -> None:
        self.id = f"hangtest-{uuid.uuid4().hex[:8]}"
        command = [sys.executable, "-m", "tuiprof.cli", "run", "--",
                   sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "4",
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port("127.0.0.1")),
                   "--rdzv-id", self.id, str(JOB), *job_args]
        with open(tmp_path / f"{self.id}.log", "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, "OMP_NUM_THREADS": "1"})

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


async def wait_for_hang(agent, job: Job, timeout: float = 150) -> pb.HostSnapshot:
    """The first snapshot in which the job's 4 ranks are judged hung."""
    async with open_channel(agent.address) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=timeout)
        try:
            async for snapshot in call:
                assert job.process.poll() is None, f"the job ended with {job.process.returncode} before hanging"
                pids = {r.pid for r in snapshot.ranks if r.job_id == job.id and r.state != pb.RANK_STATE_EXITED}
                hung = [v for v in snapshot.hang.ranks if v.pid in pids and v.level == pb.HANG_LEVEL_HUNG]
                if len(pids) == 4 and len(hung) == 4:
                    return snapshot
        finally:
            call.cancel()
    raise AssertionError("the stream ended without a hang")


async def tuiprof_stacks_json(agent, job: Job, *extra: str) -> dict:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tuiprof.cli", "stacks", "--json", "--job", job.id, *extra, agent.address.target,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 3, err.decode()  # 3: an agent reports the job hung (every caller waits for that)
    return json.loads(out)


def require_ptrace(doc: dict) -> None:
    errors = [p["error"] for h in doc["hosts"] for p in h["processes"] if p["error"]]
    if any("Permission denied" in e or "Operation not permitted" in e for e in errors):
        pytest.skip(f"py-spy may not ptrace the ranks here (needs root, CAP_SYS_PTRACE or "
                    f"kernel.yama.ptrace_scope=0): {errors[0]}")
    assert not errors, errors


async def test_the_rank_that_stops_joining_is_the_suspect(agent, start_job):
    job = start_job("--stuck-rank", str(STUCK_RANK))
    snapshot = await wait_for_hang(agent, job)
    ranks = [r for r in snapshot.ranks if r.job_id == job.id]
    assert sorted(r.rank for r in ranks) == [0, 1, 2, 3]
    assert all(r.step_count >= 30 for r in ranks)
    verdicts = {v.rank: v.explanation for v in snapshot.hang.ranks if v.pid in {r.pid for r in ranks}}
    assert all("no optimizer step for" in text for text in verdicts.values()), verdicts
    assert snapshot.hang.level == pb.HANG_LEVEL_HUNG
    # Flight Recorder: 30 steps x 4 gradients = 120 all_reduces done; #121 launched by all but the stuck rank
    progress = {r.rank: [(g.id, g.last_enqueued, g.last_completed) for g in r.process_groups] for r in ranks}
    assert progress == {r: [("0", 120 if r == STUCK_RANK else 121, 120)] for r in range(4)}, progress
    assert verdicts[STUCK_RANK].startswith(
        f"rank {STUCK_RANK}: never launched gloo:all_reduce #121 on comm pg0 (ranks 0-1,3 launched it)"), verdicts
    assert all(verdicts[r].startswith(f"rank {r}: gloo:all_reduce #121 on comm pg0 launched ") for r in (0, 1, 3))

    doc = await tuiprof_stacks_json(agent, job)
    require_ptrace(doc)
    assert doc["ranks"] == 4
    assert [s["ranks"] for s in doc["suspects"]] == [str(STUCK_RANK)]
    reason = doc["suspects"][0]["reason"]
    assert reason.startswith(f"rank {STUCK_RANK} never launched gloo:all_reduce #121 on comm pg0 (ranks 0-1,3 "
                             "launched it); it is in `stop_joining_and_sleep (gloo_job.py)`"), reason
    assert "ranks 0-1,3 are in `all_reduce" in reason, reason
    assert doc["classes"][0]["ranks"] == str(STUCK_RANK) and doc["classes"][-1]["ranks"] == "0-1,3"
    assert doc["hosts"][0]["hang"]["level"] == "hung"
    assert sorted((v["rank"], v["level"]) for v in doc["hosts"][0]["hang"]["ranks"]) == [
        (r, "hung") for r in range(4)]

    # The stacks the agent took by itself when it declared the hang say the same.
    incident = await tuiprof_stacks_json(agent, job, "--incident")
    require_ptrace(incident)
    assert [s["ranks"] for s in incident["suspects"]] == [str(STUCK_RANK)]
    assert "no optimizer step" in incident["hosts"][0]["incident"]


async def test_ranks_waiting_in_the_same_place_have_no_single_suspect(agent, start_job):
    job = start_job("--all-wait")
    await wait_for_hang(agent, job)
    doc = await tuiprof_stacks_json(agent, job)
    require_ptrace(doc)
    assert doc["ranks"] == 4 and doc["suspects"] == []
    assert [(c["ranks"], c["count"]) for c in doc["classes"]] == [("0-3", 4)]
    assert doc["classes"][0]["where"].startswith("everyone_waits_here (gloo_job.py)")
