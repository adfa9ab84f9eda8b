"""The agent's state: one HostSnapshot per interval, handed to every watcher as a latest value.

Collectors sample on their own threads (``agentd.runner``); this module only
assembles what they last sampled, on the asyncio loop that also serves gRPC.
Collectors clocked by snapshots (rates of cumulative counters) are sampled by
the snapshot tick itself, on its own thread, right before each snapshot:
every operation they count lands in exactly one published interval.
Watchers (gRPC ``Watch`` streams, the JSON sink) each own a ``LatestSlot``:
publishing overwrites the slot, so a watcher that falls behind skips snapshots
and never holds more than one, however slow it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.runner import CollectorRunner, CollectRun

log = logging.getLogger(__name__)

# The longest a collector's first sample is waited for before the next collector starts.
STAGGER_MAX_S = 0.2


class LatestSlot:
    """Holds at most one snapshot: the newest one not yet taken."""

    def __init__(self) -> None:
        self._value: pb.HostSnapshot | None = None
        self._ready = asyncio.Event()

    def put(self, snapshot: pb.HostSnapshot) -> None:
        self._value = snapshot
        self._ready.set()

    @property
    def pending(self) -> bool:
        return self._value is not None

    async def take(self) -> pb.HostSnapshot:
        await self._ready.wait()
        self._ready.clear()
        value, self._value = self._value, None
        assert value is not None
        return value


class Agent:
    """Runs the collectors and publishes a snapshot every ``interval_seconds``.

    Snapshots are shared between watchers: treat them as read-only.
    """

    def __init__(
        self,
        runners: Sequence[CollectorRunner],
        interval_seconds: float,
        hostname: str | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.runners = list(runners)
        self.interval_seconds = interval_seconds
        self.hostname = hostname or socket.gethostname()
        self._clock_ns = clock_ns
        self._sequence = 0
        self._watchers: set[LatestSlot] = set()
        self.latest: pb.HostSnapshot | None = None
        self.previous: pb.HostSnapshot | None = None  # the one before latest (per-interval deltas)
        self.latest_monotonic: float | None = None
        # Called on every assembled snapshot before it is published (e.g. hang verdicts,
        # which judge what the collectors filled in).
        self.post_processors: list[Callable[[pb.HostSnapshot], None]] = []
        self._failing_post_processors: set[Callable[[pb.HostSnapshot], None]] = set()

    def start_collectors(self) -> None:
        """Start the collectors one after the other: each thread once the one before has taken
        its first sample (or after ``STAGGER_MAX_S``). Their ticks keep these offsets, so they do
        not all wake at once and wait on each other for the GIL: each such wait is one more
        wakeup, 20-60 µs of CPU on the GPU VMs (bench/console/wakeup_cost.py)."""
        for runner in self.runners:
            runner.start()
            if runner.has_thread:
                runner.wait_first_sample(min(STAGGER_MAX_S, self.interval_seconds / 4))

    def set_interval(self, seconds: float) -> None:
        """Sample and publish every ``seconds`` from the next tick on (the console's `-`/`+` over its
        embedded agent): the snapshot tick and every collector thread read it each tick."""
        self.interval_seconds = seconds
        for runner in self.runners:
            runner.collector.interval_seconds = seconds

    def stop_collectors(self) -> None:
        for runner in self.runners:
            runner.stop()

    def statuses(self) -> list[pb.CollectorStatus]:
        return [runner.status() for runner in self.runners]

    def collector_runs(self) -> dict[str, CollectRun]:
        """Each collector's latest collect() as its runner timed it (collectors that never ran are absent)."""
        return {runner.name: run for runner in self.runners if (run := runner.last_run) is not None}

    def collect_for_snapshot(self) -> None:
        """Sample the collectors clocked by snapshots (blocking: call it off the event loop)."""
        for runner in self.runners:
            runner.collect_for_snapshot()

    def describe(self, info: pb.AgentInfo) -> None:
        """Let every collector add what it knows to ``info`` (GPUs, driver versions)."""
        for runner in self.runners:
            runner.describe(info)
        del info.collectors[:]
        info.collectors.extend(self.statuses())

    def snapshot(self) -> pb.HostSnapshot:
        """Assemble one snapshot from every collector's latest sample."""
        self._sequence += 1
        snapshot = pb.HostSnapshot(
            hostname=self.hostname,
            timestamp_unix_ns=self._clock_ns(),
            sequence=self._sequence,
        )
        for runner in self.runners:
            snapshot.collectors.append(runner.fill(snapshot, runner.status()))
        for post_process in self.post_processors:
            try:
                post_process(snapshot)
            except Exception:  # a bug in one post-processor must not stop the snapshots
                if post_process not in self._failing_post_processors:
                    log.exception("snapshot post-processor failed",
                                  extra={"post_processor": repr(post_process)})
                self._failing_post_processors.add(post_process)
            else:
                self._failing_post_processors.discard(post_process)
        return snapshot

    def subscribe(self, slot: LatestSlot | None = None) -> LatestSlot:
        """``slot`` (default: a new one) receives every published snapshot, starting with the newest one.

        Call it on the agent's loop, as ``unsubscribe``.
        """
        slot = slot or LatestSlot()
        if self.latest is not None:
            slot.put(self.latest)
        self._watchers.add(slot)
        return slot

    def unsubscribe(self, slot: LatestSlot) -> None:
        self._watchers.discard(slot)

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    def publish(self, snapshot: pb.HostSnapshot) -> None:
        self.previous, self.latest = self.latest, snapshot
        self.latest_monotonic = time.monotonic()
        for slot in self._watchers:
            slot.put(snapshot)

    async def run(self) -> None:
        """Publish a snapshot every interval until cancelled, on a fixed phase.

        The phase is kept by a thread of its own (``_TickThread``), which also samples the
        collectors clocked by snapshots (their reads may block: the ranks collector reads
        /proc) and then hands the tick to this loop, which assembles and publishes the
        snapshot. A loop waking on its own timer to hand the sampling to a worker thread and
        back woke twice more a second: ~130 µs of CPU on the GPU VM (bench/console/wakeup_cost.py).
        """
        tick = _TickThread(self, asyncio.get_running_loop())
        tick.start()
        try:
            while True:
                await tick.sampled()
                self.publish(self.snapshot())
                tick.published.set()
        finally:
            tick.stop()


class _TickThread(threading.Thread):
    """Samples the snapshot-clocked collectors once per interval, in step with the loop that
    publishes: a tick is sampled only once the one before was published."""

    def __init__(self, agent: Agent, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name="snapshot-tick", daemon=True)
        self._agent, self._loop = agent, loop
        self._ready = asyncio.Event()  # set on the loop: a tick is sampled
        self._failure: BaseException | None = None
        self.published = threading.Event()  # set by the loop: the tick before was published
        self.published.set()
        self._stopping = threading.Event()

    async def sampled(self) -> None:
        """Return once a tick is sampled; raise what ended this thread if it failed."""
        await self._ready.wait()
        self._ready.clear()
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        self._stopping.set()
        self.published.set()  # not waiting for a publication that will not come

    def run(self) -> None:
        deadline = time.monotonic()
        try:
            while True:
                interval = self._agent.interval_seconds  # read each tick: it may change (set_interval)
                self.published.wait()
                if self._stopping.is_set():
                    return
                self.published.clear()
                self._agent.collect_for_snapshot()
                try:
                    self._loop.call_soon_threadsafe(self._ready.set)
                except RuntimeError:  # the loop is closed: nobody left to publish
                    return
                deadline += interval
                now = time.monotonic()
                if deadline < now:
                    skipped = int((now - deadline) // interval) + 1
                    log.warning("snapshot loop fell behind", extra={"skipped_intervals": skipped})
                    deadline += skipped * interval
                if self._stopping.wait(deadline - now):
                    return
        except BaseException as exc:  # a bug: the agent's snapshot loop ends with it
            self._failure = exc
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._ready.set)
