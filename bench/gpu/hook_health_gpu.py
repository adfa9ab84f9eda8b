"""One GPU: the hardened hook on real cuBLAS and NCCL, seen end to end through agentd.

What this round changed is checked on real hardware, against measurements our code did not
make: the hook now creates its segment O_EXCL with posix_fallocate, parks its writer thread
while idle and wakes it by futex, and looks real symbols up through TP_REAL; the agent reads
segments with pread as kernel-checked claims and reports the hook's own health.

The worker (started under `tuiprof run`) idles 3 s so the writer is parked, then runs a burst
of bf16 GEMMs each timed by its own CUDA events, then a world-size-1 NCCL all-reduce loop.
Beside it `tuiprof record` keeps every snapshot agentd publishes and `tuiprof status --json`
takes the last one. The report compares counts (exact), per-interval TFLOPS (ours vs the
program's events, intervals fully inside the burst), and the hook's health (CUDA timing on,
NCCL plugin loaded, nothing dropped or untimed).

    python3 bench/gpu/hook_health_gpu.py --out DIR      # on the GPU machine, from the checkout
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
N = 8192
GEMMS = 1500
ALLREDUCES = 200
IDLE_SECONDS = 3.0
AGENTD = [sys.executable, "-c", "import sys; from agentd.cli import main; sys.exit(main())"]
TUIPROF = [sys.executable, "-c", "import sys; from tuiprof.cli import main; sys.exit(main())"]


def worker(out: pathlib.Path) -> None:
    import torch
    import torch.distributed as dist

    time.sleep(IDLE_SECONDS)  # the writer thread backs off and parks
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(GEMMS)]
    torch.cuda.synchronize()
    started = time.time()
    for start, end in pairs:
        start.record()
        torch.mm(a, b)
        end.record()
    torch.cuda.synchronize()
    finished = time.time()
    seconds = [s.elapsed_time(e) / 1e3 for s, e in pairs]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    x = torch.ones(16 << 20, device="cuda", dtype=torch.bfloat16)
    for _ in range(ALLREDUCES):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    (out / "worker.json").write_text(json.dumps({
        "gemm_calls": GEMMS, "gemm_seconds": seconds, "burst_unix": [started, finished],
        "flops_per_call": 2 * N**3, "allreduces": ALLREDUCES, "pid": os.getpid(),
    }))
    time.sleep(4)  # let agentd publish the last intervals


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def driver(out: pathlib.Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    port, metrics = _free_port(), _free_port()
    with open(out / "agentd.log", "w") as log:
        agent = subprocess.Popen([*AGENTD, "--port", str(port), "--metrics-port", str(metrics), "--interval-ms", "500",
                                  "--trace-dir", str(out / "traces")], env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(3)
        record = subprocess.Popen([*TUIPROF, "record", str(out / "snapshots.ndjson"), f"127.0.0.1:{port}",
                                   "--duration", "40"], env=env)
        job = subprocess.run([*TUIPROF, "run", "--agent-port", str(port), "--", sys.executable, __file__,
                              "--worker", "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
        (out / "worker.log").write_text(job.stdout + job.stderr)
        record.terminate()
        record.wait(timeout=30)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    report = compare(out, job.returncode)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


def compare(out: pathlib.Path, exit_code: int) -> dict:
    """Each published interval against the program's own events for the calls that ended in it.

    The GEMMs run back to back, so the program's call i ends at the burst's end minus the
    event times of the calls after it; an interval (``timestamp - interval_seconds``,
    ``timestamp``] is compared with the calls that ended inside it. The first call (module
    loading) is the hook's ``first_call_seconds``, outside the rates, so it is left out here too.
    """
    own = json.loads((out / "worker.json").read_text())
    seconds = own["gemm_seconds"]
    ends, at = [], own["burst_unix"][1]
    for duration in reversed(seconds):
        ends.append(at)
        at -= duration
    ends.reverse()
    intervals, last = [], None
    for line in (out / "snapshots.ndjson").read_text().splitlines():
        event = json.loads(line)
        if event["event"] != "snapshot":
            continue
        taken = int(event["snapshot"]["timestamp_unix_ns"]) / 1e9
        for rank in event["snapshot"].get("ranks", []):
            if rank["pid"] != own["pid"]:
                continue
            last = rank
            for op in rank.get("gemm", []):
                if op["dtype"] != "bf16" or "tflops" not in op:
                    continue
                since = taken - rank["interval_seconds"]
                mine = [t for i, (t, end) in enumerate(zip(seconds, ends, strict=True))
                        if i > 0 and since < end <= taken]
                if not mine:
                    continue
                program_tflops = own["flops_per_call"] * len(mine) / sum(mine) / 1e12
                latency = op["latency"]
                intervals.append({
                    "calls_program": len(mine), "tflops_ours": op["tflops"], "tflops_program": program_tflops,
                    "tflops_diff_percent": 100 * (op["tflops"] - program_tflops) / program_tflops,
                    "max_ours": latency.get("max_seconds"), "max_exact": latency.get("max_exact", False),
                    "max_program": max(mine), "min_ours": latency.get("min_seconds"),
                    "min_exact": latency.get("min_exact", False), "min_program": min(mine),
                })
    assert last is not None, "agentd never reported the worker"
    gemm = [op for op in last.get("gemm", []) if op["dtype"] == "bf16"]
    nccl = [op for op in last.get("nccl", []) if op["op"] == "AllReduce"]
    return {
        "worker_exit_code": exit_code,
        "gemm_count": {"ours": sum(int(op["count_total"]) for op in gemm), "program": own["gemm_calls"]},
        "allreduce_count": {"ours": sum(int(op["count_total"]) for op in nccl), "program": own["allreduces"]},
        "first_call_seconds": {"ours": gemm[0].get("first_call_seconds") if gemm else None,
                               "program": seconds[0]},
        "intervals": intervals,
        "hook": last.get("hook", {}),
        "nccl_unavailable": last.get("unavailable", {}).get("nccl"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    worker(args.out) if args.worker else driver(args.out)


if __name__ == "__main__":
    main()
