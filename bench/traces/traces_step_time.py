"""Compare the trace summary's step time with the job's own CUDA-event step timer.

    python3 bench/traces/traces_step_time.py DIR

DIR holds what ``bench/traces/traces_step_time_gpu.py`` wrote on the GPU machine
(``scheduled.json.gz``, ``on_demand.json.gz``, ``timer.json``). For each trace it
prints, as a markdown table row: the timer's median and mean step gap, tuiprof's
step time and what it measures, tuiprof's CPU-side figure, and each one's error
against the timer's median.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys

from tuiprof.analysis.trace_merge import TraceInput, merge_traces
from tuiprof.analysis.trace_summary import summarize


def main(folder: pathlib.Path) -> None:
    timer = json.loads((folder / "timer.json").read_text())
    print(f"{timer['gpu']}, torch {timer['torch']}, GPU synchronised every {timer['sync_every']} steps\n")
    print("| trace | timer median (mean) ms | tuiprof step time ms | basis | error | CPU-side ms | error |")
    print("|---|---|---|---|---|---|---|")
    for name in ("scheduled", "on_demand"):
        merged = merge_traces([TraceInput(folder / f"{name}.json.gz")], folder / "unused.json.gz", timeline=False)
        [rank] = summarize(merged.ranks).ranks
        truth = statistics.median(timer[name])

        def error(value: float | None, truth: float = truth) -> str:
            return "n/a" if value is None else f"{100.0 * (value - truth) / truth:+.2f} %"

        def ms(value: float | None) -> str:
            return "n/a" if value is None else f"{value / 1000:.3f}"

        print(f"| {name} | {truth / 1000:.3f} ({statistics.mean(timer[name]) / 1000:.3f}) | "
              f"{ms(rank.step_time_us)} | {rank.step_time_basis} | {error(rank.step_time_us)} | "
              f"{ms(rank.cpu_step_time_us)} | {error(rank.cpu_step_time_us)} |")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
