"""A 4-rank data-parallel job on the gloo backend that hangs on purpose.

Every rank trains a small model: forward, backward, all_reduce of every
gradient, optimizer.step(). After --hang-after steps:
  --stuck-rank R   rank R stops joining the collectives and sleeps in
                   ``stop_joining_and_sleep``; the others block in all_reduce.
  --all-wait       every rank sleeps in ``everyone_waits_here`` (no odd rank).
Run under torchrun (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment).
"""

import argparse
import datetime
import time

import torch
import torch.distributed as dist


def stop_joining_and_sleep() -> None:
    time.sleep(3600)


def everyone_waits_here() -> None:
    time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stuck-rank", type=int)
    parser.add_argument("--all-wait", action="store_true")
    parser.add_argument("--hang-after", type=int, default=30)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1_000_000):
        if step == args.hang_after:
            if args.all_wait:
                everyone_waits_here()
            if rank == args.stuck_rank:
                stop_joining_and_sleep()
        optimizer.zero_grad()
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
        if rank == 0 and step == 0:
            print("training", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
