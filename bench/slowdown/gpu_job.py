"""The training job of bench/slowdown/gpu_faults.py: DDP over NCCL, one GPU per rank, slowed on request.

Each rank trains a stack of bf16 Linear layers (one DDP bucket each, so several all-reduces a
step) on batches from a DataLoader without workers, pinned to CPUS_PER_RANK cores of its own.
Every step it reads the control file (JSON, written whole by the driver): ``{"rank": R,
"fault": "dataloader" | "gc", "ms": M}`` slows rank R's batches by M ms or makes it collect
M ms of cyclic garbage a step; anything else (or no file) is healthy. The job's own step
timer: each rank appends "<unix time> <step seconds>" per step to ``--step-log-<rank>``,
timed on the host after ``torch.cuda.synchronize()`` at the step's end (as a training
loop that logs its step time does). ``--cpu`` runs the same on gloo without a GPU (to try
the driver on a machine without one).
"""

import argparse
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "hangs"))
from slow_job import garbage_storm  # noqa: E402  (the CPU tests' job: one GC storm for both)

CPUS_PER_RANK = 4


class Batches(torch.utils.data.Dataset):
    def __init__(self, width: int) -> None:
        self.width = width
        self.delay_s = 0.0

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.ones(self.width)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", type=pathlib.Path, required=True)
    parser.add_argument("--step-log", required=True)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo" if args.cpu else "nccl")
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[local * CPUS_PER_RANK:(local + 1) * CPUS_PER_RANK] or cores)
    device = torch.device("cpu" if args.cpu else f"cuda:{local}")
    if not args.cpu:
        torch.cuda.set_device(device)
    dtype = torch.float32 if args.cpu else torch.bfloat16
    layers = [torch.nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)]
    model = DistributedDataParallel(torch.nn.Sequential(*layers).to(device, dtype),
                                    device_ids=None if args.cpu else [local], bucket_cap_mb=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    batches = Batches(args.width)
    loader = iter(torch.utils.data.DataLoader(batches, batch_size=1, num_workers=0))
    control_mtime, fault = 0.0, {}
    with open(f"{args.step_log}-{rank}", "w", buffering=1) as log:
        last = time.time()
        for step in range(1 << 30):
            try:
                mtime = args.control.stat().st_mtime
                if mtime != control_mtime:
                    control_mtime, fault = mtime, json.loads(args.control.read_text())
            except (OSError, ValueError):
                fault = {}
            mine = fault.get("rank") == rank
            batches.delay_s = fault["ms"] / 1000 if mine and fault.get("fault") == "dataloader" else 0.0
            x = next(loader).to(device, dtype).expand(args.batch, args.width)
            if mine and fault.get("fault") == "gc":
                garbage_storm(fault["ms"] / 1000)
            optimizer.zero_grad(set_to_none=True)
            model(x).float().square().mean().backward()
            optimizer.step()
            if not args.cpu:
                torch.cuda.synchronize()
            now = time.time()
            log.write(f"{now:.6f} {now - last:.6f}\n")
            last = now
            if rank == 0 and step == 0:
                print("training", flush=True)


if __name__ == "__main__":
    main()
