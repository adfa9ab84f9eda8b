"""HTA's figures for the conformance corpus, recorded once as expected values (hta_corpus_reference.json).

Run in a side venv that has HolisticTraceAnalysis (never tuiprof's own):

    python3 -m venv /work/hta-venv && /work/hta-venv/bin/pip install holistictraceanalysis 'pandas<3'
    /work/hta-venv/bin/python tests/traces/data/hta_corpus_reference.py

For each file of the corpus (each is one rank; HTA's figures are per rank, so
each is loaded from a folder of its own) and each of HTA's two windows (``include_last_profiler_step`` False,
HTA's default, and True), HTA loads the files from a folder of their own and
this records, per rank: ``get_temporal_breakdown`` (idle / compute /
non-compute / GPU span), ``get_comm_comp_overlap``, ``get_gpu_kernel_breakdown``
(time per kernel type, memory kernels included, and the ten longest kernels by
total time of each type) and
``get_idle_time_breakdown`` (per stream: host wait / kernel wait / other, its
default 30 µs threshold). HTA rounds float timestamps to whole µs (start up,
end down): each file's windows are recorded with that rounding off
(HTA_DISABLE_NS_ROUNDING=1, so both tools read the same times) and, under
``as_shipped``, with HTA as it ships (what ``--like-hta`` reproduces).
A file HTA cannot analyse is recorded with HTA's error.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import pathlib
import shutil
import sys
import tempfile
from importlib.metadata import version

import warnings

from hta.trace_analysis import TraceAnalysis

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
OUTPUT = HERE / "hta_corpus_reference.json"
TOP_KERNELS = 10  # per kernel type, by total time
WINDOWS = {"hta_default": False, "last_step_included": True}
ROUNDING = "HTA_DISABLE_NS_ROUNDING"  # read by HTA each time it parses a file


def records(frame) -> list[dict]:
    return json.loads(frame.to_json(orient="records"))


def top_kernels(rows: list[dict]) -> dict[str, float]:
    """Kernel name → total µs, the TOP_KERNELS longest of each kernel type."""
    kept: dict[str, float] = {}
    for kind in sorted({row["kernel_type"] for row in rows}):
        ranked = sorted((row for row in rows if row["kernel_type"] == kind), key=lambda row: -row["sum (us)"])
        kept.update((row["name"], row["sum (us)"]) for row in ranked[:TOP_KERNELS])
    return kept


def analyse(trace_dir: pathlib.Path, include_last_step: bool) -> dict:
    """HTA's four analyses of the one rank in ``trace_dir``."""
    analysis = TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=include_last_step)
    [rank] = analysis.t.traces
    [temporal] = records(analysis.get_temporal_breakdown(visualize=False))
    [overlap] = records(analysis.get_comm_comp_overlap(visualize=False))
    types, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True,
                                                       num_kernels=100_000, duration_ratio=1.0)
    idle, _ = analysis.get_idle_time_breakdown(ranks=[rank], visualize=False)
    idle_by_stream: dict[str, dict[str, float]] = {}
    for row in records(idle):
        idle_by_stream.setdefault(str(row["stream"]), {})[row["idle_category"]] = row["idle_time"]
    return {
        "hta_rank": rank,
        "temporal": {key: value for key, value in temporal.items() if key != "rank"},
        "overlap_pct": overlap["comp_comm_overlap_pctg"],
        "kernel_types_us": {row["kernel_type"]: row["sum"] for row in records(types)},
        "top_kernels_us": top_kernels(records(kernels)),
        "idle_by_stream_us": idle_by_stream,
    }


def main() -> int:
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")  # pandas deprecation notices from inside HTA
    document: dict = {
        "produced_by": f"{pathlib.Path(sys.argv[0]).as_posix()} with HolisticTraceAnalysis "
                       f"{version('HolisticTraceAnalysis')}, pandas {version('pandas')}, "
                       "HTA_DISABLE_NS_ROUNDING=1 (as_shipped: unset)",
        "date": datetime.date.today().isoformat(),
        "files": {},
    }
    for path in sorted(CORPUS.iterdir()):
        entry = document["files"][path.name] = {}
        with tempfile.TemporaryDirectory(prefix="hta-corpus-") as scratch:
            shutil.copy(path, scratch)
            for rounding_off, figures in ((True, entry), (False, entry.setdefault("as_shipped", {}))):
                if rounding_off:
                    os.environ[ROUNDING] = "1"
                else:
                    os.environ.pop(ROUNDING, None)
                for window, include_last_step in WINDOWS.items():
                    try:
                        figures[window] = analyse(pathlib.Path(scratch), include_last_step)
                    except Exception as exc:  # noqa: BLE001 - HTA's failure on a file is what is recorded
                        figures[window] = {"error": f"{type(exc).__name__}: {exc}"}
    OUTPUT.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
