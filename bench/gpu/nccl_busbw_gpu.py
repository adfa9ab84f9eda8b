"""Bus bandwidth on 2 GPUs: nccl-tests against the same collectives through PyTorch under `tuiprof run`.

Two parts, run by bench/gpu/nccl_busbw_gpu.sh:
- nccl-tests (NVIDIA/nccl-tests, built there against the NCCL PyTorch ships) prints busbw per size;
  `--parse FILE` turns its output into JSON.
- `--worker` (torchrun, 2 ranks, under `tuiprof run`): for each op and size, 5 warm-up calls, then
  20 calls between two CUDA events (the nccl-tests method: events around a loop); then every call's
  kernel time as the hook recorded it (GPU timestamps from NCCL's kernel-channel events).
  `--report` puts the three figures side by side per size.

Both busbw figures use the nccl-tests factors (all-reduce 2(n-1)/n, all-gather and reduce-scatter
(n-1)/n) over the same byte counts (nccl-tests' "size": the full buffer).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import re
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the checkout, for tuiprof_native

MiB = 1 << 20
SIZES = [MiB << i for i in range(11)]  # 1 MiB .. 1 GiB
WARMUP, TIMED = 5, 20
OPS = ("AllReduce", "AllGather", "ReduceScatter")
NCCL_TESTS = {"all_reduce_perf": "AllReduce", "all_gather_perf": "AllGather", "reduce_scatter_perf": "ReduceScatter"}


def factor(op: str, world: int) -> float:
    return 2 * (world - 1) / world if op == "AllReduce" else (world - 1) / world


def worker(out: pathlib.Path) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    bf = {"device": "cuda", "dtype": torch.bfloat16}
    own = []
    for op in OPS:
        for size in SIZES:
            elements = size // 2
            if op == "AllReduce":
                t = torch.ones(elements, **bf)
                call = lambda t=t: dist.all_reduce(t)  # noqa: E731
            elif op == "AllGather":
                full, part = torch.empty(elements, **bf), torch.ones(elements // world, **bf)
                call = lambda full=full, part=part: dist.all_gather_into_tensor(full, part)  # noqa: E731
            else:
                full, part = torch.ones(elements, **bf), torch.empty(elements // world, **bf)
                call = lambda full=full, part=part: dist.reduce_scatter_tensor(part, full)  # noqa: E731
            for _ in range(WARMUP):
                call()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(TIMED):
                call()
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / TIMED
            own.append({"op": op, "bytes": size, "loop_seconds": seconds,
                        "loop_busbw": size / seconds * factor(op, world)})
    torch.cuda.synchronize()
    import time
    time.sleep(1)  # the proxy thread reports the last kernel channels
    lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
    lib.tuiprof_flush.argtypes = [ctypes.c_int]
    lib.tuiprof_segment_path.restype = ctypes.c_char_p
    lib.tuiprof_flush(10000)
    from tuiprof_native import segment

    events = [e for e in segment.Segment(lib.tuiprof_segment_path().decode()).events(kind="nccl") if e.end_ns]
    for row in own:
        mine = [e for e in events if e.op == row["op"] and e.bytes == row["bytes"]][WARMUP:]
        row["recorded"] = len(mine) + WARMUP if mine else 0
        if mine:
            kernel = statistics.mean(e.end_ns - e.start_ns for e in mine) * 1e-9
            row["kernel_seconds"] = kernel
            row["kernel_busbw"] = row["bytes"] / kernel * factor(row["op"], world)
    (out / f"torch-{rank}.json").write_text(json.dumps(own, indent=1))
    dist.destroy_process_group()


def parse_nccl_tests(text: str, op: str) -> list[dict]:
    """Rows of nccl-tests' table: size, out-of-place and in-place time (µs) and busbw (GB/s)."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 13 and fields[0].isdigit() and re.fullmatch(r"[\d.]+", fields[5]):
            rows.append({"op": op, "bytes": int(fields[0]), "oop_us": float(fields[5]),
                         "oop_busbw_gbs": float(fields[7]), "ip_us": float(fields[9]),
                         "ip_busbw_gbs": float(fields[11])})
    return rows


def report(out: pathlib.Path) -> str:
    ref = {(r["op"], r["bytes"]): r for name, op in NCCL_TESTS.items()
           for r in parse_nccl_tests((out / f"{name}.txt").read_text(), op)}
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("torch-*.json"))]
    lines = ["| op | size | nccl-tests busbw GB/s | torch loop busbw (rank 0/1) | ours, kernel-time busbw (rank 0/1) "
             "| ours vs nccl-tests | recorded |", "|---|---|---|---|---|---|---|"]
    for index, row in enumerate(ranks[0]):
        nt = ref.get((row["op"], row["bytes"]))
        # torch's all_reduce is in place; all_gather_into_tensor / reduce_scatter_tensor are out of place
        nt_bw = None if nt is None else nt["ip_busbw_gbs" if row["op"] == "AllReduce" else "oop_busbw_gbs"]
        loop = "/".join(f"{r[index]['loop_busbw'] / 1e9:.1f}" for r in ranks)
        ours = "/".join(f"{r[index]['kernel_busbw'] / 1e9:.1f}" if "kernel_busbw" in r[index] else "n/a"
                        for r in ranks)
        diffs = [100 * (r[index]["kernel_busbw"] / 1e9 - nt_bw) / nt_bw for r in ranks
                 if nt_bw and "kernel_busbw" in r[index]]
        diff = "/".join(f"{d:+.1f} %" for d in diffs) or "n/a"
        lines.append(f"| {row['op']} | {row['bytes'] // MiB} MiB | {nt_bw if nt_bw is not None else 'n/a'} | {loop} "
                     f"| {ours} | {diff} | {'/'.join(str(r[index]['recorded']) for r in ranks)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        worker(args.out)
    else:
        table = report(args.out)
        (args.out / "report.md").write_text(table + "\n")
        print(table)


if __name__ == "__main__":
    main()
