"""What `tuiprof run` costs a 4-GPU DDP transformer, part by part, and what agentd costs meanwhile.

Run on the GPU machine from the repository root, after building the package in place
(bench/gpu/overhead_4gpu.sh does both):
    python3 bench/gpu/overhead_4gpu.py --out DIR [--seconds 420] [--ranks 4]

Five long-lived jobs, each `torchrun --nproc-per-node RANKS` of the same DDP transformer, stay up
side by side on the same GPUs and take turns, so no job start, allocator state or GPU clock history
is compared with another's:
  plain, plain_b    no tuiprof (plain_b measures the noise: plain against plain);
  tuiprof           `tuiprof run` at its defaults (preload hook, NCCL profiler plugin,
                    KINETO_USE_DAEMON polling, the startup hook timing the default functions);
  no_plugin         the same with NCCL_PROFILER_PLUGIN=none (the hook counts collectives at NCCL's API);
  no_kineto         the same with --no-kineto-daemon.
A round gives every job one chunk of CHUNK_STEPS steps, in an order that reverses every round
(ABCDE EDCBA ...). A chunk is timed by the job's own step timer: all ranks meet, then the wall time of
the steps to a `torch.cuda.synchronize()` on every rank, the slowest rank's time. Per round, each job's
chunk against plain's: the mean of those differences and its 95 % bootstrap interval over the rounds.

agentd runs throughout at its defaults (`--interval-ms 1000`, real collectors, the root agent that
serves the jobs' Kineto folders). Over the measured rounds: its CPU (/proc/PID/stat), each collector's
CPU (`tuiprof_collector_cpu_seconds_total`), its NVML calls per second
(`tuiprof_agent_nvml_calls_total`), and at the end VmRSS, VmHWM and Pss: issue 29 item 4's load (c).

`job` as the first argument is one rank of a job (started by torchrun); `cli` runs `tuiprof run`
without the console's modules (no Textual on the GPU machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "agent"))

import agentd_cpu_gpu as agent_cost  # noqa: E402  (agentd's CPU, memory and NVML calls, read as that bench reads them)

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CHUNK_STEPS = 80
WARMUP_CHUNKS = 2
VARIANTS = {  # name: (options of `tuiprof run`, or None for a plain job; extra environment)
    "plain": (None, {}),
    "tuiprof": ([], {}),
    "no_plugin": ([], {"NCCL_PROFILER_PLUGIN": "none"}),
    "no_kineto": (["--no-kineto-daemon"], {}),
    "disabled": ([], {"TUIPROF_DISABLE": "1"}),  # the hook loaded but inert: no segment, nothing timed
    "sample_64": (["--gemm-sample-every", "64"], {}),  # a GEMM shape's first 32 calls timed, then one in 64
    "sample_256": (["--gemm-sample-every", "256"], {}),
    "sample_rare": (["--gemm-sample-every", "1000000"], {}),  # a GEMM shape's first 32 calls timed, then next to none
    "no_functions": (["--no-default-functions"], {}),
    # PyTorch's Flight Recorder off (TORCH_FR_BUFFER_SIZE=0): the startup hook's publisher then reads nothing
    "plain_fr_off": (None, {"TORCH_FR_BUFFER_SIZE": "0"}),
    "tuiprof_fr_off": ([], {"TORCH_FR_BUFFER_SIZE": "0"}),
    "plain_b": (None, {}),
}
DEFAULT_VARIANTS = "plain,tuiprof,no_plugin,no_kineto,plain_b"


# ---- one rank of a job -------------------------------------------------------------------------

def job(args: argparse.Namespace) -> None:
    """Train until told to stop; run a chunk of steps each time the turn file names a new chunk."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    backend = "gloo" if args.cpu else "nccl"
    dist.init_process_group(backend)
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu" if args.cpu else f"cuda:{local}")
    if not args.cpu:
        torch.cuda.set_device(device)
    dtype = torch.float32 if args.cpu else torch.bfloat16
    layer = lambda: torch.nn.TransformerEncoderLayer(args.width, args.heads, 4 * args.width, dropout=0.0,  # noqa: E731
                                                     batch_first=True)
    model = DistributedDataParallel(torch.nn.Sequential(*[layer() for _ in range(args.layers)]).to(device, dtype),
                                    device_ids=None if args.cpu else [local])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(args.batch, args.seq, args.width, device=device, dtype=dtype)
    sync = (lambda: None) if args.cpu else torch.cuda.synchronize
    flag = torch.zeros(1, device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        optimizer.step()

    turn_file, done = args.control / "turn", args.control / "done"
    seen = -1
    while True:
        try:
            text = turn_file.read_text()
        except OSError:
            text = ""
        if text == "stop":
            break
        wanted = int(text) if text.isdigit() else seen
        if wanted == seen:
            time.sleep(0.002)
            continue
        seen = wanted
        dist.all_reduce(flag)  # every rank has seen the turn
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        took = torch.tensor([time.perf_counter() - start], device=device, dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if rank == 0:
            tmp = done.with_suffix(".tmp")
            tmp.write_text(f"{wanted} {took.item():.6f}")
            tmp.replace(done)
    dist.destroy_process_group()


# ---- the driver ----------------------------------------------------------------------------------

def cli(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from tuiprof_headless import main

    return main(argv)


class Job:
    def __init__(self, name: str, work: pathlib.Path, args: argparse.Namespace, env: dict[str, str]) -> None:
        options, extra = VARIANTS[name]
        self.name, self.control = name, work / name
        self.control.mkdir()
        (self.control / "turn").write_text("")
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks),
                    __file__, "job", "--control", str(self.control), "--steps", str(args.steps), *args.job_args]
        command = torchrun if options is None else [sys.executable, __file__, "cli", "run", "--agent-port",
                                                    str(args.agent_port), *options, "--", *torchrun]
        with open(args.out / f"{name}.log", "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**env, **extra},
                                            start_new_session=True)
        self.chunks = 0

    def chunk(self, timeout: float) -> float:
        """One chunk; its seconds by the job's own timer."""
        number = self.chunks
        self.chunks += 1
        turn = self.control / "turn"
        tmp = turn.with_suffix(".tmp")
        tmp.write_text(str(number))
        tmp.replace(turn)
        done = self.control / "done"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"job {self.name} ended with {self.process.returncode}")
            with contextlib.suppress(OSError, ValueError):
                seen, seconds = done.read_text().split()
                if int(seen) == number:
                    return float(seconds)
            time.sleep(0.001)
        raise RuntimeError(f"job {self.name}: chunk {number} took over {timeout} s")

    def stop(self) -> None:
        (self.control / "turn").write_text("stop")
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()


def interval(diffs: list[float]) -> dict:
    rng = random.Random(29)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(20000))
    return {"mean_percent": round(statistics.fmean(diffs), 3), "median_percent": round(statistics.median(diffs), 3),
            "ci95_percent": [round(means[500], 3), round(means[19499], 3)], "rounds": len(diffs)}


def agent_figures(pid: int, metrics_port: int, since: dict) -> dict:
    elapsed = time.monotonic() - since["at"]
    _, collector_cpu = agent_cost.scrape(metrics_port)
    return {"cpu_percent_of_a_core": round(100 * (agent_cost.cpu_seconds(pid) - since["cpu"]) / elapsed, 3),
            "collector_cpu_percent": {n: round(100 * (v - since["collectors"].get(n, 0.0)) / elapsed, 3)
                                      for n, v in collector_cpu.items()},
            "nvml_calls_per_s": {f: round((n - since["nvml"].get(f, 0.0)) / elapsed, 3)
                                 for f, n in agent_cost.nvml_calls(metrics_port).items()},
            "memory_kib": agent_cost.memory_kib(pid), "seconds": round(elapsed, 1)}


def agent_start(pid: int, metrics_port: int) -> dict:
    return {"at": time.monotonic(), "cpu": agent_cost.cpu_seconds(pid), "collectors": agent_cost.scrape(metrics_port)[1],
            "nvml": agent_cost.nvml_calls(metrics_port)}


def drive(args: argparse.Namespace) -> dict:
    work = pathlib.Path(tempfile.mkdtemp(prefix="overhead-4gpu-"))
    env = {**os.environ, **NO_MULTICAST,
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    port, metrics_port = agent_cost.free_port(), agent_cost.free_port()
    with open(args.out / "agentd.log", "wb") as log:
        agent = subprocess.Popen([sys.executable, "-m", "agentd.cli", "--port", str(port), "--metrics-port",
                                  str(metrics_port), "--interval-ms", "1000"], stderr=log, env=env)
    args.agent_port = port
    time.sleep(5)
    jobs = [Job(name, work, args, env) for name in args.variants]
    result: dict = {"chunk_steps": args.steps, "ranks": args.ranks, "job_args": args.job_args, "rounds": []}
    try:
        for j in jobs:  # warm up one at a time: first chunks carry NCCL set-up, cuBLAS heuristics, the allocator
            result.setdefault("warmup_ms", {})[j.name] = [round(1e3 * j.chunk(600), 1) for _ in range(WARMUP_CHUNKS)]
        print("warm-up", json.dumps(result["warmup_ms"]), flush=True)
        since = agent_start(agent.pid, metrics_port)
        started, order = time.monotonic(), list(jobs)
        while time.monotonic() - started < args.seconds:
            chunk = {j.name: round(1e3 * j.chunk(120), 3) for j in order}
            result["rounds"].append(chunk)
            order.reverse()
        result["agentd"] = agent_figures(agent.pid, metrics_port, since)
        result["agentd"]["rss_kib_by_mapping"] = agent_cost.rss_by_mapping(agent.pid)
    finally:
        for j in jobs:
            j.stop()
        agent.terminate()
        agent.wait(30)
    rounds = result["rounds"]
    result["step_ms_median"] = {name: round(statistics.median(r[name] for r in rounds) / args.steps, 3)
                                for name in args.variants}
    result["against_plain"] = {name: interval([100 * (r[name] - r["plain"]) / r["plain"] for r in rounds])
                               for name in args.variants if name != "plain"}
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--seconds", type=float, default=420, help="measured rounds stop once this has passed")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=CHUNK_STEPS, help="steps a chunk")
    parser.add_argument("--variants", type=lambda text: text.split(","), default=DEFAULT_VARIANTS.split(","),
                        help=f"jobs, from {', '.join(VARIANTS)} (plain first; default {DEFAULT_VARIANTS})")
    parser.add_argument("job_args", nargs="*", help="passed to each rank (e.g. --cpu --width 64 --seq 16)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = drive(args)
    (args.out / "overhead_4gpu.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))


def job_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=CHUNK_STEPS)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--cpu", action="store_true")
    job(parser.parse_args(argv))


if __name__ == "__main__":
    if sys.argv[1:2] == ["cli"]:
        sys.exit(cli(sys.argv[2:]))
    if sys.argv[1:2] == ["job"]:
        job_main(sys.argv[2:])
    else:
        main()
