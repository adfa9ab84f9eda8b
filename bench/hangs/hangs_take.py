"""From "take stacks" to the merged view, for 8 local ranks of a real hung PyTorch job.

Run (root, or a user allowed to ptrace the ranks):
    .venv/bin/python bench/hangs/hangs_take.py [--ranks 8] [--repeat 5]

Starts agentd (real collectors, hang detection) and an 8-rank torch.distributed
gloo job under `tuiprof run -- torchrun` in which rank 3 stops joining and the
others block in all_reduce, then measures, side by side:
  py-spy per rank      one `py-spy dump --json` of one rank, sequentially (the cost per rank)
  StackTaker.take      all ranks dumped in parallel and pre-merged, in-process (the agent's work)
  end to end           GetStacks over gRPC + merge + classes/suspects (what `tuiprof stacks`
                       does, without starting a Python interpreter)
each without and with native frames; and the hang detector's cost per snapshot
(HangService.process on the agent's real snapshot with these ranks).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import psutil

from agentd.hang import pyspy
from agentd.hang.detector import Thresholds
from agentd.hang.service import HangService
from agentd.hang.stacks import DumpTarget, StackTaker
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.address import AgentAddress
from tuiprof.client.channel import open_channel
from tuiprof.client.host_client import ConnectionOptions
from tuiprof.analysis.stacks_report import job_report
from tuiprof.client.stacks import gather_stacks

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "hangs" / "gloo_job.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def hung_snapshot(address: AgentAddress, job_id: str, ranks: int, timeout: float = 300) -> pb.HostSnapshot:
    async with open_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), 60)  # agentd is still starting
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest(), timeout=timeout)
        async for snapshot in call:
            mine = {r.pid for r in snapshot.ranks if r.job_id == job_id and r.state != pb.RANK_STATE_EXITED}
            if len(mine) == ranks and all(v.level == pb.HANG_LEVEL_HUNG for v in snapshot.hang.ranks if v.pid in mine):
                call.cancel()
                return snapshot
    raise RuntimeError("no hang seen")


def stats_ms(values: list[float]) -> str:
    values = sorted(v * 1000 for v in values)
    return f"median {statistics.median(values):7.1f} ms  min {values[0]:7.1f}  max {values[-1]:7.1f}"


async def measure(args, address, snapshot, job_id):
    ranks = sorted((r for r in snapshot.ranks if r.job_id == job_id), key=lambda r: r.rank)
    binary = pyspy.find_pyspy()
    targets = [DumpTarget.pin(r.pid, r.rank, None) for r in ranks]
    options = ConnectionOptions(timeout=120)
    for native in (False, True):
        tag = "native" if native else "python"
        per_rank = []
        for _ in range(args.repeat):
            for rank in ranks:
                result = pyspy.dump(binary, rank.pid, rank.rank, native)
                assert not result.error, result.error
                per_rank.append(result.dump_seconds)
        print(f"py-spy dump, one rank ({tag}){'':<13} {stats_ms(per_rank)}")
        takes = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            StackTaker(binary).take(targets, native)  # a new taker each time: no reuse of a recent dump
            takes.append(time.perf_counter() - started)
        print(f"StackTaker.take, {len(ranks)} ranks in parallel ({tag}){'':<2} {stats_ms(takes)}")
        ends = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            hosts = await gather_stacks([address], options, True, native, 120, job_id)
            report = job_report(hosts, lines=False, native=native)
            ends.append(time.perf_counter() - started)
        suspects = [s.reason[:90] for s in report.suspects]
        print(f"end to end: GetStacks + merge + report ({tag}) {stats_ms(ends)}")
        print(f"    suspects: {suspects}")
    service = HangService(Thresholds(2, 4), None)
    costs = []
    for _ in range(200):
        copy = pb.HostSnapshot()
        copy.CopyFrom(snapshot)
        started = time.perf_counter()
        service.process(copy)
        costs.append(time.perf_counter() - started)
    print(f"hang detector per snapshot ({len(snapshot.ranks)} ranks on the host){'':<1} "
          f"median {statistics.median(costs) * 1e6:.0f} us (of a {args.interval_ms} ms interval: "
          f"{statistics.median(costs) * 1000 / args.interval_ms * 100:.3f} %)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--interval-ms", type=int, default=500)
    args = parser.parse_args()
    print(f"{platform.node()}: {psutil.cpu_count()} CPUs, python {platform.python_version()}, "
          f"py-spy {pyspy.pyspy_version(pyspy.find_pyspy())}, {args.ranks} ranks (gloo, torch CPU), "
          f"{args.repeat} repeats")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="hangs-bench-"))
    port = free_port()
    with open(tmp / "agentd.log", "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "agentd.cli", "--port", str(port), "--metrics-port", str(free_port()),
             "--interval-ms", str(args.interval_ms), "--trace-dir", str(tmp / "traces"),
             "--hang-timeout-s", "4", "--hang-suspect-s", "2"],
            stderr=log)
    job_id = f"bench-{uuid.uuid4().hex[:8]}"
    with open(tmp / "job.log", "wb") as log:
        job = subprocess.Popen(
            [sys.executable, "-m", "tuiprof.cli", "run", "--", sys.executable, "-m", "torch.distributed.run",
             "--nnodes", "1", "--nproc-per-node", str(args.ranks), "--master-addr", "127.0.0.1",
             "--master-port", str(free_port()), "--rdzv-id", job_id, str(JOB), "--stuck-rank", "3",
             "--hang-after", "20"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        address = AgentAddress("127.0.0.1", port)
        snapshot = asyncio.run(hung_snapshot(address, job_id, args.ranks))
        asyncio.run(measure(args, address, snapshot, job_id))
    finally:
        family = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
        for proc in family:
            proc.kill()
        psutil.wait_procs(family, timeout=30)
        for proc in family:
            for path in pathlib.Path("/dev/shm").glob(f"tuiprof-{os.getuid()}-{proc.pid}-*"):  # segment, side files
                path.unlink(missing_ok=True)
        agent.terminate()
        agent.wait(timeout=30)


if __name__ == "__main__":
    main()
