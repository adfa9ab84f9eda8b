"""What the gpu collector reads of a GPU process as ``top`` and nvitop show it: CPU use between two
reads (in % of one CPU), resident memory, and when it started."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from agentd.collectors import gpu
from agentd.collectors.readings import FIRST_SAMPLE, Unavailable

DEAD_PID = 2**22 + 17  # above the default pid_max: no such process


def test_cpu_use_is_cpu_time_per_wall_time_between_two_reads_and_the_first_read_says_why_it_has_none() -> None:
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        first = gpu.process_usage(burner.pid, time.monotonic(), None)
        assert not isinstance(first, Unavailable)
        assert first.cpu_percent == Unavailable(FIRST_SAMPLE)
        time.sleep(1.0)
        second = gpu.process_usage(burner.pid, time.monotonic(), first)
        assert not isinstance(second, Unavailable) and not isinstance(second.cpu_percent, Unavailable)
        # one busy thread: close to one whole CPU (less when this shared machine gives it less)
        assert 30.0 <= second.cpu_percent <= 105.0, second.cpu_percent
        assert second.resident_memory_bytes == psutil.Process(burner.pid).memory_info().rss
    finally:
        burner.kill()
        burner.wait()


def test_an_idle_process_uses_no_cpu_and_its_start_time_is_the_kernels() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        first = gpu.process_usage(sleeper.pid, 0.0, None)
        assert not isinstance(first, Unavailable)
        second = gpu.process_usage(sleeper.pid, 2.0, first)
        assert not isinstance(second, Unavailable) and second.cpu_percent == 0.0
        facts = gpu.process_facts(sleeper.pid)
        assert facts.start_time_unix_seconds == psutil.Process(sleeper.pid).create_time()
        assert abs(facts.start_time_unix_seconds - time.time()) < 30  # started by this test
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_the_agent_cannot_see_has_each_figure_unavailable_with_the_reason() -> None:
    assert gpu.process_usage(DEAD_PID, 0.0, None) == Unavailable(gpu.NOT_VISIBLE)
    assert gpu.process_facts(DEAD_PID).start_time_unix_seconds == Unavailable(gpu.NOT_VISIBLE)
