"""A small CPU training loop for the trace tests (run as a script, with KINETO_USE_DAEMON set).

--world 2 joins a gloo process group (env RANK, MASTER_ADDR, MASTER_PORT) and
all-reduces every step, so the ranks' traces share collectives. The rank named
by env TRAINER_SLOW_RANK sleeps 200 ms before each all-reduce: the others wait for it.
"""

import argparse
import os
import sys
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=60.0)
parser.add_argument("--world", type=int, default=1)
args = parser.parse_args()

if args.world > 1:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=args.world)

model = torch.nn.Linear(128, 128)
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
x = torch.randn(64, 128)
print("ready", flush=True)
deadline = time.monotonic() + args.seconds
while time.monotonic() < deadline:
    torch.mm(x, model.weight)
    loss = model(x).square().mean()
    loss.backward()
    if args.world > 1:
        if os.environ.get("TRAINER_SLOW_RANK") == os.environ["RANK"]:
            time.sleep(0.2)
        for p in model.parameters():
            dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(0.02)
sys.exit(0)
