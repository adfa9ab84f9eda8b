"""The trace summary's step time against the job's own CUDA-event step timer, on one GPU.

A loop of bf16 matmuls and optimizer steps that synchronises the GPU only every
``--sync-every`` steps (the CPU otherwise runs ahead, launching several steps
before the GPU finishes the first: what issue 29 item 5 measured on 4 H200s).
Each step records a CUDA event on the stream before its first kernel: the
elapsed time between consecutive events is the step as the GPU ran it, measured
by the program itself, not by tuiprof.

Two traces of the same loop: ``scheduled`` (``torch.profiler`` with a schedule and
``prof.step()``: ProfilerStep# annotations) and ``on_demand`` (a plain profile of
the same steps without ``prof.step()``: only Optimizer.step# annotations, as an
on-demand Kineto capture through agentd has). Writes, into ``--out``:
``scheduled.json.gz``, ``on_demand.json.gz`` and ``timer.json`` (each trace's steps'
CUDA-event gaps, in µs). Run on the GPU machine:

    python3 bench/traces/traces_step_time_gpu.py --out $OUT

then, here: ``python3 bench/traces/traces_step_time.py DIR`` compares the summaries with the timer.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import shutil
import statistics
from itertools import pairwise

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--out", type=pathlib.Path, required=True)
parser.add_argument("--width", type=int, default=8192)
parser.add_argument("--layers", type=int, default=12)
parser.add_argument("--sync-every", type=int, default=10)
parser.add_argument("--steps", type=int, default=30, help="steps traced (after warm-up)")
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width, bias=False)
                              for _ in range(args.layers)]).cuda().to(torch.bfloat16)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
x = torch.randn(4096, args.width, device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.current_stream()


def step(number: int, marks: list[torch.cuda.Event]) -> None:
    mark = torch.cuda.Event(enable_timing=True)
    mark.record(stream)  # before the step's first kernel: the GPU reaches it when the step starts there
    marks.append(mark)
    loss = model(x).float().square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if (number + 1) % args.sync_every == 0:
        torch.cuda.synchronize()


def gaps_us(marks: list[torch.cuda.Event]) -> list[float]:
    torch.cuda.synchronize()
    return [1000.0 * a.elapsed_time(b) for a, b in pairwise(marks)]


def traced(name: str, scheduled: bool) -> list[float]:
    """Run warm-up + traced steps; the trace goes to --out/NAME.json.gz; returns the traced steps' gaps."""
    marks: list[torch.cuda.Event] = []
    warmup = 2 * args.sync_every
    for number in range(warmup):
        step(number, [])
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    path = args.out / f"{name}.json"
    if scheduled:
        schedule = torch.profiler.schedule(wait=0, warmup=1, active=args.steps, repeat=1)
        with torch.profiler.profile(activities=activities, schedule=schedule,
                                    on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
            step(warmup, [])
            prof.step()
            for number in range(warmup + 1, warmup + 1 + args.steps):
                step(number, marks)
                prof.step()
    else:
        with torch.profiler.profile(activities=activities) as prof:
            for number in range(warmup, warmup + args.steps):
                step(number, marks)
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
    with open(path, "rb") as plain, gzip.open(args.out / f"{name}.json.gz", "wb") as packed:
        shutil.copyfileobj(plain, packed)
    path.unlink()
    return gaps_us(marks)


args.out.mkdir(parents=True, exist_ok=True)
timer = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "sync_every": args.sync_every,
         "scheduled": traced("scheduled", True), "on_demand": traced("on_demand", False)}
(args.out / "timer.json").write_text(json.dumps(timer, indent=1))
for name in ("scheduled", "on_demand"):
    print(f"{name}: CUDA-event step gap median {statistics.median(timer[name]):.1f} µs, "
          f"mean {statistics.mean(timer[name]):.1f} µs over {len(timer[name])} gaps")
