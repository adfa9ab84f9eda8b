"""Summarise bench/gpu/native_gpu.py's per-process JSON files into markdown (stdout) and one JSON file."""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys


def load(pattern: str) -> list[dict]:
    return [json.load(open(p)) for p in sorted(glob.glob(pattern))]


def main(work: str, summary_path: str) -> None:
    acc = load(os.path.join(work, "accuracy-*.json"))
    over = load(os.path.join(work, "overhead-*.json"))
    print("## GEMMs (per rank): calls recorded vs made, TFLOPS ours vs the program's own CUDA events\n")
    print("| rank | group | cuBLAS API seen | program calls | recorded | own TFLOPS | our TFLOPS | diff % "
          "| our first call ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for a in acc:
        for g in a["gemm"]:
            ours = "-" if g["our_tflops"] is None else f"{g['our_tflops']:.1f}"
            diff = "-" if g["tflops_diff_percent"] is None else f"{g['tflops_diff_percent']:+.2f}"
            print(f"| {a['rank']} | {g['group']} | {', '.join(g['apis'])} | {g['program_calls']} | "
                  f"{g['recorded_calls']} | {g['own_tflops']:.1f} | {ours} | {diff} | "
                  f"{g['first_call_ms']:.2f} |")
    print("\n## Collectives (per rank): bus bandwidth ours (kernel-channel GPU timers) vs own (events around a loop)\n")
    print("| rank | op | MiB | recorded | own busbw GB/s | our busbw GB/s | diff % | algo/proto |")
    print("|---|---|---|---|---|---|---|---|")
    for a in acc:
        for c in a["collectives"]:
            if not c.get("recorded"):
                print(f"| {a['rank']} | {c['op']} | {c['bytes'] >> 20} | 0 | {c['busbw'] / 1e9:.1f} | - | - | - |")
                continue
            print(f"| {a['rank']} | {c['op']} | {c['bytes'] >> 20} | {c['recorded']} | {c['busbw'] / 1e9:.1f} | "
                  f"{c['our_busbw'] / 1e9:.1f} | {c['busbw_diff_percent']:+.2f} | "
                  f"{' '.join('/'.join(x) for x in c['algo_proto'])} |")
    for a in acc:
        print(f"\nrank {a['rank']}: NCCL calls made {a['nccl_program_counts']}, recorded {a['nccl_recorded_counts']};"
              f" counters {a['counters']}; in flight at the end {a['inflight']}")
    print("\n## Overhead (CUDA_DEVICE_MAX_CONNECTIONS=1, medians over rounds x ranks)\n")
    print("| mode | step median ms | vs plain % | comm/compute overlap | host us per small mm |")
    print("|---|---|---|---|---|")
    labels = ["plain", "tuiprof", "nccl_timing"]
    rows = {}
    for label in labels:
        runs = [o for o in over if o["label"] == label]
        if not runs:
            continue
        rows[label] = {
            "step_median_s": statistics.median(o["step_median_s"] for o in runs),
            "overlap_median": statistics.median(o["overlap_median"] for o in runs),
            "small_mm_host_s_per_call": statistics.median(o["small_mm_host_s_per_call"] for o in runs),
            "per_round_step_median_s": [o["step_median_s"] for o in runs],
        }
    base = rows.get("plain", {}).get("step_median_s")
    for label, r in rows.items():
        rel = "-" if not base else f"{100 * (r['step_median_s'] - base) / base:+.3f}"
        print(f"| {label} | {r['step_median_s'] * 1e3:.3f} | {rel} | {r['overlap_median']:.3f} | "
              f"{r['small_mm_host_s_per_call'] * 1e6:.2f} |")
    with open(summary_path, "w") as f:
        json.dump({"accuracy": acc, "overhead": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
