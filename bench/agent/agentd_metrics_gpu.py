"""agentd's collectors on a GPU machine: GPM idle vs under load, NVLink vs a known copy, and their cost.

Runs the registered collectors through agentd's own CollectorRunner (one
thread each, 1 s interval) in this process, assembles a snapshot and renders
/metrics once a second (as a scrape would), and walks through phases:

  host-only  the GPU collector not started (baseline CPU and RSS)
  idle       GPU collector on, GPUs idle
  matmul     one process per GPU running bf16 8192^3 matmuls
  p2p        GPU 0 -> GPU 1 copies of 1 GiB; the program counts its bytes

Independent checks: ``nvidia-smi dmon --gpm-metrics`` during the matmul phase,
and the copy program's own byte count against the NVLink counters.

    python3 bench/agent/agentd_metrics_gpu.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil

from agentd.prometheus import render_metrics
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.registry import COLLECTORS
from agentd.runner import CollectorRunner, load_collectors

MATMUL = """
import sys, time, torch
device = torch.device(f"cuda:{int(sys.argv[1])}")
a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
b = torch.randn_like(a)
for _ in range(3):
    a @ b
torch.cuda.synchronize(device)
print("ready", flush=True)
sys.stdin.readline()
end, count = time.time() + float(sys.argv[2]), 0
start = time.time()
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize(device)
    count += 20
print(f"matmuls {count} tflops {count * 2 * 8192**3 / (time.time() - start) / 1e12:.1f}", flush=True)
"""

P2P = """
import sys, time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:1")
y.copy_(x); torch.cuda.synchronize("cuda:0"); torch.cuda.synchronize("cuda:1")
print("ready", flush=True)
sys.stdin.readline()
start, end, copied = time.time(), time.time() + float(sys.argv[1]), 0
while time.time() < end:
    for _ in range(4):
        y.copy_(x)
        copied += x.numel()
    torch.cuda.synchronize("cuda:0"); torch.cuda.synchronize("cuda:1")
print(f"copied_bytes {copied} seconds {time.time() - start:.3f}", flush=True)
"""

GPU_FIELDS = (
    "utilization_percent", "sm_active_percent", "sm_occupancy_percent", "tensor_active_percent",
    "dram_active_percent", "fp16_active_percent", "fp32_active_percent", "graphics_active_percent",
    "power_watts", "sm_clock_hz", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s",
    "gpm_nvlink_tx_bytes_per_s", "gpm_nvlink_rx_bytes_per_s", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
    "gpm_window_seconds",
)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Bench:
    def __init__(self, interval: float) -> None:
        self.runners = [CollectorRunner(c) for c in load_collectors(COLLECTORS, interval)]
        self.gpu = next(r for r in self.runners if r.name == "gpu")
        self.info = pb.AgentInfo(hostname=socket.gethostname())
        self.ticks: list[dict[str, Any]] = []
        self.phases: dict[str, dict[str, Any]] = {}

    def snapshot(self) -> pb.HostSnapshot:
        snapshot = pb.HostSnapshot(hostname=self.info.hostname, timestamp_unix_ns=time.time_ns())
        for runner in self.runners:
            snapshot.collectors.append(runner.fill(snapshot, runner.status()))
        return snapshot

    def phase(self, name: str, seconds: float) -> None:
        started_cpu, started = cpu_seconds(), time.monotonic()
        render_costs = []
        while time.monotonic() - started < seconds:
            time.sleep(1.0 - (time.monotonic() - started) % 1.0)
            snapshot = self.snapshot()
            t = time.perf_counter()
            text = render_metrics(snapshot, self.info)
            render_costs.append(time.perf_counter() - t)
            tick: dict[str, Any] = {"phase": name, "t": round(time.monotonic() - started, 2),
                                    "gpu_collect_seconds": self.gpu.last_run.duration_seconds
                                    if self.gpu.last_run is not None else None,
                                    "metrics_bytes": len(text), "gpus": []}
            for gpu in snapshot.gpus:
                row = {f: getattr(gpu, f) for f in GPU_FIELDS if gpu.HasField(f)}
                row["index"] = gpu.index
                row["unavailable"] = dict(gpu.unavailable)
                row["processes"] = [(p.pid, p.name, p.used_memory_bytes) for p in gpu.processes]
                tick["gpus"].append(row)
            self.ticks.append(tick)
        wall = time.monotonic() - started
        self.phases[name] = {
            "wall_seconds": round(wall, 2),
            "agent_cpu_seconds_per_second": (cpu_seconds() - started_cpu) / wall,
            "rss_bytes": psutil.Process().memory_info().rss,
            "render_seconds_median": statistics.median(render_costs) if render_costs else None,
        }
        print(f"phase {name}: {self.phases[name]}", flush=True)


def start_load(code: str, *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def go(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()


def summarize(ticks: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for tick in ticks:
        for gpu in tick["gpus"]:
            for field in GPU_FIELDS:
                if field in gpu:
                    summary.setdefault(tick["phase"], {}).setdefault(f"gpu{gpu['index']}", {}).setdefault(field, []).append(gpu[field])
    for phase in summary.values():
        for gpu in phase.values():
            for field, values in gpu.items():
                gpu[field] = {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
    costs = [t["gpu_collect_seconds"] for t in ticks if t["gpu_collect_seconds"] is not None and t["phase"] != "host-only"]
    if costs:
        costs.sort()
        summary["gpu_collect_seconds"] = {"median": statistics.median(costs), "p99": costs[int(0.99 * (len(costs) - 1))],
                                          "max": costs[-1], "n": len(costs)}
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-s", type=float, default=20)
    parser.add_argument("--load-s", type=float, default=20)
    parser.add_argument("--p2p-s", type=float, default=8)
    parser.add_argument("--host-only-s", type=float, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    bench = Bench(1.0)
    for runner in bench.runners:
        if runner.name != "gpu":
            runner.start()
    statuses = {r.name: (s.available, s.reason) for r in bench.runners for s in [r.status()]}
    print("collectors:", statuses, flush=True)
    bench.phase("host-only", args.host_only_s)
    bench.gpu.start()
    bench.gpu.collector.describe(bench.info)
    print("info:", bench.info, flush=True)
    bench.phase("idle", args.idle_s)
    if not bench.info.gpus:
        print("no GPUs: stopping after the idle phase", flush=True)
        for runner in bench.runners:
            runner.stop()
        return 1

    loads = [start_load(MATMUL, str(i), str(args.load_s + 2)) for i in range(len(bench.info.gpus))]
    dmon = subprocess.Popen(["nvidia-smi", "dmon", "--gpm-metrics", "2,3,5,10", "-c", str(int(args.load_s - 4))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    go(loads)
    bench.phase("matmul", args.load_s)
    load_output = [p.communicate(timeout=60)[0].strip() for p in loads]
    dmon_output = dmon.communicate(timeout=60)[0]
    print("matmul programs:", load_output, "\nnvidia-smi dmon:\n" + dmon_output, flush=True)

    copier = start_load(P2P, str(args.p2p_s + 1)) if len(bench.info.gpus) >= 2 else None
    if copier is not None:
        go([copier])
        bench.phase("p2p", args.p2p_s)
        copy_output = copier.communicate(timeout=60)[0].strip()
        print("p2p program:", copy_output, flush=True)
    else:
        copy_output = "one GPU: no p2p phase"

    statuses_after = {r.name: (s.available, s.reason) for r in bench.runners for s in [r.status()]}
    print("collectors after the run:", statuses_after, flush=True)
    for runner in bench.runners:
        runner.stop()
    result = {"info": json.loads(json.dumps({"hostname": bench.info.hostname, "driver": bench.info.driver_version,
                                             "nvml": bench.info.nvml_version, "cuda": bench.info.cuda_driver_version,
                                             "gpus": [(g.name, g.uuid, g.architecture, g.gpm_supported) for g in bench.info.gpus]})),
              "collectors": statuses, "collectors_after": statuses_after, "phases": bench.phases, "summary": summarize(bench.ticks),
              "matmul_programs": load_output, "nvidia_smi_dmon": dmon_output, "p2p_program": copy_output,
              "ticks": bench.ticks}
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    print(json.dumps({k: result[k] for k in ("phases", "summary")}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
