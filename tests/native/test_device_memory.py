"""Device memory (issue 30 item 2): a job's cudaMalloc/cudaFree, cudaMallocAsync/cudaFreeAsync and
cudaMemcpy(Async) calls, made through the stand-in CUDA runtime under `tuiprof run`, counted by the
job itself and compared exactly with what a real agentd reports over gRPC and /metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from agentd.collectors import rank_device_memory
from native.support import remove_rank_files, segment_path, tuiprof_run, watch_rank
from testkit.agents import running_agent
from tuiprof_native import segment

JOB = Path(__file__).with_name("device_memory_job.py")


def standin_copy_ns(size: int) -> int:
    """The stand-in runtime's GPU time of a copy (standin_copy_ns in standins/cudart.c)."""
    return 1000 + size // 10


@pytest.fixture
def memory_job(standins):
    process = tuiprof_run(sys.executable, str(JOB), str(standins / "libcudart.so"), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE)
    try:
        counts = json.loads(process.stdout.readline())
        assert process.stdout.readline().strip() == "READY"
        yield process, counts
    finally:
        process.communicate("\n", timeout=10)
        remove_rank_files(process.pid)


def test_the_segment_holds_the_jobs_own_counts(memory_job):
    process, counts = memory_job
    with segment.Segment(segment_path(process.pid)) as seg:
        memory = seg.device_memory()
    for api in ("malloc", "malloc_async"):
        stats = getattr(memory, api)
        assert [stats.malloc_calls, stats.malloc_bytes, stats.free_calls, stats.free_bytes,
                stats.free_unknown] == counts[api]
    copies = {c.direction: c for c in memory.copies if c.calls}
    assert {d: [c.calls, c.bytes] for d, c in copies.items()} == counts["copies"]
    # 40 copies host to device: the first 32 timed, then the 33rd, standing for itself and the 15 after it
    h2d = copies["host_to_device"]
    assert (h2d.timed_calls, h2d.weighted_calls, h2d.untimed) == (33, 32 + segment.COPY_SAMPLE_EVERY, 0)
    assert h2d.timed_ns == 33 * standin_copy_ns(1024)
    d2h = copies["device_to_host"]  # cudaMemcpy: timed on the default stream, where it runs
    assert (d2h.timed_calls, d2h.timed_ns) == (3, 3 * standin_copy_ns(4096))
    assert memory.allocator_state == segment.ALLOCATOR_NONE  # no Python startup hook figures: no torch


async def test_agent_reports_the_jobs_own_counts(tmp_path, memory_job):
    process, counts = memory_job
    expected_calls = counts["malloc"][0]
    with running_agent(tmp_path) as agent:
        rank = await watch_rank(agent, process.pid,
                                lambda r: r.device_memory.malloc.malloc_calls_total == expected_calls)
        with urllib.request.urlopen(f"{agent.metrics_url}/metrics", timeout=10) as response:
            metrics = [line for line in response.read().decode().splitlines() if f'pid="{process.pid}"' in line]
    memory = rank.device_memory
    for api in ("malloc", "malloc_async"):
        stats = getattr(memory, api)
        assert [stats.malloc_calls_total, stats.malloc_bytes_total, stats.free_calls_total, stats.free_bytes_total,
                stats.free_unknown_size_total] == counts[api]
    copies = {c.direction: c for c in memory.copies}
    assert {d: [c.calls_total, c.bytes_total] for d, c in copies.items()} == counts["copies"]
    h2d = copies["host_to_device"]
    assert h2d.mean_seconds == pytest.approx(standin_copy_ns(1024) * 1e-9)
    assert h2d.seconds_total == pytest.approx(40 * standin_copy_ns(1024) * 1e-9)
    assert h2d.HasField("bytes_per_s") and h2d.bytes_per_s > 0
    assert copies["device_to_device"].seconds_total == pytest.approx(2 * standin_copy_ns(65536) * 1e-9)
    # no torch in the job: the allocator's figures are unavailable with the reason, never 0
    assert not memory.HasField("allocated_bytes") and not memory.HasField("ooms_total")
    assert memory.unavailable["allocated_bytes"] == rank_device_memory.allocator_reason(segment.ALLOCATOR_NONE, segment)

    def series(name: str, **labels: str) -> str:
        found = [line for line in metrics if line.startswith(name + "{")
                 and all(f'{k}="{v}"' in line for k, v in labels.items())]
        assert len(found) == 1, (name, labels, metrics)
        return found[0].rsplit(" ", 1)[1]

    assert series("tuiprof_rank_device_malloc_calls_total", api="malloc") == str(counts["malloc"][0])
    assert series("tuiprof_rank_device_free_bytes_total", api="malloc") == str(counts["malloc"][3])
    assert series("tuiprof_rank_device_free_unknown_size_total", api="malloc") == "1"
    assert series("tuiprof_rank_memcpy_bytes_total", direction="device_to_host") == str(
        counts["copies"]["device_to_host"][1])
    assert series("tuiprof_rank_memcpy_calls_total", direction="default") == "1"
    assert not [line for line in metrics if line.startswith("tuiprof_rank_torch_")]  # unavailable: left out
