"""Latency percentiles with a bounded error: the hook's fine window (tuiprof_segment.h) and the agent's
estimate from it (agentd/collectors/rank_rates.py).

The bound under test: a nearest-rank percentile (the ceil(q x n)-th smallest call) that falls in the
slot's fine window is estimated within 1/128 of its true value (the middle of a sub-bucket at most
1/64 of its lower edge wide), one outside it within a factor of 1.5 (the middle of a log2 bucket);
an interval's max (min) that is not exact is within 1/64 above (below) the true one in the window.
The placement of a duration is the writer's own (tp_fine_bucket, tp_hist_bucket and tp_fine_anchor
from the header, compiled here), and a job under `tuiprof run` whose every GEMM and collective takes
a chosen duration checks the whole path: hook, segment, reader, agent.
"""

from __future__ import annotations

import ctypes
import json
import math
import pathlib
import random
import subprocess
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentd.collectors import rank_rates
from native.support import gcc, remove_rank_files, segment_path, tuiprof_run, wait_for
from tuiprof_native import segment

INCLUDE = pathlib.Path(segment.__file__).parent / "include"
FINE_ERROR = 1 / 128  # a quantile in the window: half a sub-bucket, relative to the sub-bucket's lower edge
FINE_WIDTH = 1 / 64  # a sub-bucket's width relative to its lower edge: the bound of a min/max edge
LOG2_ERROR = 0.5  # a quantile in a log2 bucket [2^i, 2^(i+1)) estimated by 1.5 x 2^i
QUANTILES = (0.5, 0.9, 0.99, 1.0)
BUCKET_SHIM = """
#include "tuiprof_segment.h"
int32_t fine_bucket(uint64_t ns, uint32_t a) { return tp_fine_bucket(ns, a); }
uint32_t fine_anchor(uint64_t ns) { return tp_fine_anchor(ns); }
uint32_t hist_bucket(uint64_t ns) { return tp_hist_bucket(ns); }
"""


@pytest.fixture(scope="module")
def writer_math(tmp_path_factory) -> ctypes.CDLL:
    """The header's bucket functions, compiled as the hook compiles them."""
    out = tmp_path_factory.mktemp("bucket_math")
    (out / "shim.c").write_text(BUCKET_SHIM)
    gcc("-shared", "-fPIC", f"-I{INCLUDE}", "-o", str(out / "libshim.so"), str(out / "shim.c"))
    lib = ctypes.CDLL(str(out / "libshim.so"))
    lib.fine_bucket.argtypes, lib.fine_bucket.restype = [ctypes.c_uint64, ctypes.c_uint32], ctypes.c_int32
    lib.fine_anchor.argtypes, lib.fine_anchor.restype = [ctypes.c_uint64], ctypes.c_uint32
    lib.hist_bucket.argtypes, lib.hist_bucket.restype = [ctypes.c_uint64], ctypes.c_uint32
    return lib


def nearest_rank(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(round(q * len(ordered), 6))) - 1]


def in_window(ns: int, octave: int) -> bool:
    return 2**octave <= ns < 2 ** (octave + segment.FINE_OCTAVES)


def histograms(lib: ctypes.CDLL, values: list[int], octave: int) -> tuple[list[int], list[int]]:
    """The log2 and fine counts the writer keeps for ``values`` with its window at ``octave``."""
    hist = [0] * segment.HIST_BUCKETS
    fine = [0] * (segment.FINE_OCTAVES << segment.FINE_SUB_BITS)
    for ns in values:
        hist[lib.hist_bucket(ns)] += 1
        index = lib.fine_bucket(ns, octave)
        if index >= 0:
            fine[index] += 1
    return hist, fine


octaves = st.integers(segment.FINE_SUB_BITS, segment.HIST_BUCKETS - 1 - segment.FINE_OCTAVES)


@settings(max_examples=2000, deadline=None)
@given(ns=st.integers(1, 2**segment.HIST_BUCKETS - 1), octave=octaves)
def test_the_reader_puts_every_duration_in_the_bucket_the_writer_counted_it_in(writer_math, ns, octave):
    coarse = rank_rates.log2_edges(writer_math.hist_bucket(ns))
    assert coarse.low <= ns < coarse.high
    index = writer_math.fine_bucket(ns, octave)
    if not in_window(ns, octave):
        assert index == -1
        return
    fine = rank_rates.fine_edges(octave, index)
    assert fine.low <= ns < fine.high
    assert (fine.high - fine.low) <= fine.low * FINE_WIDTH


@given(ns=st.integers(2**7, 2 ** (segment.HIST_BUCKETS - 1) - 1))
def test_the_writer_places_its_window_around_the_call_that_places_it(writer_math, ns):
    octave = writer_math.fine_anchor(ns)
    assert in_window(ns, octave) and 2 ** (octave + 1) <= ns * 2  # one octave of room below
    assert octave + segment.FINE_OCTAVES < segment.HIST_BUCKETS  # the clamped last log2 bucket stays out


# One op's latencies: a centre (1 us .. 10 s) and spreads around it, some far outside any window.
samples = st.tuples(st.integers(1_000, 10**10),
                    st.lists(st.floats(0.7, 3.0) | st.floats(0.01, 50.0), min_size=1, max_size=400))


@settings(max_examples=300, deadline=None)
@given(drawn=samples, shift=st.integers(-2, 2))
def test_percentiles_and_extremes_are_within_the_bound(writer_math, drawn, shift):
    centre, spreads = drawn
    values = [max(1, round(centre * f)) for f in spreads]
    octave = min(max(writer_math.fine_anchor(centre) + shift, segment.FINE_SUB_BITS),
                 segment.HIST_BUCKETS - 1 - segment.FINE_OCTAVES)
    hist, fine = histograms(writer_math, values, octave)
    histogram = rank_rates.IntervalHistogram(hist, rank_rates.FineCounts(0, fine), octave)
    assert histogram.uses_fine
    for q in QUANTILES:
        true = nearest_rank(values, q)
        estimate = histogram.percentile_ns(q)
        bound = FINE_ERROR if in_window(true, octave) else LOG2_ERROR
        assert abs(estimate - true) <= true * bound, (q, true, estimate)
    far = rank_rates.Extreme(10**13, in_interval=False)  # lifetime extremes set in an earlier interval
    stats = rank_rates.latency(histogram, sum(values), len(values), rank_rates.Extreme(1, False), far)
    top, bottom = max(values), min(values)
    top_bound = FINE_WIDTH if in_window(top, octave) else 1.0
    assert top <= stats.max_seconds * 1e9 * (1 + 1e-12) <= top * (1 + top_bound) * (1 + 1e-12)
    bottom_bound = FINE_WIDTH if in_window(bottom, octave) else 0.5
    assert bottom * (1 - bottom_bound) * (1 - 1e-12) <= stats.min_seconds * 1e9 <= bottom * (1 + 1e-12)


def test_an_interval_whose_fine_counts_are_short_uses_the_log2_buckets():
    """The window was placed or moved within the interval: its counts miss the calls before."""
    octave = 10
    hist = [0] * segment.HIST_BUCKETS
    hist[11] = 5  # five calls in [2048, 4096)
    index = 1 << segment.FINE_SUB_BITS  # the first sub-bucket of octave 11: [2048, 2080)
    short = rank_rates.IntervalHistogram(hist, rank_rates.FineCounts(index, [3]), octave)  # saw 3 of 5
    assert not short.uses_fine and short.percentile_ns(0.5) == 3072
    whole = rank_rates.IntervalHistogram(hist, rank_rates.FineCounts(index, [5]), octave)
    assert whole.uses_fine and whole.percentile_ns(0.5) == 2064
    assert whole.lowest() == whole.highest() == (2048, 2080)


def fine_reading(octave: int, anchors: int, counts: dict[int, int]) -> types.SimpleNamespace:
    """A slot's fine window as the reader hands it over: the counts' non-zero span, native uint32."""
    span = range(min(counts, default=0), max(counts, default=-1) + 1)
    data = (ctypes.c_uint32 * len(span))(*(counts.get(i, 0) for i in span))
    return types.SimpleNamespace(fine_octave=octave, fine_anchors=anchors, fine_start=span.start,
                                 fine=bytes(memoryview(data).cast("B")))


def nonzero(fine: rank_rates.FineCounts) -> dict[int, int]:
    return {i: n for i, n in enumerate(fine.counts, fine.start) if n}


def test_fine_counts_subtract_modulo_2_32_and_only_under_one_placement():
    before = fine_reading(20, 2, {3: 2**32 - 1, 7: 2**32 - 3, 200: 5})
    # between the readings: 3 wrapped to exactly 0 (outside the new reading's non-zero span), 7 wrapped
    # to 4, 200 unchanged, 255 new
    assert nonzero(rank_rates.fine_delta(fine_reading(20, 2, {7: 4, 200: 5, 255: 2}), before)) == {3: 1, 7: 7, 255: 2}
    # a count that wrapped to exactly 0 between readings, the new reading empty
    assert nonzero(rank_rates.fine_delta(fine_reading(20, 2, {}), fine_reading(20, 2, {4: 2**32 - 6}))) == {4: 6}
    moved = fine_reading(18, 3, {100: 9})  # placed again in between: its counts since then
    assert rank_rates.fine_delta(moved, before) == (100, [9])
    assert nonzero(rank_rates.fine_delta(fine_reading(20, 1, {0: 1, 255: 1 << 24}), None)) == {0: 1, 255: 1 << 24}
    assert rank_rates.fine_delta(fine_reading(20, 1, {}), fine_reading(20, 1, {})).counts == []
    assert rank_rates.fine_delta(fine_reading(0, 0, {}), None) is None  # no window yet


# ---- through the real hook

SGEMM_MODEL_NS = 10_000 + 2 * 16 * 16 * 16 // 100
STEADY_CALLS = 200
MEASURED_CALLS = 3000


def nccl_ns(rng: random.Random) -> int:
    """A 256 MiB all-reduce on H200s: 1.195 ms +- 0.4 %, 3 % of calls 1.3 .. 1.6 ms."""
    if rng.random() < 0.03:
        return rng.randrange(1_300_000, 1_600_000)
    return round(1_195_000 * (1 + rng.gauss(0, 0.004)))


def sgemm_ns(rng: random.Random) -> int:
    """A GEMM of 180 us, log-normal spread, 2 % of calls 2.5 x slower (an overlapping collective)."""
    ns = 180_000 * math.exp(rng.gauss(0, 0.05)) * (2.5 if rng.random() < 0.02 else 1)
    return max(SGEMM_MODEL_NS, round(ns))


@pytest.fixture(scope="module")
def latency_job(standins, tmp_path_factory):
    """The job of tests/native/latency_job.py under `tuiprof run`, every GEMM timed: a warm-up phase (slow
    first collectives, one slow GEMM after the first: the lifetime maxima, and they place the windows
    where the later calls are not), then MEASURED_CALLS of each. Yields (phase readings of the AllReduce
    and Sgemm slots, the measured durations)."""
    rng = random.Random(29)
    warm = {"nccl": [50_000_000] * 3 + [nccl_ns(rng) for _ in range(STEADY_CALLS)],
            "sgemm": [SGEMM_MODEL_NS, 15_000_000] + [sgemm_ns(rng) for _ in range(STEADY_CALLS)]}
    measured = {"nccl": [nccl_ns(rng) for _ in range(MEASURED_CALLS)],
                "sgemm": [sgemm_ns(rng) for _ in range(MEASURED_CALLS)]}
    phases = tmp_path_factory.mktemp("latency_job") / "phases.json"
    phases.write_text(json.dumps([warm, measured]))
    proc = tuiprof_run(sys.executable, str(pathlib.Path(__file__).parent / "latency_job.py"), str(standins),
                       str(phases), options=("--gemm-sample-every", "1"), stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE)
    readings = []
    try:
        for i in range(2):  # the warm phase, then the measured one
            assert proc.stdout.readline().strip() == f"PHASE {i}"
            seg = segment.Segment(segment_path(proc.pid))
            counts = {"nccl": sum(len(p["nccl"]) for p in [warm, measured][:i + 1]),
                      "gemm": sum(len(p["sgemm"]) for p in [warm, measured][:i + 1])}

            def slots(seg=seg, counts=counts) -> dict | None:
                found = {s.kind: s for s in seg.slots() if s.op in ("AllReduce", "cublasSgemm_v2")}
                done = all(kind in found and found[kind].count == n for kind, n in counts.items())
                return found if done else None

            reading = wait_for(slots, timeout=30)
            assert reading, seg.slots()
            assert seg.header().counters.gemm_untimed == 0 and seg.header().counters.dropped_records == 0
            seg.close()
            readings.append(reading)
            proc.stdin.write("\n")
            proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        remove_rank_files(proc.pid)  # the segment and the files beside it
    yield readings, measured


@pytest.mark.parametrize("kind,durations", [("nccl", "nccl"), ("gemm", "sgemm")])
def test_the_agents_percentiles_are_within_the_bound_of_the_calls_true_ones(latency_job, kind, durations):
    readings, measured = latency_job
    truth = measured[durations]
    delta = rank_rates.SlotDelta(readings[1][kind], readings[0][kind])
    assert delta.timed == len(truth)
    assert readings[1][kind].fine_anchors == readings[0][kind].fine_anchors == 2  # moved once, in the warm-up
    fine = memoryview(readings[1][kind].fine).cast("I")  # the reader hands over the non-zero span only
    assert fine[0] and fine[-1] and readings[1][kind].fine_start + len(fine) <= segment.FINE_OCTAVES << segment.FINE_SUB_BITS
    stats = delta.latency()
    # GEMM event times travel as float milliseconds: a measured duration may be 1 ns off
    slack = 2
    for q, got in ((0.50, stats.p50_seconds), (0.99, stats.p99_seconds)):
        true = nearest_rank(truth, q)
        assert abs(got * 1e9 - true) <= true * FINE_ERROR + slack, (q, true, got)
    top = max(truth)
    assert not stats.max_exact  # the warm-up's slow call is the lifetime max: this max is a bucket edge
    assert top - slack <= stats.max_seconds * 1e9 <= top * (1 + FINE_WIDTH) + slack
    bottom = min(truth)
    if stats.min_exact:
        assert abs(stats.min_seconds * 1e9 - bottom) <= slack
    else:
        assert bottom * (1 - FINE_WIDTH) - slack <= stats.min_seconds * 1e9 <= bottom + slack
    assert stats.avg_seconds * 1e9 == pytest.approx(sum(truth) / len(truth), abs=slack)


def test_the_interval_in_which_the_window_moved_reports_log2_buckets(latency_job):
    """From the segment's creation to the warm-up's end the AllReduce window moved (50 ms first calls,
    then 1.2 ms ones): its fine counts miss the calls before the move, so the log2 buckets stand."""
    readings, _ = latency_job
    first = rank_rates.SlotDelta(readings[0]["nccl"], None)
    assert first.fine is not None and first.histogram().total == first.timed
    assert not first.histogram().uses_fine
    assert rank_rates.SlotDelta(readings[1]["nccl"], readings[0]["nccl"]).histogram().uses_fine
