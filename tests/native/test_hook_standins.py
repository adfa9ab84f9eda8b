"""libtuiprof_hook.so under `tuiprof run`, against stand-in cuBLAS/cuBLASLt,
CUDA runtime and NCCL 2.28 libraries, checked through the segment reader.

The workload (tests/native/standins/workload.c) is fixed, so every count,
shape, FLOP and byte figure below is known in advance; the stand-in kernel
time of a GEMM is 10 us + 2*b*m*n*k/100 ns, and of each collective the GPU
time the stand-in NCCL reports through its kernel-channel events."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from native.support import remove_rank_files, segment_path, tuiprof_run, wait_for
from tuiprof_native import segment

# (op, dtype, b, m, n, k, count) of the finished GEMMs
GEMMS = [
    ("cublasGemmEx", "bf16", 1, 64, 32, 16, 5),
    ("cublasGemmStridedBatchedEx", "fp16", 4, 8, 8, 8, 3),
    ("cublasSgemm_v2", "fp32", 1, 16, 16, 16, 2),
    ("cublasLtMatmul", "bf16", 1, 32, 16, 8, 4),
    ("cublasLtMatmul", "fp32", 2, 16, 8, 4, 2),
]
# (op, dtype, algo, proto, count, bytes per op (nccl-tests size), GPU ns)
COLLECTIVES = [
    ("AllReduce", "bf16", "RING", "SIMPLE", 3, 1024 * 2, 50_000),
    ("AllGather", "fp32", "RING", "LL", 2, 256 * 4 * 4, 20_000),
    ("ReduceScatter", "fp32", "RING", "LL128", 1, 512 * 4 * 4, 30_000),
    ("Send", "int8", "", "", 2, 100, 5_000),
]
COMM_HASH = 0xABCDEF12345


def kernel_ns(b: int, m: int, n: int, k: int) -> int:
    return 10_000 + 2 * b * m * n * k // 100


def run_driver(standins, cleanup_segments: list[int], hooked: bool):
    """Run the driver up to READY; return (its JSON line, the process)."""
    cmd = [str(standins / "driver"), str(standins / "libworkload.so")]
    if hooked:
        proc = tuiprof_run(*cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    else:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    cleanup_segments.append(proc.pid)
    result = json.loads(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "READY"
    return result, proc


@pytest.fixture(scope="module")
def hooked_run(standins):
    """One hooked run, shared by the read-only checks: (JSON line, Segment, process)."""
    pids: list[int] = []
    result, proc = run_driver(standins, pids, hooked=True)
    seg = segment.Segment(segment_path(proc.pid))

    def all_recorded() -> bool:
        return sum(s.count for s in seg.slots()) == sum(g[-1] for g in GEMMS) + sum(c[4] for c in COLLECTIVES)

    assert wait_for(all_recorded), seg.slots()
    assert wait_for(lambda: len(seg.inflight()) == 2), seg.inflight()
    yield result, seg, proc
    seg.close()
    proc.stdin.write("\n")
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    remove_rank_files(proc.pid)


def test_host_results_untouched(standins, cleanup_segments, hooked_run):
    plain, proc = run_driver(standins, cleanup_segments, hooked=False)
    proc.communicate("\n", timeout=10)
    hooked, _, _ = hooked_run
    assert plain["max_error"] == 0 and hooked["max_error"] == 0
    assert segment_path(proc.pid).exists() is False  # no segment without the hook


def test_disabled_hook_is_inert(standins, cleanup_segments):
    cmd = [str(standins / "driver"), str(standins / "libworkload.so")]
    proc = tuiprof_run(*cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"TUIPROF_DISABLE": "1"})
    cleanup_segments.append(proc.pid)
    out, _ = proc.communicate("\n", timeout=30)
    result = json.loads(out.splitlines()[0])
    assert proc.returncode == 0 and result["max_error"] == 0
    assert result["lt_getattr_same_descriptors"] == 0  # shapes never read: nothing recorded
    assert not segment_path(proc.pid).exists()


def test_gemm_counts_shapes_flops_and_times(hooked_run):
    _, seg, proc = hooked_run
    header = seg.header()
    assert header.pid == proc.pid
    assert header.flags & segment.FLAG_CUDA_TIMING
    gemms = {(s.op, s.dtype, s.b, s.m, s.n, s.k): s for s in seg.slots() if s.kind == "gemm"}
    assert sorted(gemms) == sorted(g[:6] for g in GEMMS)
    for op, dtype, b, m, n, k, count in GEMMS:
        s = gemms[(op, dtype, b, m, n, k)]
        # the first call of each slot is kept apart (it includes lazy module loading on a GPU)
        steady = count - 1
        assert (s.count, s.timed_count) == (count, steady)
        assert s.flops == count * 2 * b * m * n * k
        assert s.timed_flops == steady * 2 * b * m * n * k
        # event times travel as float milliseconds: allow 1 ns per op of rounding
        assert abs(s.first_call_ns - kernel_ns(b, m, n, k)) <= 1
        assert abs(s.total_ns - steady * kernel_ns(b, m, n, k)) <= steady
        assert abs(s.min_ns - kernel_ns(b, m, n, k)) <= 1 and abs(s.max_ns - kernel_ns(b, m, n, k)) <= 1
        assert sum(s.hist) == steady
        assert s.hist[kernel_ns(b, m, n, k).bit_length() - 1] == steady
        # every call timed (fewer than 32 per shape): each stands for itself
        assert (s.weighted_timed_count, s.weighted_total_ns, s.weighted_timed_flops) == (
            s.timed_count, s.total_ns, s.timed_flops)
    assert header.counters.gemm_untimed == 0


def test_lt_shapes_read_once_per_descriptor(hooked_run):
    result, _, _ = hooked_run
    # 1 transa + 3 for A (type, rows, cols) + 3 for D (rows, cols, batch), for 4 calls on the same descriptors
    assert result["lt_getattr_same_descriptors"] == 7


def check_collectives(result: dict, seg) -> None:
    header = seg.header()
    assert header.flags & segment.FLAG_NCCL_PLUGIN and header.flags & segment.FLAG_NCCL_GPU_TIME
    assert result["cuda_events_during_nccl"] == 0  # nothing recorded on NCCL streams
    assert result["unexpected_nccl_handles"] == 0  # only the event types asked for got handles
    counters = header.counters
    assert (counters.nccl_channel_shortfall, counters.nccl_late_channels, counters.nccl_untimed) == (0, 0, 0)
    nccl = {s.op: s for s in seg.slots() if s.kind == "nccl"}
    assert sorted(nccl) == sorted(c[0] for c in COLLECTIVES)
    for op, dtype, algo, proto, count, size, gpu_ns in COLLECTIVES:
        s = nccl[op]
        assert (s.dtype, s.algo, s.proto, s.nranks, s.comm_hash) == (dtype, algo, proto, 4, COMM_HASH)
        assert (s.count, s.timed_count) == (count, count)
        assert s.bytes == count * size
        assert (s.min_ns, s.max_ns, s.total_ns) == (gpu_ns, gpu_ns, count * gpu_ns)
        # collectives are never sampled: weight 1 each
        assert (s.weighted_timed_count, s.weighted_total_ns, s.weighted_timed_bytes) == (
            s.timed_count, s.total_ns, s.timed_bytes)


def test_nccl_collectives_from_profiler_plugin_v5(hooked_run):
    result, seg, _ = hooked_run
    check_collectives(result, seg)


def test_nccl_collectives_from_profiler_plugin_v4(standins_v4, cleanup_segments):
    result, proc = run_driver(standins_v4, cleanup_segments, hooked=True)
    try:
        with segment.Segment(segment_path(proc.pid)) as seg:
            expected = sum(c[4] for c in COLLECTIVES)
            assert wait_for(lambda: sum(s.count for s in seg.slots() if s.kind == "nccl") == expected)
            check_collectives(result, seg)
            assert wait_for(lambda: {e.op for e in seg.inflight()} == {"cublasGemmEx", "AllReduce"})
    finally:
        proc.communicate("\n", timeout=10)


def test_inflight_shows_the_ops_that_never_finish(hooked_run):
    result, seg, _ = hooked_run
    inflight = {e.kind: e for e in seg.inflight()}
    assert set(inflight) == {"gemm", "nccl"}
    gemm, coll = inflight["gemm"], inflight["nccl"]
    assert (gemm.op, gemm.key, gemm.pending) == ("cublasGemmEx", result["stalled_stream"], 1)
    assert gemm.op_seq == sum(g[-1] for g in GEMMS) + 1  # the 17th GEMM launched
    assert (coll.op, coll.key, coll.pending) == ("AllReduce", COMM_HASH, 1)
    assert coll.op_seq == 3  # AllReduce #0..2 finished; NCCL numbers per op type from 0
    now = time.time_ns()
    assert 0 < now - gemm.launched_ns < 60e9 and 0 < now - coll.launched_ns < 60e9


def test_ring_holds_every_event_in_order(hooked_run):
    _, seg, _ = hooked_run
    events = seg.events()
    assert [e.index for e in events] == list(range(len(events)))
    assert len(events) == sum(g[-1] for g in GEMMS) + sum(c[4] for c in COLLECTIVES)
    gemm_events = [e for e in events if e.kind == "gemm"]
    assert [e.op_seq for e in gemm_events] == list(range(1, len(gemm_events) + 1))
    assert all(e.start_ns <= e.end_ns for e in events)
    first_calls = [(e.op, e.dtype, e.b, e.m, e.n, e.k) for e in events if e.first_call]
    assert sorted(first_calls) == sorted(g[:6] for g in GEMMS)  # one per GEMM slot, no collective
    seen: set = set()
    for e in gemm_events:  # each flagged event is its slot's first
        key = (e.op, e.dtype, e.b, e.m, e.n, e.k)
        assert e.first_call == (key not in seen)
        seen.add(key)
    allreduce = [e for e in events if e.op == "AllReduce"]
    assert [e.op_seq for e in allreduce] == [0, 1, 2]
    assert all(e.rank == 1 and e.comm_hash == COMM_HASH for e in allreduce)
    assert all(e.end_ns - e.start_ns == 50_000 for e in allreduce)


def test_segment_outlives_the_process_with_clean_exit_flag(standins, cleanup_segments):
    result, proc = run_driver(standins, cleanup_segments, hooked=True)
    proc.communicate("\n", timeout=10)
    assert proc.returncode == 0
    with segment.Segment(segment_path(proc.pid)) as seg:
        assert seg.header().flags & segment.FLAG_EXITED
        assert sum(s.count for s in seg.slots() if s.kind == "gemm") == sum(g[-1] for g in GEMMS)
