import asyncio
import contextlib
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from agentd.agent import Agent
from agentd.auth import CallerIdentifier
from agentd.collectors.ranks import rank_state
from agentd.collectors.base import Collector
from agentd.hang import pyspy
from agentd.hang.detector import Thresholds
from agentd.hang.service import HangService
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd import procfs
from agentd.runner import CollectorRunner
from agentd.server import AgentServicer, static_info
from agentd.address import AgentAddress

PARKED_PROGRAM = textwrap.dedent('''
    import threading, time

    def {function}():
        time.sleep(1000)

    def helper_loop():
        time.sleep(1000)

    threading.Thread(target=helper_loop, name="helper", daemon=True).start()
    print("ready", flush=True)
    {function}()
''')


@pytest.fixture(scope="session")
def pyspy_binary():
    """The py-spy binary, or a skip saying why stacks cannot be read here."""
    try:
        return pyspy.find_pyspy()
    except pyspy.PySpyMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def parked(tmp_path):
    """Start processes sleeping in a named function (main thread) and in ``helper_loop``
    (thread "helper"); all are killed at the end."""
    procs = []

    def start(function: str) -> subprocess.Popen:
        script = tmp_path / f"{function}.py"
        script.write_text(PARKED_PROGRAM.format(function=function))
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.1)  # let the main thread reach its sleep
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


class KnownRanks(Collector):
    """Reports the given processes as ranks, as the ranks collector does for segment owners."""

    name = "ranks"

    def __init__(self, ranks):
        super().__init__(0.1)
        self.ranks = ranks  # [(job id, rank, pid)]

    def status(self):
        return pb.CollectorStatus(name=self.name, available=True, interval_seconds=0.1)

    def collect(self):
        pass

    def fill(self, snapshot):
        for job, rank, pid in self.ranks:
            size = sum(1 for j, _, _ in self.ranks if j == job)
            snapshot.ranks.add(pid=pid, rank=rank, world_size=size, job_id=job, state=rank_state(procfs.state_of(pid)))


@contextlib.asynccontextmanager
async def serving(tmp_path, ranks):
    """An in-process agent (real gRPC on loopback, real HangService) reporting ``ranks``."""
    agent = Agent([CollectorRunner(KnownRanks(ranks))], 0.1, hostname="node-a")
    service = HangService(Thresholds(1, 2), tmp_path / "hangs", "node-a")
    agent.post_processors.append(service.process)
    agent.start_collectors()
    runner = asyncio.create_task(agent.run())
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    callers = CallerIdentifier(token_required=False, port=port)
    pb_grpc.add_AgentServicer_to_server(
        AgentServicer(agent, static_info(agent, str(tmp_path)), callers, None, service), server)
    await server.start()
    try:
        while agent.latest is None or not agent.latest.ranks:
            await asyncio.sleep(0.05)
        yield AgentAddress("127.0.0.1", port)
    finally:
        await server.stop(0)
        runner.cancel()
        agent.stop_collectors()


@pytest.fixture
async def agent_with_ranks(tmp_path, parked, pyspy_binary):
    """An agent whose ranks are four parked processes: ranks 0-2 in ``all_reduce_wait``,
    rank 3 in ``stuck_in_loader``. They are reported by a collector in the shape the ranks
    collector uses (pid, rank, job, state), so the service sees what it sees in agentd."""
    procs = {r: parked("all_reduce_wait") for r in (0, 1, 2)}
    procs[3] = parked("stuck_in_loader")
    async with serving(tmp_path, [("", r, p.pid) for r, p in procs.items()]) as address:
        yield address, procs, tmp_path


@pytest.fixture
async def agent_with_two_jobs(tmp_path, parked, pyspy_binary):
    """Job "a": ranks 0-2 in ``all_reduce_wait``, rank 3 in ``stuck_in_loader``;
    job "b" on the same host: ranks 0-1 in ``other_job_wait``."""
    ranks = [("a", r, parked("all_reduce_wait").pid) for r in (0, 1, 2)]
    ranks.append(("a", 3, parked("stuck_in_loader").pid))
    ranks += [("b", r, parked("other_job_wait").pid) for r in (0, 1)]
    async with serving(tmp_path, ranks) as address:
        yield address


async def tuiprof_cli(*args: str) -> tuple[int, str, str]:
    """``tuiprof ARGS…`` in a subprocess: exit status, stdout, stderr (two minutes at most)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tuiprof.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()
