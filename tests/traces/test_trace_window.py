"""``--steps`` windows and kernel launch statistics on real corpus traces, checked against
figures computed here straight from the raw events (correlation ids paired by hand)."""

from __future__ import annotations

import gzip
import json
import pathlib
import statistics

import pytest

from testkit.traces import run_cli
from traces.test_trace_analysis import write_trace
from tuiprof.analysis.trace_merge import TraceInput, merge_traces
from tuiprof.analysis.trace_summary import summarize

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"
RANK0 = CORPUS / "hta_nccl_rank0.json.gz"  # ProfilerStep#551 and #552, 1,204 GPU events


def raw(path: pathlib.Path) -> list[dict]:
    return [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]


def launches_by_correlation(events: list[dict]) -> dict[int, float]:
    return {e["args"]["correlation"]: e["ts"] for e in events
            if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}


def gpu_events(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def summary_of(path: pathlib.Path, steps: str, tmp_path: pathlib.Path):
    [rank] = summarize(merge_traces([TraceInput(path)], tmp_path / "m.json.gz", steps=steps).ranks).ranks
    return rank


def test_complete_steps_count_the_gpu_work_launched_in_all_but_the_last_step(tmp_path):
    events = raw(RANK0)
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    assert len(steps) == 2
    start, end = steps[0]
    launches = launches_by_correlation(events)
    inside = [e for e in gpu_events(events)
              if start <= launches.get(e["args"].get("correlation"), e["ts"]) <= end]
    assert 0 < len(inside) < len(gpu_events(events)) == 1204

    rank = summary_of(RANK0, "complete", tmp_path)
    assert rank.window.startswith("steps 1–1 of 2 (ProfilerStep#551–#551")
    assert rank.gpu_kernels == len(inside)
    assert rank.gpu_events_outside == 1204 - len(inside)
    assert rank.steps == 1 and rank.step_time_us == pytest.approx(end - start)
    nccl = [e for e in inside if "nccl" in e["name"].lower()]
    # The five SendRecv kernels of step 551 do not overlap each other: the sum is the union.
    assert rank.communication_us == pytest.approx(sum(e["dur"] for e in nccl), abs=1e-3)

    everything = summary_of(RANK0, "all", tmp_path)
    assert everything.window == "whole trace, all 2 steps"
    assert everything.gpu_kernels == 1204 and everything.gpu_events_outside == 0


def test_launch_delay_and_short_kernels_match_the_raw_events(tmp_path):
    events = raw(RANK0)
    launches = launches_by_correlation(events)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    delays = sorted(e["ts"] - launches[e["args"]["correlation"]] for e in kernels
                    if e["args"].get("correlation") in launches)
    assert len(delays) == len(kernels) == 1154  # every kernel's cudaLaunchKernel is in this trace

    stats = summary_of(RANK0, "all", tmp_path).launches
    assert stats is not None
    assert stats.kernels == stats.matched == 1154
    assert stats.median_delay_us == pytest.approx(statistics.median(delays), abs=1e-3)
    assert stats.max_delay_us == pytest.approx(delays[-1], abs=1e-3)
    assert delays[int(0.9 * len(delays))] <= stats.p95_delay_us <= delays[-1]
    assert stats.short_kernels == sum(e["dur"] < 10 for e in kernels) > 0


def test_a_trace_with_one_step_counts_the_whole_trace_as_hta_does(tmp_path):
    """HTA filters nothing when a trace has one ProfilerStep#: ``complete`` then counts what ``all`` counts."""
    name = "hta_triton.json.gz"
    steps = [e["name"] for e in raw(CORPUS / name) if e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 1
    rank = summary_of(CORPUS / name, "complete", tmp_path)
    everything = summary_of(CORPUS / name, "all", tmp_path)
    assert rank.window == f"whole trace, its only step ({steps[0]}) kept as HTA keeps it"
    assert rank.gpu_kernels == everything.gpu_kernels == len(gpu_events(raw(CORPUS / name))) > 0
    assert rank.gpu_events_outside == 0
    assert rank.compute_us == everything.compute_us is not None


def test_2021_step_annotations_filed_as_operators_are_steps(tmp_path):
    """PyTorch 1.8/1.9 wrote ProfilerStep# with category ``Operator``, not ``user_annotation``."""
    path = CORPUS / "kineto_resnet50_2021_steps5-6.json.gz"
    steps = sorted((e["ts"], e["dur"]) for e in raw(path) if e["name"].startswith("ProfilerStep#"))
    assert [e["cat"] for e in raw(path) if e["name"].startswith("ProfilerStep#")] == ["Operator", "Operator"]
    everything = summary_of(path, "all", tmp_path)
    assert everything.window == "whole trace, all 2 steps"
    assert everything.steps == 2
    assert everything.cpu_step_time_us == pytest.approx(statistics.median(dur for _, dur in steps))
    # On the GPU: from the first GPU event launched in step 5 to the first launched in step 6.
    launches = {e["args"]["correlation"]: e["ts"] for e in raw(path)
                if e.get("cat") == "Runtime" and "correlation" in e.get("args", {})}
    first = [min(e["ts"] for e in raw(path) if e.get("cat") in ("Kernel", "Memcpy", "Memset")
                 and start <= launches.get(e["args"].get("correlation"), -1) <= start + dur) for start, dur in steps]
    assert everything.step_time_us == pytest.approx(first[1] - first[0])
    complete = summary_of(path, "complete", tmp_path)
    assert complete.window.startswith("steps 1–1 of 2 (ProfilerStep#5–#5")
    assert complete.steps == 1 and complete.step_time_us == pytest.approx(steps[0][1])  # one step: no GPU gap


def test_analyze_prints_what_it_counted_in_text_and_json():
    text = run_cli("analyze", str(RANK0), "--steps", "complete")
    assert text.returncode == 0, text.stderr
    assert "counted: steps 1–1 of 2 (ProfilerStep#551–#551" in text.stdout
    assert "kernel launches: delay median" in text.stdout
    # HTA's idle breakdown for this window: stream 23 is idle 596.04 ms waiting on the host
    assert "idle by stream (host wait / kernel wait / other): 23: 596.04 ms / 0.07 ms / 0.03 ms" in text.stdout
    document = json.loads(run_cli("analyze", str(RANK0), "--json").stdout)
    [rank] = document["summary"]["ranks"]
    assert rank["window"] == "whole trace, all 2 steps" and rank["gpu_kernels"] == 1204
    assert rank["launches"]["matched"] == 1154
    assert {idle["stream"] for idle in rank["idle_by_stream"]} == {"7", "23", "25", "84", "203"}
    refused = run_cli("analyze", str(RANK0), "--steps", "some")
    assert refused.returncode == 2 and "invalid choice: 'some'" in refused.stderr


def test_a_one_kernel_trace_is_idle_zero_never_negative(tmp_path):
    # Nanosecond durations (HTA's ns-resolution traces): the span rounds to 1.76 µs, the kernel is 1.7604 µs.
    path = write_trace(tmp_path / "one.json", 1_700_000_000_000_000_000, [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 100.0, "dur": 1.7604,
         "args": {"stream": 7}}])
    text = run_cli("analyze", str(path))
    assert text.returncode == 0, text.stderr
    assert ", idle 0.00 ms;" in text.stdout and "-0.00" not in text.stdout


def test_step_time_is_the_gpus_period_when_launches_run_ahead(tmp_path):
    """A loop that syncs every 5th step: 4 steps of 2 ms launches, then one that waits for the GPU.
    The GPU runs one 15 ms kernel per step back to back: its period is the true step time."""
    events, cpu, gpu = [], 0.0, 0.0
    for step in range(10):
        launch = cpu + 0.5
        start = max(gpu, launch + 0.01)
        gpu = start + 15_000.0
        span = (gpu - cpu + 100.0) if step % 5 == 4 else 2_000.0  # the 5th step's sync waits for the GPU
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 4242, "tid": 4242,
             "ts": cpu, "dur": span},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242, "ts": launch,
             "dur": 5.0, "args": {"correlation": 100 + step}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": start, "dur": 15_000.0,
             "args": {"correlation": 100 + step, "stream": 7}}]
        cpu += span
    document = json.loads(run_cli("analyze", str(write_trace(tmp_path / "ahead.json", 10**18, events)),
                                  "--json").stdout)
    [rank] = document["summary"]["ranks"]
    assert rank["step_time_us"] == pytest.approx(15_000.0)
    assert rank["step_time_basis"].startswith("GPU:")
    assert rank["cpu_step_time_us"] == pytest.approx(2_000.0)  # the median span: the launch-ahead steps
    text = run_cli("analyze", str(tmp_path / "ahead.json")).stdout
    assert "step time 15.00 ms (10 steps; GPU: median gap between consecutive steps' first GPU work); " \
           "CPU-side 2.00 ms" in text
