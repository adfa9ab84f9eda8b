"""`tuiprof analyze` beside HTA on the same real trace files: wall time and peak memory.

    /work/hta-venv/bin/pip install holistictraceanalysis 'pandas<3'   # a side venv, never tuiprof's
    .venv/bin/python bench/traces/traces_vs_hta.py --hta-python /work/hta-venv/bin/python [--repeat 3] [--copies 25]

Cases: every corpus file with GPU events (tests/traces/data/corpus, one rank
each), the two NCCL ranks together (one job), and one large real-shaped file:
the NCCL rank 0 trace replicated ``--copies`` times end to end (every event
of copy k shifted by k × the trace's length, correlation and flow ids made
unique per copy) — no large real trace is public, so this is real events,
repeated, not a real capture.

Each side runs in a fresh child process on a folder holding the case's files:
- tuiprof: ``tuiprof analyze DIR --json`` (decode, rebase, link collectives,
  summary with idle by stream and launch statistics; no timeline written), and
  again with ``--output FILE`` (also writes the merged, gzipped timeline);
- HTA: ``TraceAnalysis(trace_dir=DIR)`` + ``get_temporal_breakdown`` +
  ``get_comm_comp_overlap`` + ``get_gpu_kernel_breakdown``.
"Work" is what each side reports for its own load and analyses, after the
interpreter's start and the imports (for files this small, start-up is most
of the wall time). Wall time is the child's, start to exit: the fastest of ``--repeat`` runs
(the sides alternate; the machine is shared, and the fastest run is the one
least disturbed by other users), the median beside it. Peak
memory is the largest sum of VmRSS over the child and its descendants,
sampled every 10 ms from /proc (tuiprof's merge uses one worker process per
rank when there are several). (ru_maxrss from wait4 is not used: Linux
carries the forking parent's high-water mark across exec into the child's.)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "traces" / "data" / "corpus"
SINGLE_FILES = ["hta_alexnet.json.gz", "hta_rocm62_mi250.json.gz", "kineto_tb_plugin_2021.json.gz",
                "hta_nccl_rank0.json.gz"]
NCCL_JOB = ["hta_nccl_rank0.json.gz", "hta_nccl_rank1.json.gz"]
SAMPLE_S = 0.01

HTA_SCRIPT = """
import json, logging, sys, warnings
logging.disable(logging.WARNING)
warnings.simplefilter("ignore")
import time
from hta.trace_analysis import TraceAnalysis
started = time.monotonic()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
analysis.get_temporal_breakdown(visualize=False)
analysis.get_comm_comp_overlap(visualize=False)
analysis.get_gpu_kernel_breakdown(visualize=False)
print(json.dumps({"seconds": {"merge_and_summary": time.monotonic() - started}}))
"""


def replicated(source: pathlib.Path, copies: int, target: pathlib.Path) -> None:
    """``copies`` copies of ``source``'s events, end to end, ids unique per copy."""
    document = json.loads(gzip.decompress(source.read_bytes()))
    events = document["traceEvents"]
    timed = [e for e in events if "ts" in e]
    length = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed)
    id_stride = 1 + max([e["args"]["correlation"] for e in events if isinstance(e.get("args"), dict)
                         and isinstance(e["args"].get("correlation"), int)] +
                        [e["id"] for e in events if isinstance(e.get("id"), int)])
    out = [e for e in events if "ts" not in e]
    for copy in range(copies):
        for event in timed:
            moved = dict(event, ts=event["ts"] + copy * length)
            if isinstance(event.get("id"), int):
                moved["id"] = event["id"] + copy * id_stride
            args = event.get("args")
            if isinstance(args, dict) and isinstance(args.get("correlation"), int):
                moved["args"] = dict(args, correlation=args["correlation"] + copy * id_stride)
            out.append(moved)
    document["traceEvents"] = out
    target.write_bytes(gzip.compress(json.dumps(document).encode(), 6))


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _tree_rss_kib(pid: int) -> int:
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            continue
        stack += _children(current)
    return total


def measure(command: list[str]) -> dict:
    started = time.monotonic()
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr)
        peak = 0
        while True:
            pid, status, _ = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _tree_rss_kib(process.pid))
            time.sleep(SAMPLE_S)
        wall = time.monotonic() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        if process.returncode:
            raise SystemExit(f"{command[0]} failed ({process.returncode}): {stderr.read().decode()[-2000:]}")
        # both sides print {"seconds": {"merge_and_summary": …}}: the work itself, after start-up and imports
        work = json.loads(stdout.read())["seconds"]["merge_and_summary"]
    return {"wall_s": wall, "work_s": work, "tree_peak_mib": peak / 1024}


def _figures(runs: list[dict]) -> dict:
    return {"wall_s": round(min(r["wall_s"] for r in runs), 3),
            "wall_s_median": round(statistics.median(r["wall_s"] for r in runs), 3),
            "work_s": round(min(r["work_s"] for r in runs), 3),
            "peak_mib": round(max(r["tree_peak_mib"] for r in runs), 1)}


def run_sides(commands: dict[str, list[str]], repeat: int) -> dict[str, dict]:
    """Each side ``repeat`` times, taking turns, so all see the same spells of load from other users."""
    runs: dict[str, list[dict]] = {side: [] for side in commands}
    for _ in range(repeat):
        for side, command in commands.items():
            runs[side].append(measure(command))
    return {side: _figures(side_runs) for side, side_runs in runs.items()}


def cases(work: pathlib.Path, copies: int) -> dict[str, pathlib.Path]:
    found = {}
    for name in SINGLE_FILES:
        folder = work / name.removesuffix(".json.gz")
        folder.mkdir()
        shutil.copy(CORPUS / name, folder)
        found[name] = folder
    job = work / "hta_nccl_2_ranks"
    job.mkdir()
    for name in NCCL_JOB:
        shutil.copy(CORPUS / name, job)
    found["hta_nccl rank 0 + rank 1 (one job)"] = job
    large = work / "large"
    large.mkdir()
    replicated(CORPUS / "hta_nccl_rank0.json.gz", copies, large / "rank0_replicated.json.gz")
    found[f"hta_nccl_rank0 × {copies} (replicated)"] = large
    return found


def size_mb(folder: pathlib.Path) -> tuple[float, float]:
    files = list(folder.iterdir())
    compressed = sum(p.stat().st_size for p in files)
    raw = sum(len(gzip.decompress(p.read_bytes())) for p in files)
    return compressed / 1e6, raw / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hta-python", required=True, help="python of a venv with HolisticTraceAnalysis")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--copies", type=int, default=25)
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    args = parser.parse_args()
    tuiprof = str(pathlib.Path(sys.executable).parent / "tuiprof")
    rows = []
    with tempfile.TemporaryDirectory(prefix="traces-vs-hta-") as scratch:
        for label, folder in cases(pathlib.Path(scratch), args.copies).items():
            sides = run_sides({"tuiprof": [tuiprof, "analyze", str(folder), "--json"],
                               "tuiprof_output": [tuiprof, "analyze", str(folder), "--json", "--output",
                                                  str(pathlib.Path(scratch) / "merged.json.gz")],
                               "hta": [args.hta_python, "-c", HTA_SCRIPT, str(folder)]}, args.repeat)
            ours, theirs = sides["tuiprof"], sides["hta"]
            gz, raw = size_mb(folder)
            rows.append({"case": label, "gz_mb": round(gz, 2), "json_mb": round(raw, 1), **sides,
                         "speedup": round(theirs["wall_s"] / ours["wall_s"], 1),
                         "memory_ratio": round(ours["peak_mib"] / theirs["peak_mib"], 2),
                         "speedup_with_output": round(theirs["wall_s"] / sides["tuiprof_output"]["wall_s"], 1),
                         "work_speedup": round(theirs["work_s"] / ours["work_s"], 1)})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nmachine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}; repeat {args.repeat}\n")
    print("| case | .gz MB | JSON MB | tuiprof wall s (median) | work s | peak MiB | with --output: wall s, peak MiB "
          "| HTA wall s (median) | work s | peak MiB | speed-up wall (with --output) | speed-up work "
          "| memory tuiprof/HTA |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ours, written, theirs = r["tuiprof"], r["tuiprof_output"], r["hta"]
        print(f"| {r['case']} | {r['gz_mb']} | {r['json_mb']} | {ours['wall_s']} ({ours['wall_s_median']}) | "
              f"{ours['work_s']} | {ours['peak_mib']} | {written['wall_s']}, {written['peak_mib']} | "
              f"{theirs['wall_s']} ({theirs['wall_s_median']}) | {theirs['work_s']} | {theirs['peak_mib']} | "
              f"{r['speedup']}× ({r['speedup_with_output']}×) | {r['work_speedup']}× | {r['memory_ratio']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
