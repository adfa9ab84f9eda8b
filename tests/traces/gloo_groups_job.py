"""A real four-rank PyTorch CPU job (gloo) with two families of process groups, profiled with torch.profiler.

    python gloo_groups_job.py OUT_DIR PORT

Besides the world, the ranks make the pairs [0, 1] and [2, 3] (a tensor-parallel
group in a tp2-dp2 layout), then [0, 2] and [1, 3] (its data-parallel groups).
Each step does a matmul and one all_reduce on each of the rank's three groups
under a profiler schedule (1 warm-up step, 2 recorded) with input shapes, and
each rank writes its Kineto trace to OUT_DIR/rank<R>.json.
"""

from __future__ import annotations

import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
STEPS = 3


def rank_main(rank: int, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group, in one order
    columns = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    pair, column = pairs[rank // 2], columns[rank % 2]
    weights, gradients = torch.randn(64, 64), torch.ones(1 << 12)
    path = str(pathlib.Path(out) / f"rank{rank}.json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=STEPS - 1, repeat=1),
                                on_trace_ready=lambda profiler: profiler.export_chrome_trace(path)) as profiler:
        for _ in range(STEPS):
            weights @ weights
            dist.all_reduce(gradients, group=pair)
            dist.all_reduce(gradients, group=column)
            dist.all_reduce(gradients)
            profiler.step()
    dist.destroy_process_group()
    # As gloo_job.py: leave without PyTorch's C++ teardown, which sometimes aborts after the work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], int(sys.argv[2])), nprocs=WORLD)
