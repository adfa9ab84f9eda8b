"""PmuCollector on this machine: real software counters, the real hardware verdict, tracked processes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from agentd.collectors.pmu import PmuCollector, process_counters
from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof_native import pmu

HARDWARE_FIELDS = ("mips", "mega_cycles_per_s", "ipc", "cache_misses_per_s", "cache_miss_percent", "branch_misses_per_s")


@pytest.fixture
def collector() -> Iterator[PmuCollector]:
    instance = PmuCollector(1.0)
    yield instance
    instance.close()


@pytest.fixture
def busy_child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"])
    yield process
    process.kill()
    process.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def host_pmu(collector: PmuCollector) -> pb.PmuStats:
    snapshot = pb.HostSnapshot()
    collector.fill(snapshot)
    return snapshot.pmu


def hardware_verdict() -> str:
    """What the kernel says to hardware counters, asked as the agent asks: in user space only when
    kernel mode is not permitted (a user at perf_event_paranoid 2)."""
    try:
        try:
            pmu.CounterGroup(pmu.HARDWARE_EVENTS, pid=0).close()
        except pmu.PerfEventError as error:
            if error.errno not in (errno.EACCES, errno.EPERM):
                raise
            pmu.CounterGroup(pmu.HARDWARE_EVENTS, pid=0, exclude_kernel=True).close()
    except pmu.PerfEventError as error:
        return str(error)
    return ""


def assert_counts_context_switches(stats) -> None:
    """Context switches counted, or, where the agent may count user space only (a user at
    perf_event_paranoid 2), said to be uncountable and why: never a 0 that means nothing."""
    if os.geteuid() != 0 and pmu.paranoid_level() >= 2:
        assert not stats.HasField("context_switches_per_s")
        assert "perf_event_paranoid is" in stats.unavailable["context_switches_per_s"], stats.unavailable
    else:
        assert stats.context_switches_per_s > 0


def test_host_scope_counts_software_events_and_explains_hardware(collector: PmuCollector) -> None:
    assert collector.status().available, collector.status().reason
    expected_scope = "system" if os.geteuid() == 0 or pmu.paranoid_level() <= 0 else "process"
    assert collector.scope == expected_scope
    collector.collect()
    first = host_pmu(collector)
    assert first.unavailable["context_switches_per_s"] == "first sample"
    time.sleep(0.3)
    collector.collect()
    stats = host_pmu(collector)
    assert stats.scope == expected_scope
    assert_counts_context_switches(stats)
    assert stats.HasField("page_faults_per_s")
    verdict = hardware_verdict()
    assert stats.hardware_available == (verdict == "")
    assert stats.hardware_reason == verdict
    for field in HARDWARE_FIELDS:
        if verdict:
            assert not stats.HasField(field)
            assert verdict in stats.unavailable[field]
    if expected_scope == "system":
        assert "idle time" in stats.unavailable["task_clock_cpus"]


def test_tracked_process_gets_its_own_rates(collector: PmuCollector, busy_child: subprocess.Popen[bytes]) -> None:
    collector.track(busy_child.pid)
    assert busy_child.pid in collector.tracked()
    collector.collect()
    started, cpu_before = time.monotonic(), cpu_seconds(busy_child.pid)
    assert collector.process_stats(busy_child.pid).unavailable["task_clock_cpus"] == "first sample"
    time.sleep(0.5)
    collector.collect()
    elapsed, cpu_used = time.monotonic() - started, cpu_seconds(busy_child.pid) - cpu_before
    stats = collector.process_stats(busy_child.pid)
    assert stats.scope == "process"
    assert cpu_used > 0.03
    assert stats.task_clock_cpus * elapsed == pytest.approx(cpu_used, rel=0.2, abs=0.04)
    collector.untrack(busy_child.pid)
    assert collector.process_stats(busy_child.pid) is None
    assert busy_child.pid not in collector.tracked()


def test_an_exited_process_is_dropped(collector: PmuCollector, busy_child: subprocess.Popen[bytes]) -> None:
    collector.track(busy_child.pid)
    collector.collect()
    busy_child.kill()
    busy_child.wait(timeout=10)
    collector.collect()
    assert busy_child.pid not in collector.tracked()
    assert collector.process_stats(busy_child.pid) is None


def test_tracking_a_missing_process_is_an_error(collector: PmuCollector) -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=30)
    with pytest.raises(pmu.PerfEventError) as caught:
        collector.track(process.pid)
    assert caught.value.errno == errno.ESRCH


def test_process_counters_give_per_interval_stats(busy_child: subprocess.Popen[bytes]) -> None:
    counters = process_counters(busy_child.pid)
    try:
        assert counters.stats().unavailable["context_switches_per_s"] == "first sample"
        started, cpu_before = time.monotonic(), cpu_seconds(busy_child.pid)
        time.sleep(0.5)
        stats = counters.stats()
        elapsed, cpu_used = time.monotonic() - started, cpu_seconds(busy_child.pid) - cpu_before
    finally:
        counters.close()
    assert stats.scope == "process"
    assert cpu_used > 0.03
    assert stats.task_clock_cpus * elapsed == pytest.approx(cpu_used, rel=0.2, abs=0.04)


def test_a_resting_collector_reads_nothing_and_wakes_to_a_first_sample(collector: PmuCollector,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's embedded agent rests the host-wide counters while no screen shows them: no
    reads, unavailable with the reason given, and the first read after waking is a first sample,
    not one rate over the whole rest."""
    host_counters = collector._host if collector.scope == "system" else collector._tracked[os.getpid()]
    assert host_counters is not None
    reads = []
    read = host_counters.interval
    monkeypatch.setattr(host_counters, "interval", lambda: reads.append(1) or read())
    collector.collect()
    time.sleep(0.1)
    collector.collect()
    assert host_pmu(collector).HasField("page_faults_per_s") and len(reads) == 2

    collector.rest("nobody looks")
    for _ in range(3):
        collector.collect()
    assert len(reads) == 2
    assert (collector.status().available, collector.status().reason) == (False, "nobody looks")
    assert not host_pmu(collector).ListFields()  # nothing kept from before the rest either

    collector.wake()
    assert collector.status().available, collector.status().reason
    collector.collect()
    assert len(reads) == 3
    assert host_pmu(collector).unavailable["context_switches_per_s"] == "first sample"
    time.sleep(0.1)
    collector.collect()
    assert host_pmu(collector).HasField("page_faults_per_s")
