"""PyTorch's caching allocator figures (issue 30 item 2) as the startup hook publishes them, with real
torch under `tuiprof run`: this torch is a CPU build, so the figures are unavailable with that reason
(never 0) in the segment, the agent's report and a crash report; a real torch.cuda.OutOfMemoryError
reaching the excepthook becomes a crash report that says what the allocator had at the time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from agentd.collectors import rank_device_memory  # noqa: E402
from agentd.proto import tuiprof_agent_pb2 as pb  # noqa: E402
from native.support import segment_path, tuiprof_run, wait_for, watch_rank  # noqa: E402
from testkit.agents import running_agent  # noqa: E402
from tuiprof_native import segment  # noqa: E402
from tuiprof_native.startup import tuiprof_startup  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "allocator_worker.py")
pytestmark = pytest.mark.skipif(torch.version.cuda is not None, reason="these tests are about a CPU build of torch")


def _start(mode: str) -> subprocess.Popen:
    return tuiprof_run(sys.executable, WORKER, mode, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env={"OMP_NUM_THREADS": "1"})


def test_reading_a_cpu_torch_says_it_has_no_cuda():
    assert tuiprof_startup.allocator_figures(torch) == (tuiprof_startup.ALLOCATOR_NO_CUDA, ())
    assert tuiprof_startup.ALLOCATOR_NO_CUDA == segment.ALLOCATOR_NO_CUDA  # one meaning on both sides
    assert tuiprof_startup.ALLOCATOR_UNINITIALIZED == segment.ALLOCATOR_UNINITIALIZED
    assert tuiprof_startup.ALLOCATOR_READ == segment.ALLOCATOR_READ


async def test_a_cpu_torch_rank_has_no_allocator_figures_and_says_why(tmp_path, cleanup_segments):
    proc = _start("live")
    cleanup_segments.append(proc.pid)
    try:
        assert proc.stdout.readline().strip() == "ready"

        def published() -> bool:
            with segment.Segment(segment_path(proc.pid)) as seg:
                return seg.device_memory().allocator_state != segment.ALLOCATOR_NONE

        assert wait_for(published)
        with segment.Segment(segment_path(proc.pid)) as seg:
            assert seg.device_memory().allocator_state == segment.ALLOCATOR_NO_CUDA
        with running_agent(tmp_path) as agent:
            rank = await watch_rank(agent, proc.pid, lambda r: r.HasField("device_memory"))
        memory = rank.device_memory
        assert memory.unavailable["allocated_bytes"] == rank_device_memory.allocator_reason(segment.ALLOCATOR_NO_CUDA,
                                                                                      segment)
        assert "CPU build" in memory.unavailable["allocated_bytes"]
        for field in ("allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "alloc_retries_total",
                      "ooms_total"):
            assert not memory.HasField(field)
        assert memory.malloc.malloc_calls_total == 0 and not memory.copies  # a CPU job calls no CUDA runtime
    finally:
        proc.communicate("\n", timeout=30)


async def test_an_out_of_memory_error_is_a_crash_report_with_the_allocator_figures(tmp_path, cleanup_segments):
    proc = _start("oom")
    cleanup_segments.append(proc.pid)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1  # the job ends as it would without tuiprof
    assert stderr.rstrip().endswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB")
    with running_agent(tmp_path) as agent:
        rank = await watch_rank(agent, proc.pid, lambda r: r.state == pb.RANK_STATE_EXITED)
    assert rank.exit_code == 1
    assert 'in grow_activations\n    raise torch.cuda.OutOfMemoryError("CUDA out of memory.' in rank.exception
    assert rank.exception.rstrip().endswith(
        "PyTorch CUDA caching allocator at the OOM: unavailable (this torch is a CPU build (torch.version.cuda is "
        "None))")
    assert "CPU build" in rank.device_memory.unavailable["allocated_bytes"]
