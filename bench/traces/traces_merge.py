"""Merge + summary of many ranks' Kineto traces: tuiprof vs HTA, side by side in one run.

    .venv/bin/python bench/traces/traces_merge.py --hta-python /tmp/hta-venv/bin/python

Generates synthetic Kineto-shaped traces (CPU ops, CUDA launches, compute and
NCCL kernels with correlation ids, memcpys, ProfilerStep annotations; about
300 bytes an event, like real Kineto output) under bench/.work/traces/, then
for each case runs, each in a fresh process: tuiprof (merge_traces → merged
gzipped timeline, then summarize) and HTA (TraceAnalysis load + temporal
breakdown + comm/comp overlap + kernel breakdown). Prints wall time and peak
RSS (the largest of the process and its children) per side.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import resource
import subprocess
import sys
import time

WORK = pathlib.Path(__file__).resolve().parents[1] / ".work" / "traces"  # bench/.work, ignored by git
BASE_NS = 1_795_000_000_000_000_000
COMPUTE_KERNELS = [f"void at::native::elementwise_kernel<{i}, at::native::op{i}>(int, Op)" for i in range(20)] + [
    f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize{n}x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
    for n in (64, 128, 256)]
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def generate(path: pathlib.Path, rank: int, events: int, seed: int) -> None:
    """One rank's trace: groups of (cpu_op, cudaLaunchKernel, kernel), a step every 300 groups."""
    rng = random.Random(seed)
    pid, out = 1000 + rank, []
    ts, gpu_ts, correlation, step = 1_000.0, 1_050.0, 1, 0
    collective = 0
    while len(out) < events:
        if correlation % 300 == 1:
            step += 1
            out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": pid,
                        "ts": ts, "dur": 300 * 40.0, "args": {"External id": correlation}})
        dur = rng.uniform(2, 30)
        out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": ts, "dur": dur,
                    "args": {"External id": correlation, "Record function id": 0, "Sequence number": correlation}})
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
                    "ts": ts + 1, "dur": 4.0, "args": {"External id": correlation, "cbid": 211,
                                                       "correlation": correlation}})
        kind = correlation % 10
        gpu_ts = max(gpu_ts, ts + 6)
        if kind == 0:
            collective += 1
            name, stream, cat, kdur = NCCL, 20, "kernel", rng.uniform(20, 80) + (40 if rank == 3 else 0)
            extra = {"Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": 4096,
                     "dtype": "BFloat16"}
            kts = ts + 8
        elif kind == 5:
            name, stream, cat, kdur, extra, kts = "Memcpy HtoD (Pageable -> Device)", 7, "gpu_memcpy", 6.0, {}, gpu_ts
        else:
            name, stream, cat, kdur, extra = rng.choice(COMPUTE_KERNELS), 7, "kernel", rng.uniform(5, 60), {}
            kts = gpu_ts
        out.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": kts, "dur": kdur,
                    "args": {"External id": correlation, "queued": 0, "device": 0, "context": 1, "stream": stream,
                             "correlation": correlation, "registers per thread": 32, "shared memory": 0,
                             "grid": [128, 1, 1], "block": [256, 1, 1], **extra}})
        if stream == 7:
            gpu_ts = kts + kdur + rng.uniform(0, 5)
        ts += dur + rng.uniform(1, 20)
        correlation += 1
    import msgspec  # only the generator needs it (the HTA interpreter may lack it)

    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 0},
           "deviceProperties": [], "baseTimeNanoseconds": BASE_NS + rank * 1_000_000, "traceEvents": out[:events],
           "traceName": str(path), "displayTimeUnit": "ms"}
    # HTA finds the rank with a regex that wants Kineto's `"rank": N` spacing.
    path.write_bytes(msgspec.json.encode(doc).replace(b'"rank":', b'"rank": ', 1))


def case_dir(ranks: int, events: int) -> pathlib.Path:
    directory = WORK / f"{ranks}x{events}"
    if not (directory / "done").exists():
        directory.mkdir(parents=True, exist_ok=True)
        for rank in range(ranks):
            generate(directory / f"rank{rank}.json", rank, events, seed=rank)
        (directory / "done").write_text("")
    return directory


def run_ours(directory: pathlib.Path) -> dict:
    from tuiprof.analysis.trace_merge import TraceInput, merge_traces
    from tuiprof.analysis.trace_summary import summarize

    inputs = [TraceInput(p, "bench") for p in sorted(directory.glob("rank*.json"))]
    output = directory.parent / f"{directory.name}-merged.json.gz"
    merged = merge_traces(inputs, output)
    summary = summarize(merged.ranks)
    return {"events": merged.events, "ranks": len(summary.ranks),
            "compute_us_rank0": summary.ranks[0].compute_us, "overlap_rank0": summary.ranks[0].overlap_percent}


def run_hta(directory: pathlib.Path) -> dict:
    from hta.trace_analysis import TraceAnalysis

    analyzer = TraceAnalysis(trace_dir=str(directory))
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    overlap = analyzer.get_comm_comp_overlap(visualize=False)
    analyzer.get_gpu_kernel_breakdown(visualize=False)
    return {"ranks": len(temporal), "compute_us_rank0": float(temporal.iloc[0]["compute_time(us)"]),
            "overlap_rank0": float(overlap.iloc[0]["comp_comm_overlap_pctg"])}


def measure(python: str, side: str, directory: pathlib.Path) -> dict:
    """Run one side in a fresh interpreter; its wall time and its peak RSS (children included)."""
    started = time.perf_counter()
    proc = subprocess.run([python, __file__, "--side", side, str(directory)], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = round(wall, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hta-python", help="an interpreter with HolisticTraceAnalysis installed")
    parser.add_argument("--cases", default="8x200000,64x50000")
    parser.add_argument("--side", choices=("ours", "hta"))
    parser.add_argument("directory", nargs="?")
    args = parser.parse_args()
    if args.side:
        started = time.perf_counter()
        result = (run_ours if args.side == "ours" else run_hta)(pathlib.Path(args.directory))
        result["inner_seconds"] = round(time.perf_counter() - started, 2)
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        result["peak_rss_mb"] = round(max(own, children) / 1024)
        print(json.dumps(result))
        return
    for case in args.cases.split(","):
        ranks, events = (int(x) for x in case.split("x"))
        directory = case_dir(ranks, events)
        size_mb = sum(p.stat().st_size for p in directory.glob("rank*.json")) / 1e6
        print(f"case {ranks} ranks x {events} events ({size_mb:.0f} MB of JSON)", flush=True)
        ours = measure(sys.executable, "ours", directory)
        print(f"  tuiprof merge+summary: {json.dumps(ours)}", flush=True)
        if args.hta_python:
            hta = measure(args.hta_python, "hta", directory)
            print(f"  HTA load+analyses:     {json.dumps(hta)}", flush=True)
            if "wall_seconds" in hta and "wall_seconds" in ours:
                print(f"  speed-up: {hta['wall_seconds'] / ours['wall_seconds']:.1f}x", flush=True)


if __name__ == "__main__":
    main()
