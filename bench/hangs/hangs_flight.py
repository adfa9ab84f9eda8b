"""Cost of the startup hook's Flight Recorder publisher, on a real gloo process group.

Run: .venv/bin/python bench/hangs/hangs_flight.py

One process, world size 1, gloo. After 3000 all_reduces (the recorder's ring holds its default
2000 entries) it times, in this process:
  poll, counters moving      FlightPublisher.poll() while collectives keep completing (what
                             every rank pays every 0.5 s: one counter dump, one small file write)
  poll, counters unchanged   the steady case between steps (a counter dump, no write)
  entries dump (stalled)     the full dump the publisher makes once when a collective stalls
                             for ENTRIES_AFTER_S
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tuiprof_native" / "startup"))
import tuiprof_flight  # noqa: E402
import tuiprof_startup  # noqa: E402


def timed(fn, repeat: int) -> str:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e6)
    return f"median {statistics.median(times):8.1f} us  min {min(times):8.1f}  max {max(times):8.1f}  ({repeat}x)"


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29655")
    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(16)
    for _ in range(3000):
        dist.all_reduce(tensor)
    dump = torch._C._distributed_c10d._dump_fr_trace_json
    with tempfile.TemporaryDirectory(dir="/dev/shm") as directory:  # where ranks write it
        measure(dump, tensor, tuiprof_flight.FlightPublisher(dump, os.path.join(directory, "tuiprof-0-1.flight"),
                                                             tuiprof_startup._write_whole))
    dist.destroy_process_group()


def measure(dump, tensor: torch.Tensor, publisher: tuiprof_flight.FlightPublisher) -> None:
    def moving() -> None:
        dist.all_reduce(tensor)  # so that the counters move; its own cost is the line above this one's
        publisher.poll()

    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, entries in the ring: "
          f"{len(json.loads(dump(True, False))['entries'])}")
    print(f"all_reduce alone (world 1)    {timed(lambda: dist.all_reduce(tensor), 200)}")
    print(f"poll, counters moving (+ all_reduce) {timed(moving, 200)}")
    print(f"poll, counters unchanged      {timed(publisher.poll, 200)}")
    print(f"entries dump (stalled case)   {timed(lambda: dump(True, True), 20)}")


if __name__ == "__main__":
    main()
