"""tuiprof_native.pmu with real perf_event counters on this machine.

Software events are counted for real (task clock, context switches, page
faults, migrations). Hardware events are tested where the PMU exists and
otherwise the failure itself is checked: it must name the errno and the cause.
"""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from agentd.collectors.pmu import PmuCollector
from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof_native import pmu

NOBODY = 65534


def _hardware_probe() -> str | None:
    """None when hardware events open here, else the error text."""
    try:
        group = pmu.CounterGroup(pmu.HARDWARE_EVENTS, pid=0)
    except pmu.PerfEventError as error:
        return str(error)
    group.close()
    return None


HARDWARE_ERROR = _hardware_probe()


@pytest.fixture
def child() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Start Python children running a snippet; they are killed afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait(timeout=10)


def measure(counters: pmu.CounterSet, seconds: float) -> pmu.IntervalCounts:
    before = counters.sample()
    time.sleep(seconds)
    return pmu.interval_counts(before, counters.sample(), counters.events)


BUSY = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"
SLEEPY = "import time\nwhile True: time.sleep(0.001)"


def cpu_seconds(pid: int) -> float:
    """The kernel's own account of a process's CPU time (from /proc, via psutil)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_task_clock_of_a_busy_process(child: Callable[[str], subprocess.Popen[bytes]]) -> None:
    busy = child(BUSY)
    counters = pmu.CounterSet.for_process(busy.pid, pmu.SOFTWARE_EVENTS)
    try:
        cpu_before = cpu_seconds(busy.pid)
        interval = measure(counters, 1.0)
        cpu_used = cpu_seconds(busy.pid) - cpu_before
    finally:
        counters.close()
    assert counters.scope == "process"
    assert interval.missing == {}
    assert cpu_used > 0.05  # it ran at all, even on a crowded machine
    # task clock (ns) agrees with /proc's tick-granular CPU time of the same process
    assert interval.counts["task_clock"] / 1e9 == pytest.approx(cpu_used, rel=0.15, abs=0.04)
    assert interval.task_clock_cpus <= 1.05  # one single-threaded spinner
    assert interval.seconds == pytest.approx(1.0, abs=0.2)


def test_context_switches_of_a_sleeping_process(child: Callable[[str], subprocess.Popen[bytes]]) -> None:
    sleepy = child(SLEEPY)
    counters = pmu.CounterSet.for_process(sleepy.pid, pmu.SOFTWARE_EVENTS)
    if counters.user_space_only:
        counters.close()
        pytest.skip("counting user space only (perf_event_paranoid 2, no CAP_PERFMON): the kernel switches "
                    "contexts in kernel mode, so these read 0 (the agent reports them unavailable)")
    try:
        switches_before = sum(psutil.Process(sleepy.pid).num_ctx_switches())
        interval = measure(counters, 0.5)
        switches = sum(psutil.Process(sleepy.pid).num_ctx_switches()) - switches_before
    finally:
        counters.close()
    assert switches > 20
    assert interval.counts["context_switches"] == pytest.approx(switches, rel=0.2, abs=5)
    assert interval.task_clock_cpus < 0.5


def test_threads_started_after_attaching_are_counted(child: Callable[[str], subprocess.Popen[bytes]]) -> None:
    # The child waits on stdin, then spins in a new thread while its main thread sleeps.
    code = (
        "import sys, threading, time\n"
        "sys.stdin.readline()\n"
        "def spin():\n"
        "    end = time.time() + 30\n"
        "    while time.time() < end: pass\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "time.sleep(30)\n"
    )
    process = child(code)
    counters = pmu.CounterSet.for_process(process.pid, ["task_clock"])
    opened_groups = len(counters.groups)
    try:
        idle = measure(counters, 0.3)
        process.stdin.write(b"go\n")
        process.stdin.flush()
        time.sleep(0.2)
        cpu_before = cpu_seconds(process.pid)
        spinning = measure(counters, 1.0)
        cpu_used = cpu_seconds(process.pid) - cpu_before  # all threads, from /proc
    finally:
        counters.close()
    assert opened_groups == 1  # attached while single-threaded: the spinner thread was inherited
    assert idle.task_clock_cpus < 0.2
    assert cpu_used > 0.05
    assert spinning.counts["task_clock"] / 1e9 == pytest.approx(cpu_used, rel=0.15, abs=0.04)


def test_system_wide_counts_every_cpu() -> None:
    if pmu.paranoid_level() > 0 and os.geteuid() != 0:
        pytest.skip(f"system-wide counting needs perf_event_paranoid <= 0 or CAP_PERFMON (paranoid {pmu.paranoid_level()})")
    counters = pmu.CounterSet.system_wide(["context_switches", "page_faults"])
    try:
        interval = measure(counters, 0.3)
    finally:
        counters.close()
    assert len(pmu.online_cpus()) == os.cpu_count()
    assert counters.scope == "system"
    assert interval.per_second("context_switches") > 0


def test_a_missing_process_is_esrch() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(timeout=30)
    with pytest.raises(pmu.PerfEventError) as caught:
        pmu.CounterSet.for_process(process.pid, ["task_clock"])
    assert caught.value.errno == errno.ESRCH
    assert f"process {process.pid} does not exist" in str(caught.value)


def test_unknown_events_are_rejected_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="unknown perf events.*'instructions'"):
        pmu.CounterGroup(["instructionz"])


@pytest.mark.skipif(HARDWARE_ERROR is not None, reason=f"no hardware PMU here: {HARDWARE_ERROR}")
def test_hardware_counters_of_a_busy_process(child: Callable[[str], subprocess.Popen[bytes]]) -> None:
    busy = child(BUSY)
    counters = pmu.CounterSet.for_process(busy.pid, pmu.HARDWARE_EVENTS)
    try:
        interval = measure(counters, 0.5)
    finally:
        counters.close()
    assert interval.ipc > 0.05
    assert interval.mips > 10
    assert interval.mega_cycles_per_s > 100


@pytest.mark.skipif(HARDWARE_ERROR is None, reason="hardware PMU present: its failure path cannot be reached")
def test_missing_pmu_is_reported_with_errno_and_cause() -> None:
    with pytest.raises(pmu.PerfEventError) as caught:
        # user space only: what any user may ask at perf_event_paranoid 2, so the answer is about the PMU
        pmu.CounterGroup(["cycles", "instructions"], pid=0, exclude_kernel=True)
    error = caught.value
    assert error.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV)
    assert errno.errorcode[error.errno] in str(error)
    assert "no PMU" in str(error) and "'cycles'" in str(error)
    assert error.event == "cycles"


def run_as_nobody(function: Callable[[], Any]) -> Any:
    """Run ``function`` in a forked child that dropped root (and every capability).

    Everything it needs must be imported beforehand: nobody may not read the
    interpreter's own directories.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        try:
            os.close(read_end)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                result: Any = ("ok", function())
            except Exception as error:  # sent to the parent, which asserts on it
                result = ("error", (type(error).__name__, getattr(error, "errno", None), str(error)))
            with os.fdopen(write_end, "wb") as out:
                pickle.dump(result, out)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as incoming:
        data = incoming.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


needs_root_at_paranoid_1 = pytest.mark.skipif(
    os.geteuid() != 0 or (pmu.paranoid_level() or 0) < 1,
    reason="needs root (to drop to nobody) and perf_event_paranoid >= 1 (so that nobody is refused)",
)


@needs_root_at_paranoid_1
def test_unprivileged_system_wide_counting_names_the_paranoid_level() -> None:
    def attempt() -> None:
        pmu.CounterSet.system_wide(["context_switches"])

    kind, (name, code, message) = run_as_nobody(attempt)
    assert (kind, name) == ("error", "PerfEventError")
    assert code in (errno.EACCES, errno.EPERM)
    assert f"perf_event_paranoid is {pmu.paranoid_level()}" in message
    assert "CAP_PERFMON" in message


@needs_root_at_paranoid_1
def test_unprivileged_agent_falls_back_to_counting_itself() -> None:
    def scope_and_counts() -> tuple[str, list[int], float, float, str]:
        collector = PmuCollector(1.0)
        collector.collect()
        started, cpu_before = time.monotonic(), time.process_time()
        while time.monotonic() < started + 0.3:
            pass
        collector.collect()
        elapsed, cpu_used = time.monotonic() - started, time.process_time() - cpu_before
        snapshot = pb.HostSnapshot()
        collector.fill(snapshot)
        tracked = collector.tracked()
        collector.close()
        return collector.scope, tracked, snapshot.pmu.task_clock_cpus * elapsed, cpu_used, snapshot.pmu.scope

    kind, result = run_as_nobody(scope_and_counts)
    assert kind == "ok", result
    scope, tracked, task_clock_seconds, cpu_used, reported_scope = result
    assert scope == reported_scope == "process"
    assert len(tracked) == 1  # itself
    assert cpu_used > 0.02
    assert task_clock_seconds == pytest.approx(cpu_used, rel=0.2, abs=0.03)


def test_multiplexed_groups_are_scaled_by_enabled_over_running() -> None:
    events = ("cycles", "instructions")
    before = pmu.CounterSample(0, [pmu.GroupReading(100, 100, (1000, 2000)), pmu.GroupReading(100, 0, (0, 0))])
    after = pmu.CounterSample(
        2_000_000_000, [pmu.GroupReading(300, 200, (1100, 2300)), pmu.GroupReading(300, 100, (50, 70))]
    )
    interval = pmu.interval_counts(before, after, events)
    # group 1: on the PMU half its enabled time -> deltas doubled; group 2: on a quarter -> x2 as well
    assert interval.counts == {"cycles": 200 + 100, "instructions": 600 + 140}
    assert interval.seconds == 2.0
    assert interval.ipc == pytest.approx(740 / 300)
    assert interval.mips == pytest.approx(740 / 2.0 / 1e6)
    assert interval.mega_cycles_per_s == pytest.approx(300 / 2.0 / 1e6)


def test_a_group_never_scheduled_is_missing_not_zero() -> None:
    before = pmu.CounterSample(0, [pmu.GroupReading(100, 50, (10,))])
    after = pmu.CounterSample(1_000_000_000, [pmu.GroupReading(200, 50, (10,))])
    interval = pmu.interval_counts(before, after, ("cycles",))
    assert interval.counts == {}
    assert "never scheduled" in interval.missing["cycles"]
    assert interval.mega_cycles_per_s is None and interval.ipc is None


def test_cache_miss_percent_and_zero_denominators() -> None:
    interval = pmu.IntervalCounts(1.0, {"cache_references": 400.0, "cache_misses": 100.0, "cycles": 0.0, "instructions": 5.0})
    assert interval.cache_miss_percent == 25.0
    assert interval.ipc is None  # no cycles counted: no ratio, not infinity
