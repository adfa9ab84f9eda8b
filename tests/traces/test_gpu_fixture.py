"""The summary and the merge on real traces: 12 ms of a 2-rank DDP job on 2 x H200 (bench/traces/traces_gpu.md).

The files are what on-demand Kineto wrote for `tuiprof trace --duration-ms 300`
(PyTorch 2.11, CUDA 13, NCCL 2.28), cut to a 12 ms window. The summary is
checked against a sweep over the raw events written here and against HTA's
figures for the same files (tests/traces/data/h200x2/hta_reference.json).
"""

from __future__ import annotations

import gzip
import json
import pathlib
from collections import defaultdict

import pytest

from tuiprof.analysis.trace_merge import TraceInput, merge_traces
from tuiprof.analysis.trace_summary import RankSummary, summarize

DATA = pathlib.Path(__file__).parent / "data" / "h200x2"
FILES = {0: DATA / "127.0.0.1" / "rank0-pid769_769.pt.trace.json.gz",
         1: DATA / "127.0.0.1" / "rank1-pid770_770.pt.trace.json.gz"}
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    output = tmp_path_factory.mktemp("h200") / "merged.trace.json.gz"
    result = merge_traces([TraceInput(path, "127.0.0.1", rank, 769 + rank) for rank, path in FILES.items()], output)
    return result, summarize(result.ranks), json.loads(gzip.decompress(output.read_bytes()))


def raw_gpu_events(rank: int) -> list[dict]:
    events = json.loads(gzip.decompress(FILES[rank].read_bytes()))["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]


def sweep(events: list[dict]) -> dict[str, float]:
    """Time with a compute kernel running, with NCCL and compute both running, and with nothing
    running, from one pass over the start/end boundaries (no interval unions)."""
    edges = []
    for e in events:
        kind = "comm" if "nccl" in e["name"].lower() else "memory" if e["cat"] != "kernel" else "compute"
        edges += [(e["ts"], 1, kind), (e["ts"] + e["dur"], -1, kind)]
    edges.sort(key=lambda edge: edge[0])
    active: dict[str, int] = defaultdict(int)
    totals: dict[str, float] = defaultdict(float)
    previous = edges[0][0]
    for ts, step, kind in edges:
        width = ts - previous
        if active["compute"]:
            totals["compute"] += width
        if active["comm"]:
            totals["comm"] += width
            if active["compute"]:
                totals["both"] += width
        if not any(active.values()):
            totals["idle"] += width
        active[kind] += step
        previous = ts
    totals["span"] = edges[-1][0] - edges[0][0]
    return totals


def percent(rank: RankSummary) -> dict[str, float]:
    assert rank.span_us and rank.compute_us is not None and rank.idle_us is not None
    compute, idle = 100 * rank.compute_us / rank.span_us, 100 * rank.idle_us / rank.span_us
    return {"compute_pct": compute, "idle_pct": idle, "non_compute_pct": 100 - compute - idle,
            "overlap_pct": rank.overlap_percent}


def test_summary_equals_a_sweep_over_the_raw_events(merged):
    _, summary, _ = merged
    for rank in summary.ranks:
        expected = sweep(raw_gpu_events(rank.rank))
        assert rank.gpu_kernels == len(raw_gpu_events(rank.rank))
        assert rank.span_us == pytest.approx(expected["span"], abs=0.01)
        assert rank.compute_us == pytest.approx(expected["compute"], abs=0.01)
        assert rank.communication_us == pytest.approx(expected["comm"], abs=0.01)
        assert rank.idle_us == pytest.approx(expected["idle"], abs=0.01)
        assert rank.overlap_percent == pytest.approx(100 * expected["both"] / expected["comm"], abs=0.01)


def test_comm_compute_split_agrees_with_hta(merged):
    """Within 2 points of HTA as it ships (it ceils starts and floors ends to whole µs), and
    equal to HTA with that rounding off."""
    _, summary, _ = merged
    reference = json.loads((DATA / "hta_reference.json").read_text())
    assert {r.rank for r in summary.ranks} == {0, 1}
    for rank in summary.ranks:
        ours = percent(rank)
        for key, value in reference["hta"][str(rank.rank)].items():
            assert abs(ours[key] - value) <= 2.0, (rank.rank, key, ours[key], value)
        for key, value in reference["hta_ns_rounding_off"][str(rank.rank)].items():
            assert ours[key] == pytest.approx(value, abs=0.01), (rank.rank, key)


def test_merged_trace_has_both_ranks_gpu_tracks_and_links_nccl_kernels(merged):
    result, _, document = merged
    events = document["traceEvents"]
    by_pid = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    tracks = {by_pid[e["pid"]] for e in kernels}
    assert tracks == {"rank 0 · 127.0.0.1 · GPU 0", "rank 1 · 127.0.0.1 · GPU 1"}
    nccl_at = {(e["pid"], e["ts"]) for e in kernels if "nccl" in e["name"].lower()}
    flows: dict[object, dict[str, dict]] = defaultdict(dict)
    for e in events:
        if e.get("cat") == "collective":
            flows[e["id"]][e["ph"]] = e
    assert len(flows) == result.linked_collectives >= 8
    for hops in flows.values():
        start, finish = hops["s"], hops["f"]
        assert (start["pid"], start["ts"]) in nccl_at and (finish["pid"], finish["ts"]) in nccl_at
        assert {by_pid[start["pid"]], by_pid[finish["pid"]]} == set(tracks)
