"""What timing named Python functions costs (tuiprof_native/startup/tuiprof_functions.py).

Three figures, each from child processes with the startup hook on PYTHONPATH (no hook library: the
timing itself, not the publishing thread, which wakes once a second):

1. per call: an empty function called 1,000,000 times, timed and not, on this Python (3.11: the
   attribute wrapper) and on a Python >= 3.12 if one runs here (sys.monitoring);
2. per step: a small CPU training loop (Linear 256x256, a DataLoader of batch 32, SGD), with xpu-timer's
   built-in list and the entry file's step function timed, against nothing timed;
3. at start, 3.11 only: importing torch while the entry file is traced until its named function is
   defined, against no entry-file name.

With ``--device cuda`` (the GPU machine) the per-step figure comes from a GPU training loop instead
(Linear 4096x4096 x2 in bf16, batch 256, AdamW, a ``torch.cuda.synchronize()`` a step, which is on the
built-in list), and REPEATS runs each way of 300 steps.

Run from the repository root: ``.venv/bin/python bench/native/function_timing_cost.py [--device cuda]
[--out FILE]``; the report goes to stdout and to FILE (bench/.work/function_timing_cost.json).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
STARTUP = ROOT / "tuiprof_native" / "startup"
OUT = ROOT / "bench" / ".work" / "function_timing_cost.json"
REPEATS = 5

PER_CALL = """
import time
def f():
    pass
n = 1_000_000
start = time.perf_counter_ns()
for _ in range(n):
    f()
print((time.perf_counter_ns() - start) / n)
"""

# A training script is its set-up (model, optimizer, ``data``, ``train_step``) and then this: a warm-up
# epoch, then three timed ones; it prints the mean step in ns.
TIMED_EPOCHS = """
for x, y in data:  # warm-up epoch
    train_step(x, y)
steps, start = 0, time.perf_counter_ns()
for epoch in range(3):
    for x, y in data:
        train_step(x, y)
        steps += 1
print((time.perf_counter_ns() - start) / steps)
"""

TRAINING = """
import time, torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(3200, 256), torch.randn(3200, 256)), batch_size=32)
def train_step(x, y):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
""" + TIMED_EPOCHS

TRAINING_GPU = """
import time, torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)).cuda().bfloat16()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = DataLoader(TensorDataset(torch.randn(256 * 100, 4096), torch.randn(256 * 100, 4096)), batch_size=256)
def train_step(x, y):
    opt.zero_grad()
    out = model(x.cuda(non_blocking=True).bfloat16())
    torch.nn.functional.mse_loss(out.float(), y.cuda(non_blocking=True)).backward()
    opt.step()
    torch.cuda.synchronize()
""" + TIMED_EPOCHS

IMPORT = """
import time
start = time.perf_counter_ns()
import torch
def step():
    pass
print((time.perf_counter_ns() - start) / 1e6)
"""


def run(python: str, script: str, names: str | None, defaults: bool = False) -> float:
    env = {**os.environ, "PYTHONPATH": str(STARTUP), "TUIPROF_TIME_FUNCTIONS_DEFAULTS": "1" if defaults else "0",
           "OMP_NUM_THREADS": "1"}
    env.pop("TUIPROF_HOOK_LIBRARY", None)
    env.pop("XPU_TIMER_HOST_TRACING_FUNC", None)
    env.pop("TUIPROF_TIME_FUNCTIONS", None)
    if names:
        env["TUIPROF_TIME_FUNCTIONS"] = names
    done = subprocess.run([python, "-c", script], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def paired(python: str, script: str, timed: tuple[str | None, bool]) -> tuple[float, float]:
    """Median of REPEATS runs each way, interleaved (the machine's load shifts both alike)."""
    plain, with_timing = [], []
    for _ in range(REPEATS):
        plain.append(run(python, script, None))
        with_timing.append(run(python, script, *timed))
    return statistics.median(plain), statistics.median(with_timing)


def python312() -> str | None:
    for candidate in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python"))):
        if subprocess.run([candidate, "-c", "import sys; assert sys.version_info >= (3, 12)"]).returncode == 0:
            return candidate
    return None


def mechanism() -> str:
    return "sys.monitoring" if sys.version_info >= (3, 12) else "wrapper"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the training step runs")
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help="the JSON report")
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    plain, timed = paired(sys.executable, PER_CALL, ("__main__@f", False))
    figures[f"per call, Python {sys.version.split()[0]} ({mechanism()}), ns"] = {"plain": plain, "timed": timed}
    newer = None if sys.version_info >= (3, 12) else python312()
    if newer:
        version = subprocess.run([newer, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                 text=True).stdout.strip()
        plain, timed = paired(newer, PER_CALL, ("__main__@f", False))
        figures[f"per call, Python {version} (sys.monitoring), ns"] = {"plain": plain, "timed": timed}
    training = TRAINING_GPU if args.device == "cuda" else TRAINING
    plain, timed = paired(sys.executable, training, ("__main__@train_step", True))
    figures[f"per training step on {args.device} (built-in list + train_step), ns"] = {"plain": plain, "timed": timed}
    if sys.version_info < (3, 12):
        plain, timed = paired(sys.executable, IMPORT, ("__main__@step", False))
        figures["import torch with an entry-file name (3.11 tracer), ms"] = {"plain": plain, "timed": timed}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    print(f"| what (median of {REPEATS}) | not timed | timed | difference |\n|---|---|---|---|")
    for what, pair in figures.items():
        print(f"| {what} | {pair['plain']:.1f} | {pair['timed']:.1f} | {pair['timed'] - pair['plain']:+.1f} |")


if __name__ == "__main__":
    main()
