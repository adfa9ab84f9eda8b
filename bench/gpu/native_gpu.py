"""GPU check of libtuiprof_hook.so: accuracy and overhead on 2 GPUs (torchrun, one process per GPU).

Modes (``--mode``):
- ``accuracy`` (run under `tuiprof run`): fixed numbers of bf16 matmuls (torch.mm, F.linear with and
  without bias, torch.bmm) and fp32 matmuls, each timed by this program with its own CUDA events; then
  all-reduce of 1/16/64/256 MiB, all-gather and reduce-scatter of 64 MiB timed nccl-tests style (events
  around a loop). Rank r reads its own segment and writes accuracy-<r>.json: counts (ours vs the
  program's), TFLOPS (ours vs own), busbw (ours vs own).
- ``overhead`` (plain, under `tuiprof run`, or with TORCH_NCCL_ENABLE_TIMING=1): median step time of a
  GEMM + gradient all-reduce training step, comm/compute overlap fraction, host time per small GEMM
  launch. Writes overhead-<label>-<round>-<r>.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import time

import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout, for tuiprof_native

import torch
import torch.distributed as dist
import torch.nn.functional as F

MiB = 1 << 20


def own_gemm_times(fn, calls: int) -> list[float]:
    """Seconds of each call, from CUDA events around it on the current stream."""
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in pairs]


def own_loop_time(fn, iters: int) -> float:
    """Mean seconds per op of ``iters`` back-to-back ops (the nccl-tests method)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def read_own_segment():
    lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
    lib.tuiprof_flush.argtypes = [ctypes.c_int]
    lib.tuiprof_segment_path.restype = ctypes.c_char_p
    lib.tuiprof_flush(10000)
    from tuiprof_native import segment

    return segment.Segment(lib.tuiprof_segment_path().decode())


def accuracy(rank: int, world: int, out: str) -> None:
    dev = torch.device("cuda", rank)
    bf = {"device": dev, "dtype": torch.bfloat16}
    a8, b8 = torch.randn(8192, 8192, **bf), torch.randn(8192, 8192, **bf)
    x, w, bias = torch.randn(4096, 8192, **bf), torch.randn(6144, 8192, **bf), torch.randn(6144, **bf)
    w2 = torch.randn(4096, 8192, **bf)
    ba, bb = torch.randn(32, 2048, 2048, **bf), torch.randn(32, 2048, 2048, **bf)
    fa = torch.randn(4096, 4096, device=dev)
    fb = torch.randn(4096, 4096, device=dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    groups = {  # name: (fn, dtype, flops per call, calls)
        "mm_bf16": (lambda: torch.mm(a8, b8), "bf16", 2 * 8192**3, 20),
        "linear_bias_bf16": (lambda: F.linear(x, w, bias), "bf16", 2 * 4096 * 6144 * 8192, 20),
        "linear_nobias_bf16": (lambda: F.linear(x, w2), "bf16", 2 * 4096 * 4096 * 8192, 20),
        "bmm_bf16": (lambda: torch.bmm(ba, bb), "bf16", 2 * 32 * 2048**3, 20),
        "mm_fp32": (lambda: torch.mm(fa, fb), "fp32", 2 * 4096**3, 10),
    }
    own = {}
    for name, (fn, _dtype, flops, calls) in groups.items():
        for _ in range(3):  # warm-up calls are counted too
            fn()
        times = own_gemm_times(fn, calls)
        own[name] = {"calls": calls + 3, "timed_calls": calls, "seconds": sum(times), "flops": flops}

    sizes = [1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    coll_own = []
    counts = {"AllReduce": 0, "AllGather": 0, "ReduceScatter": 0}
    factor_ar, factor_ag = 2 * (world - 1) / world, (world - 1) / world
    for size in sizes:
        t = torch.ones(size // 2, **bf)
        for _ in range(5):
            dist.all_reduce(t)
        sec = own_loop_time(lambda t=t: dist.all_reduce(t), 20)
        counts["AllReduce"] += 25
        coll_own.append({"op": "AllReduce", "bytes": size, "seconds": sec, "busbw": size / sec * factor_ar})
    out_t, in_t = torch.empty(64 * MiB // 2, **bf), torch.ones(64 * MiB // 2 // world, **bf)
    for _ in range(5):
        dist.all_gather_into_tensor(out_t, in_t)
    sec = own_loop_time(lambda: dist.all_gather_into_tensor(out_t, in_t), 20)
    counts["AllGather"] += 25
    coll_own.append({"op": "AllGather", "bytes": 64 * MiB, "seconds": sec, "busbw": 64 * MiB / sec * factor_ag})
    big, small = torch.ones(64 * MiB // 2, **bf), torch.empty(64 * MiB // 2 // world, **bf)
    for _ in range(5):
        dist.reduce_scatter_tensor(small, big)
    sec = own_loop_time(lambda: dist.reduce_scatter_tensor(small, big), 20)
    counts["ReduceScatter"] += 25
    coll_own.append({"op": "ReduceScatter", "bytes": 64 * MiB, "seconds": sec, "busbw": 64 * MiB / sec * factor_ag})
    torch.cuda.synchronize()
    time.sleep(0.5)  # let the NCCL proxy thread report the last kernel channels

    seg = read_own_segment()
    header = seg.header()
    slots = seg.slots()
    gemm_rows = []
    gemm_events = seg.events(kind="gemm")
    for name, o in own.items():
        dtype, flops = groups[name][1], o["flops"]
        mine = [s for s in slots if s.kind == "gemm" and s.dtype == dtype and s.count and s.flops // s.count == flops]
        # the same calls the program timed: its last `timed_calls` (the warm-up calls include lazy kernel
        # loading, which our events -- like any events around the first call -- see as GPU time)
        timed = [e for e in gemm_events if e.dtype == dtype and e.flops == flops][-o["timed_calls"]:]
        ours_tflops = (sum(e.flops for e in timed) / (sum(e.end_ns - e.start_ns for e in timed) * 1e-9) / 1e12
                       if timed else None)
        first_ms = None
        first = [e for e in gemm_events if e.dtype == dtype and e.flops == flops][:1]
        if first:
            first_ms = (first[0].end_ns - first[0].start_ns) / 1e6
        own_tflops = o["timed_calls"] * flops / o["seconds"] / 1e12
        gemm_rows.append({"group": name, "apis": sorted({s.op for s in mine}), "program_calls": o["calls"],
                          "recorded_calls": sum(s.count for s in mine), "own_tflops": own_tflops,
                          "our_tflops": ours_tflops, "first_call_ms": first_ms,
                          "lifetime_tflops_incl_warmup": sum(s.timed_flops for s in mine) /
                          (sum(s.total_ns for s in mine) * 1e-9) / 1e12 if mine else None,
                          "tflops_diff_percent": None if ours_tflops is None else
                          100 * (ours_tflops - own_tflops) / own_tflops})
    events = [e for e in seg.events(kind="nccl") if e.end_ns]
    coll_rows = []
    for o in coll_own:
        mine = [e for e in events if e.op == o["op"] and e.bytes == o["bytes"]]
        if not mine:
            coll_rows.append({**o, "recorded": 0})
            continue
        mine = mine[5:]  # the same 20 timed ops (the first 5 are the warm-up)
        factor = factor_ar if o["op"] == "AllReduce" else factor_ag
        ours_sec = sum(e.end_ns - e.start_ns for e in mine) * 1e-9 / len(mine)
        ours_busbw = o["bytes"] / ours_sec * factor
        coll_rows.append({**o, "recorded": len(mine) + 5, "our_seconds": ours_sec, "our_busbw": ours_busbw,
                          "busbw_diff_percent": 100 * (ours_busbw - o["busbw"]) / o["busbw"],
                          "algo_proto": sorted({(s.algo, s.proto) for s in slots
                                                if s.kind == "nccl" and s.op == o["op"]})})
    nccl_counts = {op: sum(s.count for s in slots if s.kind == "nccl" and s.op == op) for op in counts}
    result = {"rank": rank, "flags": header.flags, "gemm": gemm_rows, "collectives": coll_rows,
              "nccl_program_counts": counts, "nccl_recorded_counts": nccl_counts,
              "all_nccl_slots": [(s.op, s.dtype, s.algo, s.proto, s.count, s.timed_count) for s in slots
                                 if s.kind == "nccl"],
              "counters": header.counters.__dict__, "inflight": [e.__dict__ for e in seg.inflight()]}
    with open(os.path.join(out, f"accuracy-{rank}.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


def overhead(rank: int, world: int, out: str, label: str, round_: int) -> None:
    dev = torch.device("cuda", rank)
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192, bias=False) for _ in range(8)]).to(dev, torch.bfloat16)
    opt = torch.optim.SGD(layers.parameters(), lr=1e-6)
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    params = list(layers.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        layers(x).float().square().mean().backward()
        flat = torch.cat([p.grad.view(-1) for p in params])
        dist.all_reduce(flat)
        opt.step()

    times = []
    for i in range(70):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= 10:
            times.append(time.perf_counter() - t0)

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    buf = torch.ones(512 * MiB, device=dev, dtype=torch.bfloat16)  # 1 GiB

    def gemms() -> None:
        for _ in range(8):
            torch.mm(a, a)

    overlap = []
    for _ in range(8):
        t_gemm = own_loop_time(gemms, 1)
        t_comm = own_loop_time(lambda: dist.all_reduce(buf), 1)

        def both() -> None:
            work = dist.all_reduce(buf, async_op=True)
            gemms()
            work.wait()

        t_both = own_loop_time(both, 1)
        overlap.append((t_gemm + t_comm - t_both) / min(t_gemm, t_comm))

    small = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
    for _ in range(2000):
        torch.mm(small, small)
    torch.cuda.synchronize()
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        torch.mm(small, small)
    host = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    with open(os.path.join(out, f"overhead-{label}-{round_}-{rank}.json"), "w") as f:
        json.dump({"label": label, "round": round_, "rank": rank, "step_median_s": statistics.median(times),
                   "step_times": times, "overlap_median": statistics.median(overlap), "overlap": overlap,
                   "small_mm_host_s_per_call": host}, f)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["accuracy", "overhead"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--label", default="")
    p.add_argument("--round", type=int, default=0)
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    if args.mode == "accuracy":
        accuracy(rank, world, args.out)
    else:
        overhead(rank, world, args.out, args.label, args.round)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
