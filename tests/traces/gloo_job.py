"""A real two-rank PyTorch CPU job (gloo) profiled with torch.profiler: one capture for the diff tests.

    python gloo_job.py OUT_DIR SLOW_RANK DELAY_SECONDS PORT

Each rank runs 5 steps of a matmul and an all_reduce under a profiler schedule
(1 warm-up step, 4 recorded: ProfilerStep#1–#4) and writes its Kineto trace to
OUT_DIR/rank<R>.json. Rank SLOW_RANK sleeps DELAY_SECONDS before each all_reduce,
so the other rank waits inside gloo's all_reduce for it.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 5


def rank_main(rank: int, out: str, slow_rank: int, delay: float, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    weights, gradients = torch.randn(128, 128), torch.ones(1 << 18)
    path = str(pathlib.Path(out) / f"rank{rank}.json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=STEPS - 1, repeat=1),
                                on_trace_ready=lambda profiler: profiler.export_chrome_trace(path)) as profiler:
        for _ in range(STEPS):
            weights @ weights
            if rank == slow_rank:
                time.sleep(delay)
            dist.all_reduce(gradients)
            profiler.step()
    dist.destroy_process_group()
    # The trace is written. PyTorch's own C++ teardown at exit sometimes aborts ("terminate called
    # without an active exception", under load), which fails the job after its work is done:
    # leave without running it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    out_dir, slow, seconds, master_port = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    mp.spawn(rank_main, args=(out_dir, slow, seconds, master_port), nprocs=2)
