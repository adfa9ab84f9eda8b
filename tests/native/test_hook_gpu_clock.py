"""GEMM timing sampling and GPU-clock placement of timeline events, against
the stand-in libraries (tests/native/standins/).

Sampling: every call of a shape is timed up to the header's gemm_timed_first,
then one in a period: --gemm-sample-every's, or by default one chosen per
shape from its kernel time (16 for long kernels, up to 1024 for short ones);
counts and FLOPs stay exact, and the timed calls' weights add up to the calls.  Placement: with
STANDIN_GPU_CLOCK=realtime:<skew> the stand-in GPU clock runs <skew> ns off
the host's, and the stand-in workload says where on that clock each of its
calls ran: the hook's events must sit there (less the skew), back to back
where the GPU ran them back to back."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from itertools import pairwise

import pytest

from agentd.collectors import rank_rates
from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from native.support import segment_path, tuiprof_run, wait_for
from tuiprof.analysis.job_ops import job_ops
from tuiprof.model.events import SnapshotReceived
from tuiprof.model.cluster import ClusterState
from tuiprof_native import segment

SGEMM = ("cublasSgemm_v2", "fp32", 1, 16, 16, 16)  # the shape run_gemm_stream calls
HELD = ("cublasSgemm_v2", "fp32", 1, 16, 16, 12)  # run_timeline's, behind its 200 ms hold
HELD_NS = 10_000 + 2 * 16 * 16 * 12 // 100
SGEMM_NS = 10_000 + 2 * 16 * 16 * 16 // 100
SGEMM_IN_WORKLOAD = 2  # run_workload's own calls of that shape, on the same thread
LONG_EXTRA_NS = 1_000_000  # STANDIN_SGEMM_SLOWER: every Sgemm 16x16x16 then takes ~1.01 ms
SKEW_NS = -3_700_000_000  # the stand-in GPU clock is 3.7 s behind the host's
GAP_NS = 50_000  # run_timeline's stream waits this long before every 4th call


def start_driver(standins, cleanup_segments, *args: str, env: dict | None = None,
                 options: tuple[str, ...] = ()) -> tuple[subprocess.Popen, dict]:
    proc = tuiprof_run(str(standins / "driver"), str(standins / "libworkload.so"), *args, options=options,
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or {})
    cleanup_segments.append(proc.pid)
    workload = json.loads(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "READY"
    return proc, workload


def slot_of(seg, key=SGEMM):
    return next((s for s in seg.slots() if (s.op, s.dtype, s.b, s.m, s.n, s.k) == key), None)


def expected_timed(calls: int, first: int, every: int) -> int:
    """Calls c = 1..calls timed by the rule: c <= first, or (c - first) a multiple of every."""
    return sum(1 for c in range(1, calls + 1) if c <= first or (c - first) % every == 0)


def test_sampling_times_the_first_calls_then_one_in_n_and_counts_all(standins, cleanup_segments):
    proc, _ = start_driver(standins, cleanup_segments, "100", "0", options=("--gemm-sample-every", "8"))
    try:
        assert proc.stdout.readline().strip() == "DONE"
        calls = SGEMM_IN_WORKLOAD + 100
        with segment.Segment(segment_path(proc.pid)) as seg:
            header = seg.header()
            assert (header.gemm_timed_first, header.gemm_sample_every, header.gemm_sample_max) == (32, 8, 0)
            timed = expected_timed(calls, 32, 8)
            assert timed == 32 + 8  # 33..102: 40, 48, ..., 96
            # the writer folds counts a pass after the calls: wait for both, then check everything
            assert wait_for(lambda: (s := slot_of(seg)) is not None and (s.count, s.timed_count) == (calls, timed - 1))
            s = slot_of(seg)
            assert (s.count, s.timed_count) == (calls, timed - 1)  # the first call is kept apart
            assert s.flops == calls * 2 * 16 ** 3 and s.timed_flops == (timed - 1) * 2 * 16 ** 3
            assert s.total_ns == (timed - 1) * SGEMM_NS
            events = [e for e in seg.events(kind="gemm") if (e.op, e.dtype, e.b, e.m, e.n, e.k) == SGEMM]
            assert len(events) == timed  # calls sampled out are counted, not in the ring
            assert seg.header().counters.gemm_untimed == 0  # sampled out is not "untimed"
            assert s.sample_every == 8  # fixed: short kernels (10 us) would get 1024 by default
    finally:
        proc.communicate("\n", timeout=10)


def test_weighted_sums_give_all_calls_mean_when_the_first_calls_are_faster(standins, cleanup_segments):
    """A burst whose first 32 calls run at a boost clock (10 us faster): the timed calls, each
    weighted by the calls it stands for, give the mean and TFLOPS of all calls; the plain mean
    over the timed calls would count each fast call as much as 16 slow ones."""
    extra_ns, every = 10_000, 16
    calls = 32 + 23 * every  # the last call is a sampled one: the timed calls stand for every call
    fast, slow = SGEMM_NS, SGEMM_NS + extra_ns
    proc, _ = start_driver(standins, cleanup_segments, str(calls - SGEMM_IN_WORKLOAD), "0",
                           options=("--gemm-sample-every", str(every)),
                           env={"STANDIN_SGEMM_SLOWER": f"32:{extra_ns}"})
    try:
        assert proc.stdout.readline().strip() == "DONE"
        with segment.Segment(segment_path(proc.pid)) as seg:
            timed = expected_timed(calls, 32, every)
            assert wait_for(lambda: (s := slot_of(seg)) is not None and (s.count, s.timed_count) == (calls, timed - 1))
            s = slot_of(seg)
    finally:
        proc.communicate("\n", timeout=10)
    # calls 2..calls (the first is kept apart): 31 fast, the rest slow
    true_ns = 31 * fast + (calls - 32) * slow
    assert s.first_call_ns == fast and s.timed_count == 31 + 23
    assert (s.weighted_timed_count, s.weighted_total_ns) == (calls - 1, true_ns)
    assert s.weighted_timed_flops == (calls - 1) * 2 * 16 ** 3
    assert s.total_ns == 31 * fast + 23 * slow  # per timed call, as the histogram and min/max
    stats = rank_rates.gemm_stats(rank_rates.SlotDelta(s, None), seconds=1.0)
    true_mean_s = true_ns / (calls - 1) * 1e-9
    assert stats.latency.avg_seconds == pytest.approx(true_mean_s, rel=1e-9)
    assert stats.tflops == pytest.approx(2 * 16 ** 3 / true_mean_s / 1e12, rel=1e-9)
    assert (stats.latency.min_seconds, stats.latency.max_seconds) == (fast * 1e-9, slow * 1e-9)
    assert stats.timed_count_interval == 31 + 23
    assert s.total_ns / s.timed_count < 0.8 * true_ns / (calls - 1)  # unweighted: the fast calls pull it down


def test_calls_due_in_graph_capture_pass_their_weight_to_the_next_timed_one(standins, cleanup_segments):
    """1 in 8; the stream is in CUDA-graph capture for the shape's calls 39..50: calls 40 and 48 are due
    but cannot be timed (counted as untimed), so call 56, the next timed one, stands for calls 33..56."""
    proc, _ = start_driver(standins, cleanup_segments, "captured", "110", "36", "48",
                           options=("--gemm-sample-every", "8"))
    calls = SGEMM_IN_WORKLOAD + 110  # stream call i is the shape's call i + 3
    try:
        assert proc.stdout.readline().strip() == "DONE"
        with segment.Segment(segment_path(proc.pid)) as seg:
            timed = expected_timed(calls, 32, 8) - 2
            assert wait_for(lambda: (s := slot_of(seg)) is not None and (s.count, s.timed_count) == (calls, timed - 1))
            s = slot_of(seg)
            assert seg.header().counters.gemm_untimed == 2
    finally:
        proc.communicate("\n", timeout=10)
    assert calls == 32 + 10 * 8  # the last call is a timed one
    assert (s.weighted_timed_count, s.weighted_total_ns) == (calls - 1, (calls - 1) * SGEMM_NS)


def test_a_bad_sampling_period_is_one_line_and_the_default(standins, cleanup_segments):
    proc, _ = start_driver(standins, cleanup_segments, env={"TUIPROF_GEMM_SAMPLE_EVERY": "0"})
    _, err = proc.communicate("\n", timeout=10)
    assert proc.returncode == 0
    assert err.strip() == ("tuiprof: TUIPROF_GEMM_SAMPLE_EVERY=0 is not a whole number from 1 to 1000000; "
                           "timing 1 GEMM call in 16 to 1024 per shape, by its kernel time")
    with segment.Segment(segment_path(proc.pid)) as seg:
        assert (seg.header().gemm_sample_every, seg.header().gemm_sample_max) == (16, 1024)


@contextlib.contextmanager
def _phased(standins, cleanup_segments, then: int, env: dict | None = None) -> Iterator[segment.Segment]:
    """The driver's segment, with the default sampling, after the Sgemm 16x16x16 shape's first 32 calls
    (all timed) were folded -- so its period is settled -- and `then` more were folded; the process
    lives until the block ends."""
    first = 32 - SGEMM_IN_WORKLOAD
    proc, _ = start_driver(standins, cleanup_segments, "phases", str(first), str(then), env=env)
    calls = 32 + then
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "PHASE"
        with segment.Segment(segment_path(proc.pid)) as seg:
            assert wait_for(lambda: (s := slot_of(seg)) is not None and s.timed_count == 31), slot_of(seg)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "DONE"
            assert wait_for(lambda: (s := slot_of(seg)) is not None and s.count == calls
                            and s.weighted_timed_count == calls - 1), slot_of(seg)
            yield seg
    finally:
        proc.communicate("\n", timeout=10)


def test_short_kernels_get_a_longer_period_and_the_weights_add_up_to_the_calls(standins, cleanup_segments):
    """Kernels of ~10 us: timing 1 in 16 would cost 3.34 us / (16 x 10 us) = 2 % of their GPU time, so
    the shape's period goes to the longest, 1024 (0.03 %); each timed call stands for 1024 calls. The
    agent passes the period on and the console's row shows it."""
    collector = RanksCollector(0.1)
    with _phased(standins, cleanup_segments, 3 * 1024) as seg:
        s, header = slot_of(seg), seg.header()
        collector.collect()
        snapshot = pb.HostSnapshot(hostname="n1")
        collector.fill(snapshot)
        pid = header.pid
    calls = 32 + 3 * 1024
    assert (header.gemm_sample_every, header.gemm_sample_max) == (16, 1024)
    assert s.sample_every == 1024
    assert (s.count, s.timed_count) == (calls, 31 + 3)  # the first call is kept apart
    assert (s.weighted_timed_count, s.weighted_total_ns) == (calls - 1, (calls - 1) * SGEMM_NS)
    assert s.weighted_timed_flops == (calls - 1) * 2 * 16 ** 3
    [rank] = [r for r in snapshot.ranks if r.pid == pid]
    assert (rank.hook.gemm_sample_every, rank.hook.gemm_sample_max) == (16, 1024)
    cluster = ClusterState(["n1"])
    cluster.apply(SnapshotReceived("n1", 1.0, snapshot))
    [row] = [r for r in job_ops(cluster) if r.pid == pid and r.op == "cublasSgemm_v2 fp32 b=1 m=16 n=16 k=16"]
    assert row.timing is not None and row.timing.rate == "1 in 1024"
    assert ("every call of a shape timed up to 32, then 1 in 1024 (chosen for this shape from its kernel time)"
            in row.timing.describe())


def test_long_kernels_keep_one_in_16(standins, cleanup_segments):
    """Kernels of ~1.01 ms: 1 in 16 already costs 3.34 us / 16 ms = 0.02 %, under the budget."""
    with _phased(standins, cleanup_segments, 5 * 16, env={"STANDIN_SGEMM_SLOWER": f"0:{LONG_EXTRA_NS}"}) as seg:
        s = slot_of(seg)
    calls = 32 + 5 * 16
    assert s.sample_every == 16
    assert (s.count, s.timed_count) == (calls, 31 + 5)
    assert (s.weighted_timed_count, s.weighted_total_ns) == (calls - 1, (calls - 1) * (SGEMM_NS + LONG_EXTRA_NS))


def test_weights_stand_for_exactly_the_calls_since_the_previous_timed_one_while_the_period_moves(
        standins, cleanup_segments):
    """3000 calls with no pause: the period moves from 16 to 1024 whenever the writer has folded the
    first calls' times. Whatever periods were in force, the weights of the timed calls add up to every
    call but those after the last timed one (the ring says which call that was: its launch number)."""
    proc, _ = start_driver(standins, cleanup_segments, "3000", "0")
    calls = SGEMM_IN_WORKLOAD + 3000
    try:
        assert proc.stdout.readline().strip() == "DONE"
        with segment.Segment(segment_path(proc.pid)) as seg:
            assert wait_for(lambda: (s := slot_of(seg)) is not None and s.count == calls)
            # every GEMM of the process: those folded, and the workload's one on its stalled stream
            launches = (sum(x.count for x in seg.slots() if x.kind == "gemm")
                        + sum(i.pending for i in seg.inflight() if i.kind == "gemm"))
            # the last timed call folded: nothing of this shape is pending once the ring's count is stable
            assert wait_for(lambda: len([e for e in seg.events(kind="gemm") if (e.op, e.dtype, e.b, e.m, e.n, e.k)
                                         == SGEMM]) == slot_of(seg).timed_count + 1)
            s = slot_of(seg)
            last_timed = max(e.op_seq for e in seg.events(kind="gemm") if (e.op, e.dtype, e.b, e.m, e.n, e.k) == SGEMM)
    finally:
        proc.communicate("\n", timeout=10)
    after_last_timed = launches - last_timed  # the shape's calls are the process's last launches
    assert s.sample_every == 1024
    assert s.weighted_timed_count + 1 + after_last_timed == calls  # + 1: the first call, kept apart
    assert s.weighted_total_ns == s.weighted_timed_count * SGEMM_NS
    assert 31 + 2 <= s.timed_count < 31 + (3000 - 30) // 16  # some at 16 or more, the rest at 1024


def test_events_sit_where_the_gpu_clock_ran_them(standins, cleanup_segments):
    proc, _ = start_driver(standins, cleanup_segments, "timeline", "12",
                           env={"STANDIN_GPU_CLOCK": f"realtime:{SKEW_NS}"})
    try:
        ran = json.loads(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "DONE"
        with segment.Segment(segment_path(proc.pid)) as seg:
            def on_stream() -> list:
                return [e for e in seg.events(kind="gemm") if e.stream == ran["stream"]]
            assert wait_for(lambda: len(on_stream()) == 12, timeout=20), on_stream()
            events = on_stream()
    finally:
        proc.communicate("\n", timeout=10)
    for event, (gpu_start, gpu_end) in zip(events, ran["calls"], strict=True):
        # the anchor's CPU reading is the only error: well under the writer's 100 us poll
        assert abs(event.start_ns - (gpu_start - SKEW_NS)) < 20_000, (event, gpu_start - SKEW_NS)
        # elapsed times from the anchor travel as float ms: a few tens of ns of rounding
        assert abs((event.end_ns - event.start_ns) - (gpu_end - gpu_start)) <= 100
    for i, (before, after) in enumerate(pairwise(events), start=1):
        assert after.start_ns >= before.end_ns  # one lane, no overlap
        gap = GAP_NS if i % 4 == 0 else 0
        assert abs((after.start_ns - before.end_ns) - gap) <= 100, (i, before, after)


def test_the_first_call_stays_apart_when_counts_reach_the_slot_before_it_finishes(standins, cleanup_segments):
    """100 calls queued behind a 200 ms hold: the 68 sampled-out calls are counted into the slot at once,
    the timed ones (the first among them) only finish after the hold."""
    proc, _ = start_driver(standins, cleanup_segments, "timeline", "100", options=("--gemm-sample-every", "8"),
                           env={"STANDIN_GPU_CLOCK": "realtime:0"})
    try:
        proc.stdout.readline()
        assert proc.stdout.readline().strip() == "DONE"
        with segment.Segment(segment_path(proc.pid)) as seg:
            timed = expected_timed(100, 32, 8)
            assert wait_for(lambda: (s := slot_of(seg, HELD)) is not None and (s.count, s.timed_count) == (100, timed - 1),
                            timeout=20)
            s = slot_of(seg, HELD)
            assert (s.count, s.first_call_ns) == (100, HELD_NS)
            assert s.total_ns == (timed - 1) * HELD_NS
            firsts = [e for e in seg.events(kind="gemm") if e.first_call and (e.m, e.n, e.k) == HELD[3:]]
            assert len(firsts) == 1
    finally:
        proc.communicate("\n", timeout=10)


def test_counts_of_threads_that_exited_are_all_in_the_slot(standins, cleanup_segments):
    """20 threads one after another, 40 calls each: 8 per thread only counted, in the thread's table,
    which its exit hands back for the next thread once the writer has folded its counts."""
    proc, _ = start_driver(standins, cleanup_segments, "threads", "20", "40")
    try:
        assert proc.stdout.readline().strip() == "DONE"
        with segment.Segment(segment_path(proc.pid)) as seg:
            shape = ("cublasSgemm_v2", "fp32", 1, 16, 16, 8)
            assert wait_for(lambda: (s := slot_of(seg, shape)) is not None and s.count == 20 * 40), slot_of(seg, shape)
            s = slot_of(seg, shape)
            # each thread times its first 32 calls; the slot's first call is kept apart
            assert (s.count, s.timed_count) == (800, 20 * 32 - 1)
            assert s.flops == 800 * 2 * 16 * 16 * 8
    finally:
        proc.communicate("\n", timeout=10)


def test_the_anchor_is_renewed_so_a_drifting_gpu_clock_stays_placed(standins, cleanup_segments):
    """A GPU clock 0.5 % fast (5 ms a second) and 30 calls (all timed: under 32) 120 ms apart: one anchor
    for all would place the last calls ~17 ms late; renewed every second, no call is more than ~1.1 s of
    drift off."""
    drift_ppm = 5000
    proc, _ = start_driver(standins, cleanup_segments, "paced", "30", "120000",
                           env={"STANDIN_GPU_CLOCK": f"realtime:0:{drift_ppm}"})
    try:
        ran = json.loads(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "DONE"
        with segment.Segment(segment_path(proc.pid)) as seg:
            def on_stream() -> list:
                return [e for e in seg.events(kind="gemm") if e.stream == ran["stream"]]
            assert wait_for(lambda: len(on_stream()) == 30, timeout=20), on_stream()
            events = on_stream()
    finally:
        proc.communicate("\n", timeout=10)
    errors = [e.start_ns - launched for e, launched in zip(events, ran["launched"], strict=True)]
    span_s = (ran["launched"][-1] - ran["launched"][0]) / 1e9
    assert span_s > 3.3
    bound = 1.3 * drift_ppm * 1e3  # ns of drift in 1.3 s: the renewal period and a writer pass or two
    assert max(abs(e) for e in errors) < bound, errors
