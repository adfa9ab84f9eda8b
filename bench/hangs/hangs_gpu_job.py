"""A 2-rank NCCL data-parallel job that hangs on purpose (for bench/hangs/hangs_gpu.py).

Every rank trains a small model on its GPU: forward, backward, all_reduce of
every gradient, optimizer.step(), and reads the loss (a CUDA sync) each step.
At step --skip-at, rank --skip-rank writes the wall-clock time to
<--marker-dir>/skipped and, instead of its all_reduce calls, sleeps in
``skip_allreduce_and_sleep``; the other ranks launch the all_reduce and block
in the next CUDA sync. With --crash it raises from ``load_batch`` instead (torchrun
then stops the other ranks). Run under torchrun.
"""

import argparse
import datetime
import os
import pathlib
import time

import torch
import torch.distributed as dist


def skip_allreduce_and_sleep() -> None:
    time.sleep(3600)


def load_batch() -> None:
    raise RuntimeError("corrupt shard in load_batch")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-rank", type=int, default=1)
    parser.add_argument("--skip-at", type=int, default=30)
    parser.add_argument("--marker-dir", type=pathlib.Path, required=True)
    parser.add_argument("--crash", action="store_true", help="the skipping rank raises instead of sleeping")
    args = parser.parse_args()
    timeout = datetime.timedelta(minutes=15)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(1_000_000):
        optimizer.zero_grad()
        loss = model(torch.randn(256, 1024, device=device)).pow(2).mean()
        loss.backward()
        if step == args.skip_at and rank == args.skip_rank:
            (args.marker_dir / "skipped").write_text(str(time.time_ns()))
            load_batch() if args.crash else skip_allreduce_and_sleep()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
        loss.item()
        if rank == 0 and step == 0:
            print("training", flush=True)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
