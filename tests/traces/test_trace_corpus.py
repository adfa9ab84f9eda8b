"""The conformance corpus: real traces other PyTorch/Kineto versions wrote (origins in data/README.md).

For each: the wall clock is found (``baseTimeNanoseconds`` at the head, at the
end, or absolute timestamps), every GPU kernel/memcpy/memset is read whatever
category spelling its Kineto used, and the merged collective arrows run forward.
"""

from __future__ import annotations

import datetime
import gzip
import json
import pathlib
from collections import defaultdict

import pytest

from tuiprof.analysis.trace_collectives import CLOCK_SLACK_US
from tuiprof.analysis.trace_merge import TraceInput, merge_traces, trace_header
from tuiprof.analysis.trace_summary import summarize

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"

# file → (UTC day of its first event, GPU kernel + memcpy + memset events, rank).
# The alexnet and rank-34 files' first events fall seconds after the times in their upstream
# names (benchmark_result_…_1695835535 = 17:25:35 UTC; rank-34.Jul_15_10_52_41, US Pacific).
EXPECTED = {
    "hta_nccl_rank0.json.gz": ("2023-04-28", 1204, 0),
    "hta_nccl_rank1.json.gz": ("2023-04-28", 1154, 1),
    "hta_alexnet.json.gz": ("2023-09-27", 98, 0),
    "hta_gloo_cpu_only_rank34.json.gz": ("2024-07-15", 0, 34),
    "hta_triton.json.gz": ("2024-10-28", 1, None),
    "hta_rocm62_mi250.json.gz": ("2025-02-17", 16, None),
    "kineto_tb_plugin_2021.json.gz": ("2021-05-19", 32, None),
    "kineto_resnet50_2021_steps5-6.json.gz": ("2021-01-11", 3094, None),
    "deepseek_v3_train_ep64_rank0.json.gz": ("2025-02-25", 983, 0),
    # baseTimeNanoseconds is the same 2025-12-31 instant in both TraceLens files; their timestamps are relative to it
    "tracelens_b200_vllm_multimem_rank0.json.gz": ("2026-01-16", 929, 0),
    "tracelens_mi300x_rccl_rank0.json.gz": ("2026-02-12", 3653, 0),
}


def test_the_corpus_is_small_and_every_file_is_listed():
    files = {p.name for p in CORPUS.iterdir()}
    assert files == set(EXPECTED)
    assert sum(p.stat().st_size for p in CORPUS.iterdir()) < 3 << 20
    listed = (CORPUS.parent / "README.md").read_text()
    assert all(f"corpus/{name}" in listed for name in files)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_wall_clock_categories_and_rank_are_read(name, tmp_path):
    day, gpu_events, rank = EXPECTED[name]
    path = CORPUS / name
    header = trace_header(path)
    assert header.rank == rank
    merged = merge_traces([TraceInput(path)], tmp_path / "m.json.gz")
    doc = json.loads(gzip.decompress(merged.output.read_bytes()))
    first_us = min(e["ts"] for e in doc["traceEvents"] if "ts" in e and e.get("ph") == "X")
    wall = datetime.datetime.fromtimestamp((doc["baseTimeNanoseconds"] / 1000 + first_us) / 1e6, datetime.UTC)
    assert wall.date().isoformat() == day
    [summary] = summarize(merged.ranks).ranks
    assert summary.gpu_kernels == gpu_events
    if gpu_events:
        assert summary.compute_us is not None and summary.compute_us > 0
    else:
        assert summary.compute_us is None and summary.unavailable["compute_us"].startswith("no GPU")


def test_two_real_nccl_ranks_merge_with_arrows_forward(tmp_path):
    paths = [CORPUS / "hta_nccl_rank1.json.gz", CORPUS / "hta_nccl_rank0.json.gz"]
    merged = merge_traces([TraceInput(p) for p in paths], tmp_path / "m.json.gz", workers=2)
    assert [r.summary.rank for r in merged.ranks] == [0, 1]
    doc = json.loads(gzip.decompress(merged.output.read_bytes()))
    chains = defaultdict(list)
    for event in doc["traceEvents"]:
        if event.get("cat") == "collective":
            chains[event["id"]].append(event)
    assert len(chains) == merged.linked_collectives > 0
    for chain in chains.values():
        start = next(e for e in chain if e["ph"] == "s")
        end = next(e for e in chain if e["ph"] == "f")
        assert start["ts"] <= end["ts"], chain
    summary = summarize(merged.ranks)
    # Overlapping NCCL kernels only: no start skew longer than the longest of them.
    longest_kernel_us = max(e["dur"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"])
    assert summary.worst_collectives
    assert all(s.skew_us <= longest_kernel_us + CLOCK_SLACK_US for s in summary.worst_collectives)
    assert "no sequence number" in summary.collective_matching


def test_summary_only_merge_gives_the_same_summary_and_links_without_the_events(tmp_path):
    inputs = [TraceInput(CORPUS / "hta_nccl_rank0.json.gz"), TraceInput(CORPUS / "hta_nccl_rank1.json.gz")]
    full = merge_traces(inputs, tmp_path / "full.json.gz", workers=1)
    summary_only = merge_traces(inputs, tmp_path / "summary.json.gz", workers=1, timeline=False)
    assert summarize(summary_only.ranks) == summarize(full.ranks)
    assert summary_only.linked_collectives == full.linked_collectives > 0
    frame = json.loads(gzip.decompress(summary_only.output.read_bytes()))
    assert {e.get("cat") for e in frame["traceEvents"] if e.get("ph") != "M"} == {"collective"}
