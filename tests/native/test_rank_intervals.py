"""Every finished operation of a rank lands in exactly one published interval.

A real Agent publishes snapshots on its own clock while a stand-in job under
`tuiprof run` keeps finishing GEMMs; the ranks collector is configured with an
interval faster and slower than the publisher's (the two timers that used to
lose and repeat samples). Every published snapshot is kept (a post-processor
sees each one before it is published) and the GEMMs each interval reports
(``count_per_s`` x ``interval_seconds``) are added up: they must equal the
segment's total, interval by interval.
"""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from agentd.agent import Agent
from agentd.collectors.ranks import RanksCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.runner import CollectorRunner
from native.support import tuiprof_run

PUBLISH_SECONDS = 0.05
STREAM_CALLS = 300
SGEMM = ("cublasSgemm_v2", "b=1 m=16 n=16 k=16")  # 2 in the fixed workload, then the stream


def _sgemm(rank: pb.RankStats) -> pb.GemmOpStats | None:
    return next((g for g in rank.gemm if (g.op, g.shape) == SGEMM), None)


async def _published_while_the_job_runs(standins, collector_seconds: float, cleanup_segments,
                                        options: tuple[str, ...] = ()) -> list[pb.RankStats]:
    """The job's RankStats in every snapshot an Agent published while it ran (and a few after)."""
    proc = tuiprof_run(str(standins / "driver"), str(standins / "libworkload.so"), str(STREAM_CALLS), "2000",
                       options=options, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    cleanup_segments.append(proc.pid)
    published: list[pb.HostSnapshot] = []
    agent = Agent([CollectorRunner(RanksCollector(collector_seconds))], PUBLISH_SECONDS)
    agent.post_processors.append(lambda snapshot: published.append(snapshot))
    agent.start_collectors()
    publisher = asyncio.create_task(agent.run())
    try:
        lines = await asyncio.wait_for(asyncio.to_thread(lambda: [proc.stdout.readline() for _ in range(3)]), 30)
        assert [line.strip() for line in lines[1:]] == ["READY", "DONE"], lines
        after = len(published)
        while len(published) < after + 4:  # the last GEMMs folded and read
            await asyncio.sleep(PUBLISH_SECONDS)
    finally:
        publisher.cancel()
        agent.stop_collectors()
        proc.communicate("\n", timeout=10)
    return [r for snapshot in published for r in snapshot.ranks if r.pid == proc.pid]


@pytest.mark.parametrize("collector_seconds", [0.03, 0.08], ids=["collector-faster", "collector-slower"])
async def test_every_finished_gemm_is_in_exactly_one_published_interval(standins, cleanup_segments,
                                                                        collector_seconds):
    # 1 in 16 fixed (the default would reach 1 in 1024 for these 10 us kernels whenever the writer
    # has folded their first calls): most of the 302 calls are only counted (no record), yet each
    # is in one interval
    ranks = await _published_while_the_job_runs(standins, collector_seconds, cleanup_segments,
                                                options=("--gemm-sample-every", "16"))
    counted = previous_total = timed = 0
    for rank in ranks:
        sgemm = _sgemm(rank)
        if sgemm is None:  # none folded yet, or the segment was mid-update (counted in the next reading)
            continue
        in_interval = sgemm.count_per_s * rank.interval_seconds
        assert in_interval == pytest.approx(sgemm.count_total - previous_total, abs=1e-6)
        counted += round(in_interval)
        previous_total = sgemm.count_total
        timed += sgemm.timed_count_interval
        assert sgemm.timed_count_total == timed
    assert previous_total == STREAM_CALLS + 2
    assert counted == previous_total  # no interval lost, none published twice
    # timed: calls 2..32 of the shape, then one in 16 (302 calls: 48, 64, ..., 288) -- the first apart
    assert timed == 31 + 16
    intervals_with_gemms = sum(1 for r in ranks if (g := _sgemm(r)) is not None and g.count_per_s > 0)
    assert intervals_with_gemms >= 5  # the stream really spanned many published intervals


SGEMM_KERNEL_NS = 10000 + 2 * 16 * 16 * 16 // 100  # the stand-in cuBLAS's kernel time for this shape


async def test_latency_min_max_are_the_calls_own_times_where_set_in_the_interval(standins, cleanup_segments):
    """Every stand-in Sgemm takes 10081 ns (bucket [8192, 16384) ns): the interval that holds the first
    calls shows exactly that, flagged exact; later intervals show the lifetime value as a bound.
    Every call is timed here, so that every interval has timed calls."""
    ranks = await _published_while_the_job_runs(standins, PUBLISH_SECONDS, cleanup_segments,
                                                options=("--gemm-sample-every", "1"))
    latencies = [g.latency for r in ranks if (g := _sgemm(r)) is not None and g.count_per_s > 0]
    first, later = latencies[0], latencies[1:]
    assert (first.min_seconds, first.max_seconds) == (SGEMM_KERNEL_NS * 1e-9, SGEMM_KERNEL_NS * 1e-9)
    assert first.min_exact and first.max_exact
    assert later and all(not (lat.min_exact or lat.max_exact) for lat in later)
    assert all(lat.max_seconds == SGEMM_KERNEL_NS * 1e-9 for lat in later)  # clamped: tighter than 16384 ns
