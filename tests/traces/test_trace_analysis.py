"""trace_merge and trace_summary on small hand-made Kineto-shaped traces whose answers are worked out here."""

from __future__ import annotations

import gzip
import json
import pathlib
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuiprof.analysis.trace_collectives import CLOCK_SLACK_US, CollectiveCall, best_shift, match_calls
from tuiprof.analysis.trace_merge import TraceFormatError, TraceInput, merge_traces, trace_header
from tuiprof.analysis.trace_summary import NO_GPU_EVENTS, covered, overlap, short_name, summarize, union

BASE0 = 1_795_000_000_000_000_000  # ns
BASE1 = BASE0 + 2_000  # rank 1's clock base is 2 µs later (its all-reduces still overlap rank 0's)


def kernel(name: str, ts: float, dur: float, stream: int = 7, cat: str = "kernel", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def write_trace(path: pathlib.Path, base: int, events: list[dict], rank: int | None = None,
                gz: bool = False) -> pathlib.Path:
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": base, "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, "ts": 1.0, "dur": 3.0},
        {"ph": "s", "cat": "ac2g", "name": "launch", "pid": 4242, "tid": 4242, "ts": 1.0, "id": 5},
        {"ph": "f", "cat": "ac2g", "name": "launch", "pid": 0, "tid": 7, "ts": 10.0, "id": 5, "bp": "e"},
        *events]}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank}
    data = json.dumps(doc, indent=1).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


# Rank 0, stream 7 compute, stream 20 NCCL (µs):
#   compute  [10,40) [50,70)         -> 50
#   nccl     [30,60) [100,110)       -> 40; overlap with compute [30,40)+[50,60) = 20 -> 50 %
#   memcpy   [70,80)                 -> 10
#   span [10,110) = 100; busy = [10,80)+[100,110) = 80; idle = 20
RANK0 = [
    kernel("gemm_a", 10, 30), kernel("gemm_b", 50, 20),
    kernel("ncclDevKernel_AllReduce_Sum_f32", 30, 30, stream=20, **{"Collective name": "allreduce",
                                                                      "Process Group Name": "0"}),
    kernel("ncclDevKernel_AllReduce_Sum_f32", 100, 10, stream=20, **{"Collective name": "allreduce",
                                                                       "Process Group Name": "0"}),
    kernel("Memcpy HtoD (Pageable -> Device)", 70, 10, cat="gpu_memcpy"),
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 4242, "tid": 4242, "ts": 0, "dur": 60},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 4242, "tid": 4242, "ts": 60, "dur": 80},
]
# Rank 1 (its own ts; +2 µs on rank 0's base): compute 30, and it starts the all-reduces later.
RANK1 = [
    kernel("gemm_a", 10, 30),
    kernel("ncclDevKernel_AllReduce_Sum_f32", 35, 25, stream=20, **{"Collective name": "allreduce",
                                                                      "Process Group Name": "0"}),
    kernel("ncclDevKernel_AllReduce_Sum_f32", 101, 9, stream=20, **{"Collective name": "allreduce",
                                                                      "Process Group Name": "0"}),
]


def test_interval_algebra():
    cover = union([(5, 7), (0, 2), (1, 3), (6, 9)])
    assert cover == [(0, 3), (5, 9)]
    assert covered(cover) == 7
    assert overlap(cover, union([(2, 6), (8, 20)])) == 1 + 1 + 1


@pytest.fixture
def merged(tmp_path):
    # Given in reverse rank order, rank 1 gzipped: the merge sorts by rank and reads both.
    one = write_trace(tmp_path / "r1.json.gz", BASE1, RANK1, rank=1, gz=True)
    zero = write_trace(tmp_path / "r0.json", BASE0, RANK0)
    result = merge_traces([TraceInput(one, "host-b", None, 4242), TraceInput(zero, "host-a", 0, 4242)],
                          tmp_path / "merged.json.gz")
    return result, json.loads(gzip.decompress(result.output.read_bytes()))


def test_merge_rebases_renames_and_orders_ranks(merged):
    result, doc = merged
    assert doc["baseTimeNanoseconds"] == result.base_time_ns == BASE0
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert sorted(names.values()) == ["rank 0 · host-a · CPU pid 4242 (python)", "rank 0 · host-a · GPU 0",
                                      "rank 1 · host-b · CPU pid 4242 (python)", "rank 1 · host-b · GPU 0"]
    by_name = {v: k for k, v in names.items()}
    gemm_a = {names[e["pid"]]: e["ts"] for e in events if e.get("name") == "gemm_a"}
    assert gemm_a == {"rank 0 · host-a · GPU 0": 10.0, "rank 1 · host-b · GPU 0": 12.0}
    sort = {e["pid"]: e["args"]["sort_index"] for e in events if e.get("name") == "process_sort_index"}
    assert sort[by_name["rank 0 · host-a · GPU 0"]] < sort[by_name["rank 1 · host-b · GPU 0"]]
    # Kineto's per-file flow ids (5 in both files) no longer collide.
    ac2g = {(e["id"], names[e["pid"]].split(" ·")[0]) for e in events if e.get("cat") == "ac2g"}
    assert len({flow_id for flow_id, _ in ac2g}) == 2


def test_merge_links_each_collective_occurrence_across_ranks(merged):
    result, doc = merged
    flows = [e for e in doc["traceEvents"] if e.get("cat") == "collective"]
    assert result.linked_collectives == 2
    assert sorted((e["ph"], e["ts"]) for e in flows) == [("f", 37.0), ("f", 103.0), ("s", 30.0), ("s", 100.0)]
    assert all(e.get("bp") == "e" for e in flows if e["ph"] == "f")


def test_summary_split_overlap_steps_and_skew(merged):
    result, _ = merged
    summary = summarize(result.ranks)
    r0, r1 = summary.ranks
    assert (r0.rank, r1.rank) == (0, 1)
    assert (r0.span_us, r0.compute_us, r0.communication_us, r0.memory_us, r0.idle_us) == (100, 50, 40, 10, 20)
    assert r0.overlap_percent == 50.0
    assert r0.step_time_us == 70.0 and r0.steps == 2
    assert r1.step_time_us is None and "fewer than two steps" in r1.unavailable["step_time_us"]
    assert (r1.compute_us, r1.communication_us, r1.overlap_percent) == (30, 34, pytest.approx(100 * 5 / 34, abs=0.01))
    # median compute of (50, 30) is 40
    assert (r0.compute_vs_median_percent, r1.compute_vs_median_percent) == (25.0, -25.0)
    assert r0.top_kernels[0].name == "ncclDevKernel_AllReduce_Sum_f32" and r0.top_kernels[0].total_us == 40
    # Rank 1 started both all-reduces last: by 7 µs and 3 µs on the shared clock.
    assert summary.collectives_compared == 2
    assert [(s.skew_us, s.last_rank) for s in summary.worst_collectives] == [(7.0, 1), (3.0, 1)]
    assert summary.last_starts == {"1": 2}


def test_cpu_only_trace_reports_gpu_split_unavailable(tmp_path):
    path = write_trace(tmp_path / "cpu.json", BASE0, [], rank=0)
    summary = summarize(merge_traces([TraceInput(path, "h", 0, 4242)], tmp_path / "m.json.gz").ranks)
    [rank] = summary.ranks
    assert rank.compute_us is None and rank.idle_us is None
    assert rank.unavailable["compute_us"] == NO_GPU_EVENTS
    assert [(t.name, t.total_us) for t in rank.top_cpu_ops] == [("aten::mm", 3.0)]


def test_unreadable_input_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [ {"ph": "X", ')
    with pytest.raises(TraceFormatError, match="bad.json"):
        merge_traces([TraceInput(bad)], tmp_path / "m.json.gz")


def call(name: str, end: float, seq: int | None = None, on_gpu: bool = False) -> CollectiveCall:
    return CollectiveCall("pg0", name, seq, end - 5, end, 1, 1, on_gpu)


def test_collectives_matched_across_windows_cut_at_different_calls():
    # Rank 1's window opened one all-reduce earlier: its calls end with rank 0's one position later.
    rank0 = [call("allreduce", t) for t in (100.0, 200.0, 300.0, 400.0)]
    rank1 = [call("allreduce", t) for t in (0.4, 100.3, 200.2, 300.6, 400.1)]
    keys0, keys1 = match_calls([rank0, rank1])
    assert [k[2] for k in keys0] == ["1", "2", "3", "4"]
    assert [k[2] for k in keys1] == ["0", "1", "2", "3", "4"]
    # Evenly matched calls, or too few to judge, stay in order.
    assert best_shift([10.0, 20.0], [12.0, 21.0]) == 0
    assert best_shift([10.0], [30.0, 10.0]) == 0
    # Real sequence numbers (timeline dumps) are the key as they are.
    assert match_calls([[call("x", 1, seq=7)], [call("x", 90, seq=7)]]) == [[("pg0", "x", "7")], [("pg0", "x", "7")]]


def shift_by_definition(ends: list[float], reference: list[float]) -> int:
    """best_shift's docstring, shift by shift: the smallest median gap (ties to the smaller shift), if it
    pairs enough calls and halves the unshifted gap."""
    needed = max(2, -(-3 * min(len(ends), len(reference)) // 4))
    gaps = {}
    for shift in sorted(range(-3, 4), key=abs):
        pairs = [(ends[i], reference[i + shift]) for i in range(len(ends)) if 0 <= i + shift < len(reference)]
        if len(pairs) >= needed:
            gaps[shift] = statistics.median(abs(a - b) for a, b in pairs)
    if not gaps:
        return 0
    best = min(gaps, key=lambda shift: (gaps[shift], abs(shift)))
    return best if gaps[best] <= gaps[0] / 2 else 0


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 30), st.integers(-5, 5), st.integers(-4, 4), st.sampled_from([1.0, 10.0, 250.0]),
       st.lists(st.integers(-3, 3), min_size=60, max_size=60), st.sampled_from([0.0, 1.0, 40.0, 300.0]))
def test_best_shift_is_the_smallest_median_gap(calls, more, offset, period, noise, spread):
    # Ends a period apart on both ranks, one window cut `offset` calls later, jittered (equal gaps included).
    reference = [period * i + spread * noise[i] / 3 for i in range(calls)]
    ends = [period * (i + offset) + spread * noise[-1 - i] / 3 for i in range(max(0, calls + more))]
    assert best_shift(ends, reference) == shift_by_definition(ends, reference)


def test_collectives_of_windows_that_do_not_overlap_are_not_paired():
    # Two ranks traced 5 iterations each, 200 ms apart (seen on 2 x H200): same count, no common call.
    rank0 = [call("allreduce", 200_000.0 + 3500 * i) for i in range(5)]
    rank1 = [call("allreduce", 3500.0 * i) for i in range(5)]
    keys0, keys1 = match_calls([rank0, rank1])
    assert not set(keys0) & set(keys1)
    # Spans that overlap once a host's clock is off by under CLOCK_SLACK_US still pair their calls;
    # so do calls far apart inside overlapping spans (a gloo op ends when enqueued: a late rank's
    # op can follow the others' by a whole step), and overlapping calls that start well before the
    # other rank's span (an NCCL kernel waiting 7 ms for the last rank, its first traced call).
    offset = CLOCK_SLACK_US / 2
    keys0, keys1 = match_calls([[call("allreduce", t) for t in (100.0, 200.0)],
                                [call("allreduce", t + offset) for t in (100.0, 200.0)]])
    assert keys0 == keys1 == [("pg0", "allreduce", "0"), ("pg0", "allreduce", "1")]
    keys0, keys1 = match_calls([[call("allreduce", t) for t in (0.0, 10_000.0, 20_000.0)],
                                [call("allreduce", t) for t in (800.0, 18_000.0, 20_010.0)]])
    assert keys0 == keys1
    waiting = CollectiveCall("pg0", "allreduce", None, -7_000.0, 10_000.0, 1, 1, True)
    keys0, keys1 = match_calls([[waiting, call("allreduce", 20_000.0)],
                                [call("allreduce", t) for t in (10_010.0, 20_010.0)]])
    assert keys0 == keys1


def test_gpu_collectives_that_do_not_overlap_are_not_one_operation():
    # Seen on 2 x H200: rank 1's NCCL kernel ended 116 ms before rank 0's started; the span
    # fallback (meant for gloo's CPU ops) paired them into a 164 ms "straggler".
    def calls(spans, on_gpu):
        return [CollectiveCall("pg0", "allreduce", None, start, end, 1, 1, on_gpu) for start, end in spans]

    rank0 = [(0.0, 5_000.0), (150_000.0, 164_000.0), (195_000.0, 200_000.0)]
    rank1 = [(1_000.0, 5_000.0), (10_000.0, 34_000.0), (190_000.0, 200_000.0)]
    keys0, keys1 = match_calls([calls(rank0, True), calls(rank1, True)])
    assert [a == b for a, b in zip(keys0, keys1, strict=True)] == [True, False, True]
    # As CPU ops (gloo ends once enqueued) the middle pair lies inside both ranks' spans: one collective.
    keys0, keys1 = match_calls([calls(rank0, False), calls(rank1, False)])
    assert keys0 == keys1


def test_flow_chains_run_forward_in_time(tmp_path):
    # Rank 1 starts the all-reduce first: its hop must be the chain's start.
    nccl = {"Collective name": "allreduce", "Process Group Name": "0"}
    zero = write_trace(tmp_path / "r0.json", BASE0, [kernel("ncclKernel_AllReduce", 50, 30, **nccl)], rank=0)
    one = write_trace(tmp_path / "r1.json", BASE0, [kernel("ncclKernel_AllReduce", 20, 60, **nccl)], rank=1)
    result = merge_traces([TraceInput(zero), TraceInput(one)], tmp_path / "m.json.gz")
    doc = json.loads(gzip.decompress(result.output.read_bytes()))
    flows = sorted((e for e in doc["traceEvents"] if e.get("cat") == "collective"), key=lambda e: "stf".index(e["ph"]))
    assert [f["ph"] for f in flows] == ["s", "f"]
    assert flows[0]["ts"] < flows[1]["ts"]
    summary = summarize(result.ranks)
    assert "carry no sequence number" in summary.collective_matching
    assert summary.worst_collectives[0].last_rank == 0


def test_old_kineto_category_spellings_are_gpu_work(tmp_path):
    events = [kernel("volta_sgemm_128x64_nn", 10, 30, cat="Kernel"), kernel("Memcpy HtoD", 40, 10, cat="Memcpy"),
              kernel("Memset (Device)", 50, 5, cat="Memset"),
              {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 4242, "tid": 4242, "ts": 5, "dur": 40}]
    path = write_trace(tmp_path / "old.json", BASE0, events, rank=0)
    [rank] = summarize(merge_traces([TraceInput(path)], tmp_path / "m.json.gz").ranks).ranks
    assert (rank.gpu_kernels, rank.compute_us, rank.memory_us) == (3, 30.0, 15.0)
    assert ("aten::mm", 2, 43.0) in [(t.name, t.count, t.total_us) for t in rank.top_cpu_ops]


def test_base_time_written_after_the_events_is_found(tmp_path):
    # Kineto (mid-2024 to early 2025) wrote baseTimeNanoseconds at the end, after megabytes of events.
    filler = [kernel(f"k{i}", 10 + i, 1) for i in range(20_000)]
    doc = {"schemaVersion": 1, "traceEvents": filler, "baseTimeNanoseconds": BASE0}
    path = tmp_path / "late.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert len(json.dumps(filler)) > 1 << 20
    assert trace_header(path).base_time_ns == BASE0
    assert merge_traces([TraceInput(path)], tmp_path / "m.json.gz").base_time_ns == BASE0


def test_truncated_gzip_and_non_trace_json_say_what_they_are(tmp_path):
    good = write_trace(tmp_path / "r0.json.gz", BASE0, RANK0, rank=0, gz=True)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(TraceFormatError, match="cut.json.gz: truncated gzip"):
        merge_traces([TraceInput(cut)], tmp_path / "m.json.gz")
    other = tmp_path / "package.json"
    other.write_text('{"name": "x", "version": "1"}')
    with pytest.raises(TraceFormatError, match="package.json: not a Kineto/Chrome trace"):
        merge_traces([TraceInput(other)], tmp_path / "m.json.gz")


def test_kernel_signatures_are_shortened_for_the_terminal():
    name = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
    assert short_name(name) == "at::native::vectorized_elementwise_kernel<…>"
    assert len(short_name("x" * 500)) == 60 and short_name("x" * 500).endswith("…")
    assert short_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)") == \
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
