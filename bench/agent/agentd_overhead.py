"""agentd's own cost beside Debian's prometheus-node-exporter, measured in one run.

Both run at the same time on loopback, both scraped once a second (Prometheus's
usual pace), agentd at its default 1 s interval with a gRPC Watch client
attached (as when a console is open). After a warm-up, CPU time (user+system,
from /proc) and RSS of each process are sampled for ``--seconds``. Then each
``/metrics`` is scraped ``--scrapes`` times back to back over one keep-alive
connection, and the latency percentiles are reported.

    .venv/bin/python bench/agent/agentd_overhead.py --seconds 60 --scrapes 1000

Prints a markdown table (paste into bench/agent/agentd_overhead.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import psutil

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.address import AgentAddress
from tuiprof.client.channel import open_channel

NODE_EXPORTER = "prometheus-node-exporter"
WARMUP_SECONDS = 5.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", path)
            if connection.getresponse().status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing healthy on port {port}{path} after {timeout} s")


@contextlib.contextmanager
def started(command: list[str], port: int, path: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(port, path)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def scrape(connection: http.client.HTTPConnection) -> float:
    """Seconds for one GET /metrics including reading the body."""
    start = time.perf_counter()
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - start
    if response.status != 200 or not body:
        raise RuntimeError(f"/metrics answered {response.status}")
    return elapsed


def watch_in_background(port: int, stop: threading.Event) -> threading.Thread:
    """A console-like gRPC client reading every snapshot, on its own thread and loop."""

    async def watch() -> None:
        async with open_channel(AgentAddress("127.0.0.1", port)) as channel:
            call = pb_grpc.AgentStub(channel).Watch(pb.WatchRequest())
            async for _ in call:
                if stop.is_set():
                    call.cancel()
                    return

    thread = threading.Thread(target=asyncio.run, args=(watch(),), daemon=True)
    thread.start()
    return thread


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(processes: dict[str, psutil.Process], ports: dict[str, int], seconds: float) -> dict[str, dict[str, float]]:
    """CPU-seconds per second and RSS of each process while each is scraped once a second."""
    connections = {name: http.client.HTTPConnection("127.0.0.1", port, timeout=10) for name, port in ports.items()}
    cpu_start = {name: cpu_seconds(p) for name, p in processes.items()}
    rss: dict[str, list[int]] = {name: [] for name in processes}
    began = time.monotonic()
    next_tick = began
    while time.monotonic() - began < seconds:
        for name, connection in connections.items():
            scrape(connection)
            rss[name].append(processes[name].memory_info().rss)
        next_tick += 1.0
        time.sleep(max(0.0, next_tick - time.monotonic()))
    elapsed = time.monotonic() - began
    return {
        name: {
            "cpu_per_s": (cpu_seconds(p) - cpu_start[name]) / elapsed,
            "rss_mean_mb": statistics.fmean(rss[name]) / 1e6,
            "rss_max_mb": max(rss[name]) / 1e6,
        }
        for name, p in processes.items()
    }


def latencies(port: int, count: int) -> dict[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    samples = sorted(scrape(connection) for _ in range(count))
    connection.close()
    return {"p50_ms": samples[len(samples) // 2] * 1e3,
            "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e3,
            "max_ms": samples[-1] * 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrapes", type=int, default=1000)
    args = parser.parse_args()
    exporter = shutil.which(NODE_EXPORTER)
    if exporter is None:
        print(f"needs {NODE_EXPORTER}: apt-get install -y {NODE_EXPORTER}", file=sys.stderr)
        return 2

    grpc_port, agent_metrics, exporter_port = free_port(), free_port(), free_port()
    trace_dir = tempfile.mkdtemp(prefix="agentd-bench-")
    agent_cmd = [sys.executable, "-m", "agentd.cli", "--port", str(grpc_port),
                 "--metrics-port", str(agent_metrics), "--interval-ms", "1000", "--trace-dir", trace_dir]
    exporter_cmd = [exporter, f"--web.listen-address=127.0.0.1:{exporter_port}"]
    with started(agent_cmd, agent_metrics, "/healthz") as agent, \
            started(exporter_cmd, exporter_port, "/metrics") as node_exporter:
        stop = threading.Event()
        watcher = watch_in_background(grpc_port, stop)
        time.sleep(WARMUP_SECONDS)
        processes = {"agentd": psutil.Process(agent.pid), "node_exporter": psutil.Process(node_exporter.pid)}
        ports = {"agentd": agent_metrics, "node_exporter": exporter_port}
        usage = measure(processes, ports, args.seconds)
        scrape_times = {name: latencies(port, args.scrapes) for name, port in ports.items()}
        stop.set()
        watcher.join(5)
        version = subprocess.run([exporter, "--version"], capture_output=True, text=True)
        exporter_version = (version.stdout + version.stderr).splitlines()[0]

    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}, "
          f"Python {platform.python_version()}; {exporter_version}")
    print(f"window: {args.seconds:.0f} s after {WARMUP_SECONDS:.0f} s warm-up; {args.scrapes} scrapes each\n")
    print("| process | CPU (% of one core) | RSS mean (MB) | RSS max (MB) | /metrics p50 (ms) | p99 (ms) | max (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in processes:
        u, s = usage[name], scrape_times[name]
        print(f"| {name} | {u['cpu_per_s'] * 100:.2f} | {u['rss_mean_mb']:.1f} | {u['rss_max_mb']:.1f} "
              f"| {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | {s['max_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
