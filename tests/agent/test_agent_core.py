"""The agent core: collector loading and threads, snapshot assembly, latest-value slots."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from agentd.agent import Agent, LatestSlot
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.registry import COLLECTORS
from agentd.runner import FAILURE_LOG_INTERVAL_SECONDS, CollectorRunner, UnloadableCollector, load_collectors
from testkit.agents import AbsentCollector, TickCollector


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_every_registered_collector_loads():
    loaded = load_collectors(COLLECTORS, 1.0)
    try:
        names = [c.name for c in loaded]
        assert names[:3] == ["host", "gpu", "pmu"] and len(set(names)) == len(names)
        unloadable = [c.status().reason for c in loaded if isinstance(c, UnloadableCollector)]
        assert unloadable == []
    finally:
        for collector in loaded:
            collector.close()


def test_an_entry_that_cannot_be_imported_is_unavailable_with_the_reason():
    host, missing, bad_attr = load_collectors(
        ["agentd.collectors.host:HostCollector", "agentd.collectors.nosuch:X",
         "agentd.collectors.host:NoSuchClass"], 0.5)
    assert host.name == "host" and host.interval_seconds == 0.5
    assert isinstance(missing, UnloadableCollector)
    status = missing.status()
    assert (status.name, status.available) == ("nosuch", False)
    assert "No module named 'agentd.collectors.nosuch'" in status.reason
    assert "has no attribute 'NoSuchClass'" in bad_attr.status().reason


def test_each_collector_samples_on_its_own_thread_and_interval():
    fast, slow = TickCollector(0.02), TickCollector(0.02)
    slow.collect = lambda: time.sleep(0.5)  # a hung driver call
    runners = [CollectorRunner(fast), CollectorRunner(slow)]
    for runner in runners:
        runner.start()
    try:
        time.sleep(0.4)
        assert fast.samples >= 8, "the slow collector must not hold up the fast one"
        names = {t.name for t in threading.enumerate()}
        assert {"collector-tick"} <= names
    finally:
        for runner in runners:
            runner.stop()
    assert fast.closed


def test_snapshot_has_sequence_hostname_statuses_and_data():
    tick = TickCollector(0.01)
    runners = [CollectorRunner(tick), CollectorRunner(AbsentCollector(0.01))]
    agent = Agent(runners, 0.1, hostname="node-7", clock_ns=lambda: 42)
    agent.start_collectors()
    try:
        assert runners[0].wait_first_sample(5)
        first, second = agent.snapshot(), agent.snapshot()
    finally:
        agent.stop_collectors()
    assert (first.hostname, first.timestamp_unix_ns, first.sequence) == ("node-7", 42, 1)
    assert second.sequence == 2
    assert [(s.name, s.available, s.reason) for s in first.collectors] == [
        ("tick", True, ""), ("absent", False, "no such device here")]
    assert first.collectors[0].interval_seconds == 0.01  # filled in from the collector
    assert first.cpu.process_count >= 1


def test_a_failing_collect_marks_the_collector_unavailable_and_drops_its_data():
    tick = TickCollector(0.01)
    runner = CollectorRunner(tick)
    agent = Agent([runner], 0.1)
    runner.start()
    try:
        assert runner.wait_first_sample(5)
        tick.fail_collect = "sensor gone"
        assert wait_until(lambda: not runner.status().available)
        snapshot = agent.snapshot()
        assert snapshot.collectors[0].reason == "collect failed: OSError: sensor gone"
        assert not snapshot.HasField("cpu"), "stale data must not be shown as current"
        tick.fail_collect = None
        assert wait_until(lambda: runner.status().available)
        assert agent.snapshot().cpu.HasField("process_count")
    finally:
        runner.stop()


def test_a_failing_fill_leaves_nothing_half_written():
    tick = TickCollector(0.01)
    tick.fail_fill = True
    runner = CollectorRunner(tick)
    runner.start()
    try:
        assert runner.wait_first_sample(5)
        snapshot = Agent([runner], 0.1).snapshot()
    finally:
        runner.stop()
    assert snapshot.collectors[0].available is False
    assert snapshot.collectors[0].reason == "fill failed: ValueError: fill broke"
    assert not snapshot.HasField("cpu")


def test_unavailable_collectors_get_no_thread():
    runner = CollectorRunner(AbsentCollector(0.01))
    runner.start()
    time.sleep(0.05)
    runner.stop()  # AbsentCollector.collect would raise AssertionError in its thread
    assert runner.status().available is False
    assert not any(t.name == "collector-absent" for t in threading.enumerate())


async def test_latest_slot_keeps_only_the_newest_value():
    slot = LatestSlot()
    for sequence in (1, 2, 3):
        slot.put(pb.HostSnapshot(sequence=sequence))
    assert slot.pending
    assert (await slot.take()).sequence == 3
    assert not slot.pending
    waiter = asyncio.create_task(slot.take())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    slot.put(pb.HostSnapshot(sequence=4))
    assert (await asyncio.wait_for(waiter, 1)).sequence == 4


async def test_run_publishes_every_interval_to_every_watcher():
    agent = Agent([], 0.05)
    early = agent.subscribe()
    task = asyncio.create_task(agent.run())
    try:
        sequences = [(await asyncio.wait_for(early.take(), 2)).sequence for _ in range(3)]
        late = agent.subscribe()  # gets the newest snapshot at once
        assert (await asyncio.wait_for(late.take(), 0.01)).sequence >= sequences[-1]
        assert agent.watcher_count == 2
        agent.unsubscribe(late)
        assert agent.watcher_count == 1
    finally:
        task.cancel()
    assert sequences == sorted(sequences) and len(set(sequences)) == 3
    assert sequences[-1] - sequences[0] <= 3


async def test_the_tick_thread_ends_with_the_snapshot_loop_and_its_failure_ends_the_loop():
    """The snapshot tick keeps its phase on a thread of its own: cancelling ``run`` ends that
    thread, and an error on that thread (a bug) ends ``run`` with it, so agentd stops saying why."""
    def tick_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "snapshot-tick"]

    agent = Agent([], 0.05)
    slot = agent.subscribe()
    task = asyncio.create_task(agent.run())
    await asyncio.wait_for(slot.take(), 2)
    assert len(tick_threads()) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if not tick_threads():
            break
        await asyncio.sleep(0.01)
    assert tick_threads() == []

    failing = Agent([], 0.05)
    calls = []

    def broken() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("a bug in sampling")

    failing.collect_for_snapshot = broken  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="a bug in sampling"):
        await asyncio.wait_for(failing.run(), 5)
    assert failing.latest is not None and failing.latest.sequence == 2


def test_a_failing_post_processor_is_logged_once_and_snapshots_go_on(caplog):
    agent = Agent([], 0.1)
    calls = []

    def judge(snapshot: pb.HostSnapshot) -> None:
        calls.append(snapshot.sequence)
        if snapshot.sequence <= 2:
            raise KeyError("rank 3")
        snapshot.hang.level = pb.HANG_LEVEL_OK

    agent.post_processors.append(judge)
    snapshots = [agent.snapshot() for _ in range(3)]
    assert calls == [1, 2, 3]
    assert snapshots[2].hang.level == pb.HANG_LEVEL_OK
    failures = [r for r in caplog.records if r.message == "snapshot post-processor failed"]
    assert len(failures) == 1 and failures[0].exc_info[0] is KeyError


def test_the_runner_times_each_collect_and_keeps_the_last_error():
    tick = TickCollector(0.01)
    real_collect = tick.collect

    def slow_collect() -> None:
        time.sleep(0.05)
        real_collect()

    tick.collect = slow_collect
    runner = CollectorRunner(tick)
    agent = Agent([runner], 0.1)
    assert agent.collector_runs() == {}  # never ran: nothing measured
    runner.start()
    try:
        assert runner.wait_first_sample(5)
        run = agent.collector_runs()["tick"]
        assert run.success and run.last_error == ""
        assert 0.05 <= run.duration_seconds < 2.0  # the call's wall time, sleep included
        tick.fail_collect = "sensor gone"
        assert wait_until(lambda: not runner.last_run.success)
        assert runner.last_run.last_error == "collect failed: OSError: sensor gone"
        tick.fail_collect = None
        assert wait_until(lambda: runner.last_run.success)
        assert runner.last_run.last_error == "collect failed: OSError: sensor gone"  # kept after recovery
    finally:
        runner.stop()


def test_a_collector_failing_every_tick_logs_once_per_interval(caplog):
    caplog.set_level(logging.INFO, logger="agentd.runner")
    now = [1000.0]
    tick = TickCollector(0.005)
    tick.fail_collect = "sensor gone"
    runner = CollectorRunner(tick, clock=lambda: now[0])
    runner.start()
    try:
        assert wait_until(lambda: len([r for r in caplog.records if r.message == "collect failed"]) == 1)
        time.sleep(0.2)  # dozens of failing ticks, no new line
        assert [r.message for r in caplog.records if r.name == "agentd.runner"] == ["collect failed"]
        first = next(r for r in caplog.records if r.message == "collect failed")
        assert (first.collector, first.reason, first.exc_info[0]) == ("tick", "collect failed: OSError: sensor gone",
                                                                      OSError)
        now[0] += FAILURE_LOG_INTERVAL_SECONDS
        assert wait_until(lambda: any(r.message == "collect still failing" for r in caplog.records))
        again = next(r for r in caplog.records if r.message == "collect still failing")
        assert again.failures_not_logged >= 10 and again.exc_info is None
        tick.fail_collect = None
        assert wait_until(lambda: any(r.message == "collect recovered" for r in caplog.records))
    finally:
        runner.stop()


class SnapshotClockedTick(TickCollector):
    """A TickCollector sampled by the snapshot tick (as the ranks collector is)."""

    clocked_by_snapshots = True


async def test_a_collector_clocked_by_snapshots_is_sampled_once_per_snapshot_and_never_on_its_own():
    tick = SnapshotClockedTick(0.01)  # on its own thread this would sample 5 times per snapshot
    runner = CollectorRunner(tick)
    agent = Agent([runner], 0.05)
    published: list[pb.HostSnapshot] = []
    agent.post_processors.append(published.append)
    agent.start_collectors()
    assert not any(t.name == "collector-tick" for t in threading.enumerate())
    task = asyncio.create_task(agent.run())
    try:
        assert await asyncio.to_thread(wait_until, lambda: len(published) >= 6)
    finally:
        task.cancel()
    assert [s.cpu.process_count for s in published[:6]] == [s.sequence for s in published[:6]] == [1, 2, 3, 4, 5, 6]
    agent.stop_collectors()
    samples = tick.samples
    runner.collect_for_snapshot()  # stopped: no sample after close
    assert tick.samples == samples and tick.closed


class TimedTick(TickCollector):
    """A TickCollector that records when each collect() ran; its first one is slow (as NVML's is)."""

    def __init__(self, name: str, interval_seconds: float) -> None:
        super().__init__(interval_seconds)
        self.name = name
        self.spans: list[tuple[float, float]] = []

    def collect(self) -> None:
        start = time.monotonic()
        time.sleep(0.06 if not self.spans else 0.005)
        self.spans.append((start, time.monotonic()))


def test_collectors_on_their_own_threads_start_one_after_the_other_and_keep_apart():
    """Started together, every collector thread would wake at the same moment each interval and
    wait on the others for the GIL (one more wakeup each time, 20-60 µs of CPU on the GPU VMs):
    each starts once the one before took its first sample, and their ticks keep that offset."""
    first, second = TimedTick("first", 0.3), TimedTick("second", 0.3)
    agent = Agent([CollectorRunner(first), CollectorRunner(second)], 0.3)
    agent.start_collectors()
    try:
        assert wait_until(lambda: len(first.spans) >= 4 and len(second.spans) >= 4)
    finally:
        agent.stop_collectors()
    assert second.spans[0][0] >= first.spans[0][1]  # started once the first had its first sample
    for (start_a, end_a), (start_b, end_b) in zip(first.spans[1:4], second.spans[1:4], strict=True):
        assert end_a <= start_b or end_b <= start_a, "two collectors sampled at the same time"
