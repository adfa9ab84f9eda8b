"""tuiprof's trace summary against HTA's on the same per-rank traces of a real GPU capture.

    .venv/bin/python bench/traces/traces_gpu.py CAPTURE_DIR... --hta-python /tmp/hta-venv/bin/python [--json FILE]

CAPTURE_DIR is what `tuiprof trace --output DIR` wrote on the GPU machine
(bench/traces/traces_gpu.sh): ``<host>/rank<R>-pid<P>_<P>.pt.trace.json`` per rank.
tuiprof's side is `merge_traces` + `summarize` (what the CLI runs); HTA's side
is `TraceAnalysis` + `get_temporal_breakdown` + `get_comm_comp_overlap` in
its own venv (HolisticTraceAnalysis 0.5.0, pandas<3). On-demand Kineto traces
carry no ``distributedInfo``, so HTA gets copies with the rank added (else it
reads every file as rank 0); nothing else is changed. HTA runs twice: as it
comes (it ceils each event's start and floors its end to whole µs, so every
kernel shrinks by up to 2 µs and idle grows) and with HTA_DISABLE_NS_ROUNDING=1.

Compared per rank, as shares of the GPU span (first kernel start to last
kernel end): compute, non-compute (communication or memcpy/memset with no
compute kernel running) and idle; and comm-compute overlap (share of the
communication time during which a compute kernel runs).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from tuiprof.analysis.trace_merge import TraceInput, merge_traces  # noqa: E402
from tuiprof.analysis.trace_summary import RankSummary, summarize  # noqa: E402

RANK_FILE = re.compile(r"rank(\d+)-pid(\d+)_\d+\.pt\.trace\.json(\.gz)?$")
TOLERANCE_POINTS = 2.0

HTA_SCRIPT = """
import json, sys
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
breakdown = analysis.get_temporal_breakdown(visualize=False)
overlap = analysis.get_comm_comp_overlap(visualize=False)
print("HTA-RESULT " + json.dumps({"breakdown": breakdown.to_dict(orient="records"),
                                  "overlap": overlap.to_dict(orient="records")}))
"""


def rank_files(capture: pathlib.Path) -> list[TraceInput]:
    inputs = []
    for path in sorted(capture.glob("*/*.json*")):
        match = RANK_FILE.search(path.name)
        if match:
            inputs.append(TraceInput(path, path.parent.name, int(match.group(1)), int(match.group(2))))
    if not inputs:
        raise SystemExit(f"{capture}: no rank<R>-pid<P>_<P>.pt.trace.json files under <host>/")
    return inputs


def tuiprof_side(inputs: list[TraceInput], work: pathlib.Path) -> tuple[dict[int, dict], float]:
    started = time.monotonic()
    merged = merge_traces(inputs, work / "merged.trace.json.gz")
    summary = summarize(merged.ranks)
    seconds = time.monotonic() - started
    return {r.rank: shares(r) for r in summary.ranks if r.rank is not None}, seconds


def shares(rank: RankSummary) -> dict:
    assert rank.span_us and rank.compute_us is not None and rank.idle_us is not None, rank.unavailable
    compute = 100.0 * rank.compute_us / rank.span_us
    idle = 100.0 * rank.idle_us / rank.span_us
    return {"span_us": rank.span_us, "compute_pct": compute, "idle_pct": idle,
            "non_compute_pct": 100.0 - compute - idle, "overlap_pct": rank.overlap_percent,
            "communication_us": rank.communication_us, "memory_us": rank.memory_us}


def hta_inputs(inputs: list[TraceInput], work: pathlib.Path) -> pathlib.Path:
    """Copies of the rank files with ``distributedInfo.rank`` added, in a directory of their own."""
    trace_dir = work / "hta"
    trace_dir.mkdir()
    for source in inputs:
        raw = source.path.read_bytes()
        document = json.loads(gzip.decompress(raw) if source.path.suffix == ".gz" else raw)
        document["distributedInfo"] = {"rank": source.rank}
        (trace_dir / f"rank{source.rank}.json").write_text(json.dumps(document))
    return trace_dir


def hta_side(trace_dir: pathlib.Path, hta_python: str, ns_rounding: bool) -> tuple[dict[int, dict], float]:
    env = dict(os.environ, HTA_DISABLE_NS_ROUNDING="0" if ns_rounding else "1")
    started = time.monotonic()
    done = subprocess.run([hta_python, "-c", HTA_SCRIPT, str(trace_dir)], capture_output=True, text=True,
                          timeout=900, check=True, env=env)
    seconds = time.monotonic() - started
    line = next(x for x in done.stdout.splitlines() if x.startswith("HTA-RESULT "))
    result = json.loads(line.removeprefix("HTA-RESULT "))
    overlaps = {row["rank"]: row["comp_comm_overlap_pctg"] for row in result["overlap"]}
    return {row["rank"]: {"span_us": row["kernel_time(us)"], "compute_pct": row["compute_time_pctg"],
                          "idle_pct": row["idle_time_pctg"], "non_compute_pct": row["non_compute_time_pctg"],
                          "overlap_pct": overlaps.get(row["rank"])}
            for row in result["breakdown"]}, seconds


def compare(capture: pathlib.Path, hta_python: str) -> dict:
    inputs = rank_files(capture)
    with tempfile.TemporaryDirectory(prefix="traces-gpu-") as tmp:
        ours, our_seconds = tuiprof_side(inputs, pathlib.Path(tmp))
        trace_dir = hta_inputs(inputs, pathlib.Path(tmp))
        theirs, hta_seconds = hta_side(trace_dir, hta_python, ns_rounding=True)
        exact, _ = hta_side(trace_dir, hta_python, ns_rounding=False)
    rows = []
    for rank in sorted(ours):
        row: dict = {"rank": rank}
        for key in ("compute_pct", "non_compute_pct", "idle_pct", "overlap_pct"):
            a, b = ours[rank][key], theirs[rank][key]
            row[key] = {"tuiprof": round(a, 2), "hta": round(b, 2), "diff": round(a - b, 2),
                        "hta_ns": round(exact[rank][key], 2), "diff_ns": round(a - exact[rank][key], 2)}
        row["span_us"] = {"tuiprof": ours[rank]["span_us"], "hta": theirs[rank]["span_us"]}
        rows.append(row)
    worst = max(abs(row[k]["diff"]) for row in rows for k in ("compute_pct", "non_compute_pct", "idle_pct",
                                                             "overlap_pct"))
    return {"capture": str(capture), "ranks": rows, "worst_diff_points": worst,
            "within_tolerance": worst <= TOLERANCE_POINTS,
            "seconds": {"tuiprof_merge_and_summary": round(our_seconds, 3), "hta_load_and_analyses": round(hta_seconds, 3)}}


def markdown(result: dict) -> str:
    lines = [f"capture {result['capture']}: worst difference {result['worst_diff_points']:.2f} points "
             f"({'within' if result['within_tolerance'] else 'OUTSIDE'} {TOLERANCE_POINTS:g}); "
             f"tuiprof {result['seconds']['tuiprof_merge_and_summary']} s, HTA {result['seconds']['hta_load_and_analyses']} s",
             "", "each cell: tuiprof / HTA (difference) / HTA with ns rounding off (difference)", "",
             "| rank | GPU span µs (tuiprof / HTA) | compute % | non-compute % | idle % | comm-compute overlap % |",
             "|---|---|---|---|---|---|"]
    for row in result["ranks"]:
        cells = [f"{row[k]['tuiprof']:.2f} / {row[k]['hta']:.2f} ({row[k]['diff']:+.2f}) / "
                 f"{row[k]['hta_ns']:.2f} ({row[k]['diff_ns']:+.2f})"
                 for k in ("compute_pct", "non_compute_pct", "idle_pct", "overlap_pct")]
        lines.append(f"| {row['rank']} | {row['span_us']['tuiprof']:.0f} / {row['span_us']['hta']:.0f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("captures", nargs="+", type=pathlib.Path)
    parser.add_argument("--hta-python", required=True, help="python of a venv with HolisticTraceAnalysis 0.5.0")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    args = parser.parse_args()
    results = [compare(capture, args.hta_python) for capture in args.captures]
    for result in results:
        print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["within_tolerance"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
