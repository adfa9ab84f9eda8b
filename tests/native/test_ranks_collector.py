"""agentd's ranks collector: rate arithmetic, a real agentd reading a stand-in
job's segment over gRPC and /metrics, and a killed rank reported as exited
then cleaned up."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from agentd.collectors import rank_rates
from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from native.support import segment_path, stand_in_rank, tuiprof_run, wait_for, watch_rank
from testkit.agents import running_agent
from tuiprof_native import segment


def test_mean_step_time_from_the_hooks_counters():
    def counters(steps: int, total_ns: int) -> segment.Counters:
        return segment.Counters(steps, total_ns, *[0] * 12)

    assert rank_rates.mean_step_seconds(counters(1, 0), None) is None  # the first step closes no interval
    assert rank_rates.mean_step_seconds(counters(3, 4_000_000_000), None) == pytest.approx(2.0)
    assert rank_rates.mean_step_seconds(counters(5, 7_000_000_000), counters(3, 4_000_000_000)) == pytest.approx(1.5)
    assert rank_rates.mean_step_seconds(counters(5, 7_000_000_000), counters(5, 7_000_000_000)) is None
    assert rank_rates.mean_step_seconds(counters(6, 1), counters(5, 7_000_000_000)) is None  # went backwards


def test_busbw_factors_are_nccl_tests():
    assert rank_rates.busbw_factor("AllReduce", 8) == pytest.approx(2 * 7 / 8)
    assert rank_rates.busbw_factor("AllGather", 4) == pytest.approx(3 / 4)
    assert rank_rates.busbw_factor("ReduceScatter", 2) == pytest.approx(1 / 2)
    assert rank_rates.busbw_factor("Broadcast", 8) == 1.0
    assert rank_rates.busbw_factor("Send", 2) == 1.0


def test_percentiles_are_log2_bucket_middles_without_a_fine_window():
    hist = [0] * 40
    hist[10] = 100  # 100 values in [1024, 2048)
    log2 = rank_rates.IntervalHistogram(hist, None, 0)
    assert log2.percentile_ns(0.5) == pytest.approx(1024 + 1024 * 0.5)
    hist[20] = 1  # one outlier in [1 Mi, 2 Mi)
    log2 = rank_rates.IntervalHistogram(hist, None, 0)
    assert log2.percentile_ns(0.99) < 2048 < log2.percentile_ns(1.0)
    assert rank_rates.IntervalHistogram([0] * 40, None, 0).percentile_ns(0.5) is None
    Extreme = rank_rates.Extreme
    total_ns = 100 * 1500 + 1_500_000
    stats = rank_rates.latency(log2, total_ns, weighted_timed=101, lifetime_min=Extreme(1100, in_interval=True),
                               lifetime_max=Extreme(1_500_000, in_interval=True))
    assert stats.min_seconds == pytest.approx(1100e-9) and stats.max_seconds == pytest.approx(1.5e-3)
    assert stats.min_exact and stats.max_exact
    assert stats.avg_seconds == pytest.approx((150_000 + 1_500_000) / 101 * 1e-9)


def test_latency_extremes_are_exact_only_when_set_in_the_interval():
    """The slowest call ever (a 127 ms first call) was in an earlier interval: this interval's
    max is a bound (its top bucket's edge, 2^21 ns), said so; its own new min is exact."""
    hist = [0] * 40
    hist[20] = 3  # three calls in [1.05 ms, 2.10 ms)
    log2 = rank_rates.IntervalHistogram(hist, None, 0)
    stats = rank_rates.latency(log2, weighted_ns=4_500_000, weighted_timed=3,
                               lifetime_min=rank_rates.Extreme(1_100_000, in_interval=True),
                               lifetime_max=rank_rates.Extreme(127_000_000, in_interval=False))
    assert stats.min_seconds == pytest.approx(1.1e-3) and stats.min_exact
    assert stats.max_seconds == pytest.approx(2**21 * 1e-9) and not stats.max_exact
    bounded = rank_rates.latency(log2, weighted_ns=4_500_000, weighted_timed=3,
                                 lifetime_min=rank_rates.Extreme(900_000, in_interval=False),
                                 lifetime_max=rank_rates.Extreme(1_562_000, in_interval=False))
    assert bounded.min_seconds == pytest.approx(2**20 * 1e-9) and not bounded.min_exact  # bucket edge > 0.9 ms
    assert bounded.max_seconds == pytest.approx(1.562e-3) and not bounded.max_exact  # clamped to the lifetime max


@pytest.fixture
def stand_in_job(standins):
    """The stand-in driver under `tuiprof run`, alive until the test ends."""
    with stand_in_rank(standins) as process:
        yield process


async def test_agent_reports_stand_in_job_over_grpc_and_metrics(tmp_path, stand_in_job):
    pid = stand_in_job.pid
    with running_agent(tmp_path) as agent:
        rank = await watch_rank(agent, pid, lambda r: len(r.nccl) == 4)
        assert rank.state == pb.RANK_STATE_RUNNING and rank.heartbeat_age_seconds < 5
        gemm = {(g.op, g.shape): g for g in rank.gemm}
        gemm_ex = gemm[("cublasGemmEx", "b=1 m=64 n=32 k=16")]
        assert gemm_ex.count_total == 5
        assert gemm_ex.timed_count_total == 4  # all timed (under the 32 always-timed calls), the first apart
        # the stand-in's kernel time for the shape; the first call is shown apart, not in the latency
        assert gemm_ex.first_call_seconds == pytest.approx((10_000 + 2 * 64 * 32 * 16 // 100) * 1e-9, abs=1e-9)
        assert gemm[("cublasLtMatmul", "b=2 m=16 n=8 k=4")].flops_total == 2 * 2 * 2 * 16 * 8 * 4
        allreduce = next(n for n in rank.nccl if n.op == "AllReduce")
        assert (allreduce.count_total, allreduce.algorithm, allreduce.comm_size) == (3, "RING", 4)
        # 2048 bytes in 50 us each; all counted since the segment's start in the first reading, after that
        # intervals with no new collectives have no timed bytes: bandwidth is then unavailable, not 0
        if allreduce.HasField("algbw_bytes_per_s"):
            assert allreduce.algbw_bytes_per_s == pytest.approx(2048 / 50e-6)
            assert allreduce.busbw_bytes_per_s == pytest.approx(2048 / 50e-6 * 1.5)
        inflight = {op.kind: op for op in rank.inflight}
        assert inflight["nccl"].op == "AllReduce" and inflight["nccl"].sequence == 3
        assert inflight["gemm"].age_seconds > 0
        # the hook's account of itself: timing it has, and what is launched and not finished (the job is
        # stopped at READY, so the segment read now says what the agent read)
        assert (rank.hook.cuda_timing, rank.hook.nccl_plugin, rank.hook.nccl_gpu_timers) == (True, True, True)
        with segment.Segment(segment_path(pid)) as seg:
            pending = sum(entry.pending for entry in seg.inflight())
            counters = seg.header().counters
        assert rank.hook.pending == pending >= 2
        assert (rank.hook.gemm_untimed_total, rank.hook.dropped_records_total) == (counters.gemm_untimed,
                                                                                   counters.dropped_records)
        assert rank.hook.inactive_reason == ""
        assert (rank.hook.gemm_timed_first_calls, rank.hook.gemm_sample_every) == (32, 16)
        with urllib.request.urlopen(f"{agent.metrics_url}/metrics", timeout=10) as response:
            text = response.read().decode()
        lines = [line for line in text.splitlines() if f'pid="{pid}"' in line]
        assert any(line.startswith("tuiprof_rank_nccl_calls_total{") and 'algorithm="RING"' in line
                   and 'op="AllReduce"' in line and line.endswith(" 3") for line in lines), lines
        assert any(line.startswith("tuiprof_rank_gemm_calls_total{") and 'dtype="bf16"' in line for line in lines)


SLEEPER = ("import ctypes, os, sys, time; lib = ctypes.CDLL(os.environ['TUIPROF_HOOK_LIBRARY']); "
           "lib.tuiprof_record_step(); print('ready', flush=True); time.sleep(60)")


def stepped_sleeper(cleanup_segments: list[int], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A SLEEPER whose one step is in its segment: the hook's worker thread counts a step after
    the call returns, so "ready" alone does not mean a reading would see it."""
    proc = tuiprof_run(sys.executable, "-c", SLEEPER, stdout=subprocess.PIPE, env=env or {})
    cleanup_segments.append(proc.pid)
    assert proc.stdout.readline().strip() == "ready"

    def step_counted() -> bool:
        try:
            with segment.Segment(str(segment_path(proc.pid))) as seg:
                return seg.header().counters.step_count == 1
        except (segment.SegmentNotReadyError, segment.SegmentBusyError):  # being created, or mid-update
            return False

    assert wait_for(step_counted), f"pid {proc.pid}: its step never reached its segment"
    return proc


async def test_agent_reports_a_killed_rank_as_exited(tmp_path, cleanup_segments):
    proc = stepped_sleeper(cleanup_segments, env={"RANK": "3", "LOCAL_RANK": "1"})
    with running_agent(tmp_path) as agent:
        rank = await watch_rank(agent, proc.pid, lambda r: r.state == pb.RANK_STATE_RUNNING)
        assert (rank.rank, rank.local_rank, rank.step_count) == (3, 1, 1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        rank = await watch_rank(agent, proc.pid, lambda r: r.state == pb.RANK_STATE_EXITED)
        assert "killed by SIGKILL" in rank.unavailable["exit_signal"]  # the one signal no handler sees
        assert not rank.HasField("exit_signal") and not rank.HasField("exit_code")


def test_exited_rank_segment_is_cleaned_up(cleanup_segments):
    proc = stepped_sleeper(cleanup_segments)
    collector = RanksCollector(0.1, exited_keep_seconds=0.3)
    try:
        collector.collect()
        proc.kill()
        proc.wait(timeout=10)
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        [final] = [r for r in snapshot.ranks if r.pid == proc.pid]
        assert final.state == pb.RANK_STATE_EXITED and final.HasField("interval_seconds")  # its final reading
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        [after] = [r for r in snapshot.ranks if r.pid == proc.pid]
        assert after.state == pb.RANK_STATE_EXITED and after.step_count == 1
        assert not after.HasField("interval_seconds")  # nothing read: the final interval is not published again
        assert after.unavailable["gc_pause_seconds_per_s"] == "the process has exited: its work was counted in its final reading"
        time.sleep(0.35)
        collector.collect()
        assert not segment_path(proc.pid).exists()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        assert [r for r in snapshot.ranks if r.pid == proc.pid] == []
    finally:
        collector.close()


def test_a_rank_without_nccl_says_why(cleanup_segments):
    """World size 1: NCCL moves nothing, said so; otherwise: the profiler plugin was never loaded."""
    single = tuiprof_run(sys.executable, "-c", SLEEPER, stdout=subprocess.PIPE, env={"WORLD_SIZE": "1"})
    cleanup_segments.append(single.pid)
    four_ranks = tuiprof_run(sys.executable, "-c", SLEEPER, stdout=subprocess.PIPE, env={"WORLD_SIZE": "4"})
    cleanup_segments.append(four_ranks.pid)
    collector = RanksCollector(0.1)
    try:
        for proc in (single, four_ranks):
            assert proc.stdout.readline().strip() == "ready"
        collector.collect()
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        ranks = {r.pid: r for r in snapshot.ranks}
        assert ranks[single.pid].unavailable["nccl"] == "world size 1: NCCL does no communication"
        assert not ranks[four_ranks.pid].hook.nccl_plugin
        assert ranks[four_ranks.pid].unavailable["nccl"].startswith("NCCL has not loaded the tuiprof profiler plugin")
    finally:
        collector.close()
        for proc in (single, four_ranks):
            proc.kill()
            proc.wait(timeout=10)
