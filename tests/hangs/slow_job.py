"""A data-parallel job on the gloo backend (DDP) that one rank can slow down on purpose.

Every rank trains the same small model on batches from a DataLoader (no workers: the
wait is the training process's own), each pinned to its own CPU. After --after steps,
rank --slow-rank does one of:
  --fault dataloader   its dataset takes --fault-ms longer per batch;
  --fault gc           it makes cyclic garbage and collects it, --fault-ms of pauses a step;
  --fault none         nothing (the faults from outside: busy processes, SIGSTOP).
The job's own step timer: each rank appends "<unix time> <step seconds>" lines to
--step-log-<rank>, so a test can compare the verdict's cost with what the job measured.
Run under torchrun (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment).
"""

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class Batches(torch.utils.data.Dataset):
    def __init__(self, delay_s: list[float]) -> None:
        self.delay_s = delay_s  # [seconds]: changed by the training loop when the fault starts

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay_s[0]:
            time.sleep(self.delay_s[0])
        return torch.randn(64)


def garbage_storm(pause_s: float) -> None:
    """Collect cycles of garbage until about ``pause_s`` went into collections."""
    spent = 0.0
    while spent < pause_s:
        cycles = []
        for _ in range(20000):
            a, b = [], []
            a.append(b)
            b.append(a)
            cycles.append(a)
        del cycles
        start = time.perf_counter()
        gc.collect()
        spent += time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--fault", choices=("none", "dataloader", "gc"), default="none")
    parser.add_argument("--fault-ms", type=float, default=40.0)
    parser.add_argument("--after", type=int, default=40)
    parser.add_argument("--step-log", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    delay = [0.0]
    loader = iter(torch.utils.data.DataLoader(Batches(delay), batch_size=1, num_workers=0))
    slow = rank == args.slow_rank
    with open(f"{args.step_log}-{rank}", "w", buffering=1) as log:
        last = time.time()
        for step in range(1_000_000):
            if slow and step == args.after and args.fault == "dataloader":
                delay[0] = args.fault_ms / 1000
            x = next(loader)
            if slow and step >= args.after and args.fault == "gc":
                garbage_storm(args.fault_ms / 1000)
            optimizer.zero_grad()
            model(x.repeat(32, 1)).pow(2).mean().backward()
            optimizer.step()
            time.sleep(0.01)  # the rest of a step (logging, checkpoints): leaves the 2 CPUs some room
            now = time.time()
            log.write(f"{now:.6f} {now - last:.6f}\n")
            last = now
            if rank == 0 and step == 0:
                print("training", flush=True)


if __name__ == "__main__":
    main()
