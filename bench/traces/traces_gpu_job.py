"""The 2-rank CUDA training job that bench/traces/traces_gpu.sh traces (run under torchrun).

A stack of bf16 linear layers wrapped in DDP (its gradient all-reduces overlap
the backward matmuls, so the trace has both overlapped and exposed NCCL time),
one extra explicit all-reduce per step, and optimizer.step(). Each rank writes
``<ready-dir>/ready.<rank>`` once warmed up, and runs until ``<ready-dir>/stop``
appears or ``--seconds`` pass.
"""

import argparse
import os
import pathlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--ready-dir", type=pathlib.Path, required=True)
parser.add_argument("--seconds", type=float, default=150.0)
parser.add_argument("--width", type=int, default=4096)
parser.add_argument("--layers", type=int, default=8)
args = parser.parse_args()

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
rank = dist.get_rank()

layers = [torch.nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)]
model = DistributedDataParallel(torch.nn.Sequential(*layers).cuda().to(torch.bfloat16),
                                device_ids=[local_rank], bucket_cap_mb=16)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(8192, args.width, device="cuda", dtype=torch.bfloat16)
extra = torch.randn(16 * 1024 * 1024, device="cuda", dtype=torch.bfloat16)


def step() -> None:
    loss = model(x).float().square().mean()
    loss.backward()
    dist.all_reduce(extra)  # an exposed collective after backward
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


for _ in range(5):
    step()
torch.cuda.synchronize()
args.ready_dir.mkdir(parents=True, exist_ok=True)
(args.ready_dir / f"ready.{rank}").write_text(str(os.getpid()))
print(f"rank {rank} ready (pid {os.getpid()})", flush=True)
deadline = time.monotonic() + args.seconds
steps = 0
while time.monotonic() < deadline and not (args.ready_dir / "stop").exists():
    step()
    steps += 1
    if steps % 10 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
print(f"rank {rank}: {steps} steps", flush=True)
dist.destroy_process_group()
