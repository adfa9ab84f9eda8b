"""Cost of the per-rank CPU counters (RankStats.pmu) per interval.

Starts RANKS real PyTorch CPU processes under `tuiprof run` (each imports torch,
runs a matmul so its intra-op thread pool exists, records one step so it has a
segment), then times, per rank and interval:
  - ``Counters.stats()``: the agent's read of the rank's perf_event groups
    (one read() per group; one group per thread that existed at discovery);
  - the same quantities from /proc with psutil (cpu_times + num_ctx_switches),
    the usual way to get them without perf_event;
  - a whole ``RanksCollector.collect()`` (segments + counters), for scale.

    .venv/bin/python bench/native/native_rank_pmu.py [--ranks 2] [--torch-threads 16] [--samples 200]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

import psutil

from agentd.collectors import pmu
from agentd.collectors.ranks import RanksCollector

RANK = ("import ctypes, os, sys, torch; torch.set_num_threads(int(sys.argv[1])); "
        "torch.ones(512, 512) @ torch.ones(512, 512); "
        "ctypes.CDLL(os.environ['TUIPROF_HOOK_LIBRARY']).tuiprof_record_step(); "
        "print('ready', flush=True); sys.stdin.readline()")


def median_us(call, samples: int) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--torch-threads", type=int, default=16, help="intra-op threads per rank")
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    procs = [subprocess.Popen([sys.executable, "-m", "tuiprof.cli", "run", "--no-kineto-daemon", "--",
                               sys.executable, "-c", RANK, str(args.torch_threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(args.ranks)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        pids = [proc.pid for proc in procs]
        counters = [pmu.process_counters(pid) for pid in pids]
        processes = [psutil.Process(pid) for pid in pids]
        threads = [len(os.listdir(f"/proc/{pid}/task")) for pid in pids]
        fds = sum(len(c.software.groups) * len(c.software.events) for c in counters)

        def perf_read() -> None:
            for c in counters:
                c.stats()

        def proc_read() -> None:
            for p in processes:
                p.cpu_times()
                p.num_ctx_switches()

        perf_us = median_us(perf_read, args.samples)
        proc_us = median_us(proc_read, args.samples)
        for c in counters:
            c.close()
        collector = RanksCollector(1.0)
        try:
            collector.collect()
            collect_us = median_us(collector.collect, args.samples)
        finally:
            collector.close()
        print(f"ranks={args.ranks} threads_per_rank={threads} software_fds={fds} "
              f"hardware={'yes' if not counters[0].hardware_reason else 'no: ' + counters[0].hardware_reason}")
        print(f"per rank per interval: perf_event stats() {perf_us / args.ranks:.1f} us | "
              f"psutil /proc cpu_times+ctx_switches {proc_us / args.ranks:.1f} us")
        print(f"whole RanksCollector.collect() for {args.ranks} ranks (with counters): {collect_us:.1f} us")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
            for path in pathlib.Path("/dev/shm").glob(f"tuiprof-{os.getuid()}-{proc.pid}-*"):  # segment, side files
                path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
