"""agentd with many Watch clients, some of which never read: memory must stay flat.

Starts agentd (loopback, ``--interval-ms`` 100 to make ten times the usual
traffic), attaches ``--readers`` clients that read every snapshot and
``--stuck`` clients that open a stream and never read again, then samples
agentd's RSS and CPU time once a second for ``--seconds``. A server that queued
snapshots for the stuck clients would grow by (snapshots per second x snapshot
size x stuck clients) every second; one that keeps only the newest per watcher
stays flat once the stuck clients' HTTP/2 windows are full.

    .venv/bin/python bench/agent/agentd_watchers.py --readers 20 --stuck 20 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import grpc
import psutil

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc

INTERVAL_MS = 100
WARMUP_SECONDS = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def reader(target: str, counts: list[int], index: int) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        async for _ in pb_grpc.AgentStub(channel).Watch(pb.WatchRequest()):
            counts[index] += 1


async def stuck(target: str, opened: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest())
        await call.read()
        opened.set()
        await asyncio.Event().wait()  # never read again


async def run(args: argparse.Namespace, target: str, agent: psutil.Process) -> dict[str, float]:
    counts = [0] * args.readers
    openings = [asyncio.Event() for _ in range(args.stuck)]
    tasks = [asyncio.create_task(reader(target, counts, i)) for i in range(args.readers)]
    tasks += [asyncio.create_task(stuck(target, event)) for event in openings]
    await asyncio.gather(*(asyncio.wait_for(e.wait(), 30) for e in openings))
    await asyncio.sleep(WARMUP_SECONDS)
    rss = []
    cpu_start = sum(agent.cpu_times()[:2])
    counts_start = sum(counts)
    began = time.monotonic()
    while time.monotonic() - began < args.seconds:
        rss.append(agent.memory_info().rss)
        await asyncio.sleep(1.0)
    elapsed = time.monotonic() - began
    result = {
        "rss_first_mb": rss[0] / 1e6, "rss_last_mb": rss[-1] / 1e6, "rss_max_mb": max(rss) / 1e6,
        "rss_slope_kb_per_min": statistics.linear_regression(range(len(rss)), rss).slope * 60 / 1e3,
        "cpu_percent": (sum(agent.cpu_times()[:2]) - cpu_start) / elapsed * 100,
        "per_reader_per_s": (sum(counts) - counts_start) / elapsed / max(1, args.readers),
    }
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readers", type=int, default=20)
    parser.add_argument("--stuck", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    port, metrics_port = free_port(), free_port()
    command = [sys.executable, "-m", "agentd.cli", "--port", str(port), "--metrics-port", str(metrics_port),
               "--interval-ms", str(INTERVAL_MS), "--trace-dir", tempfile.mkdtemp(prefix="agentd-bench-")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)
        result = asyncio.run(run(args, f"127.0.0.1:{port}", psutil.Process(process.pid)))
    finally:
        process.terminate()
        process.wait(10)
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"agentd --interval-ms {INTERVAL_MS}; {args.readers} readers, {args.stuck} stuck clients; "
          f"{args.seconds:.0f} s after {WARMUP_SECONDS:.0f} s warm-up\n")
    print("| readers | stuck | snapshots/s per reader | agentd CPU (% of one core) "
          "| RSS first (MB) | RSS last (MB) | RSS max (MB) | RSS trend (KB/min) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.readers} | {args.stuck} | {result['per_reader_per_s']:.2f} | {result['cpu_percent']:.1f} "
          f"| {result['rss_first_mb']:.1f} | {result['rss_last_mb']:.1f} | {result['rss_max_mb']:.1f} "
          f"| {result['rss_slope_kb_per_min']:+.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
