"""Running collectors: loading them from the registry and sampling each in its own thread.

A collector is third-party-ish code that touches drivers; the runner keeps its
failures contained. An exception in ``collect()`` marks the collector
unavailable (with the exception as the reason) until a later sample succeeds,
and its stale data is left out of snapshots rather than shown as current.

The runner also times every ``collect()`` (wall time, around the call) and
keeps the outcome as ``last_run``, the way node_exporter times its collectors:
``/metrics`` exports it as ``tuiprof_collector_duration_seconds`` and
``tuiprof_collector_success``. It also adds up the CPU time of the calls (the
calling thread's, so not the time spent waiting for the GIL or a lock, which the
wall time includes): ``tuiprof_collector_cpu_seconds_total``, what each collector
costs the host. Collectors do not time themselves. A failure is
logged when it starts, then at most once per ``FAILURE_LOG_INTERVAL_SECONDS``
while it lasts (with the count of failures since the last line), and once more
when the collector recovers.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
import math
import time
from collections.abc import Callable, Iterable

from agentd.collectors.base import Collector
from agentd.proto import tuiprof_agent_pb2 as pb

log = logging.getLogger(__name__)

# A collector failing on every tick logs one line per this many seconds, not one per tick.
FAILURE_LOG_INTERVAL_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class CollectRun:
    """How a collector's latest ``collect()`` went, as the runner measured it."""

    duration_seconds: float  # wall time of the call
    success: bool
    # Why the latest failing call failed; kept after a recovery ("" until a call fails).
    last_error: str
    cpu_seconds_total: float  # CPU time of every call so far, this one included


class UnloadableCollector(Collector):
    """Stands for a registered collector whose module could not be imported."""

    def __init__(self, name: str, interval_seconds: float, reason: str) -> None:
        super().__init__(interval_seconds)
        self.name = name
        self._reason = reason

    def status(self) -> pb.CollectorStatus:
        return pb.CollectorStatus(
            name=self.name, available=False, reason=self._reason,
            interval_seconds=self.interval_seconds,
        )

    def collect(self) -> None:
        raise RuntimeError(f"collector {self.name} is not loaded: {self._reason}")

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        """Nothing to fill: the status says why."""


def load_collectors(entries: Iterable[str], interval_seconds: float) -> list[Collector]:
    """One collector per ``"module:factory"`` entry; import failures become unavailable ones."""
    collectors: list[Collector] = []
    for entry in entries:
        module_name, _, factory_name = entry.partition(":")
        name = module_name.rsplit(".", 1)[-1]
        try:
            factory = getattr(importlib.import_module(module_name), factory_name)
            collectors.append(factory(interval_seconds))
        except Exception as exc:  # an optional part missing must not stop the agent
            reason = f"cannot load {entry}: {type(exc).__name__}: {exc}"
            log.warning("collector unavailable", extra={"collector": name, "reason": reason})
            collectors.append(UnloadableCollector(name, interval_seconds, reason))
    return collectors


class CollectorRunner:
    """Calls one collector's ``collect()`` every ``interval_seconds`` on its own thread, or,
    for a collector clocked by snapshots, whenever the agent asks (``collect_for_snapshot``)."""

    def __init__(self, collector: Collector, clock: Callable[[], float] = time.monotonic) -> None:
        self.collector = collector
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pulled = False  # started, and sampled by the snapshot tick
        self._collect_lock = threading.Lock()  # a pulled collect() and close() never overlap
        self._error: str | None = None
        self._collected = threading.Event()
        # Replaced whole by the collector thread, read by others: None until the first collect().
        self.last_run: CollectRun | None = None
        self._cpu_seconds = 0.0
        self._failures_unlogged = 0
        self._failure_logged_at = -math.inf

    @property
    def name(self) -> str:
        return self.collector.name

    def start(self) -> None:
        """Start sampling, unless the collector says it cannot work here."""
        if not self._safe_status().available:
            return
        if self.collector.clocked_by_snapshots:
            self._pulled = True
            return
        self._thread = threading.Thread(
            target=self._loop, name=f"collector-{self.name}", daemon=True
        )
        self._thread.start()

    @property
    def has_thread(self) -> bool:
        """Whether it samples on a thread of its own (started, and not clocked by snapshots)."""
        return self._thread is not None

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._collect_lock:
            try:
                self.collector.close()
            except Exception:
                log.exception("collector close failed", extra={"collector": self.name})

    def collect_for_snapshot(self) -> None:
        """One sample for the coming snapshot, when the collector is clocked by snapshots."""
        with self._collect_lock:
            if self._pulled and not self._stop.is_set():
                self._collect_once()

    def wait_first_sample(self, timeout: float) -> bool:
        return self._collected.wait(timeout)

    def _loop(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            self._collect_once()
            interval = self.collector.interval_seconds  # read each tick: it may change (Agent.set_interval)
            deadline += interval
            now = time.monotonic()
            if deadline < now:  # a sample overran: skip the missed ticks, keep the phase
                deadline += ((now - deadline) // interval + 1) * interval
            self._stop.wait(deadline - now)

    def _collect_once(self) -> None:
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            self.collector.collect()
        except Exception as exc:
            duration = time.perf_counter() - started
            self._cpu_seconds += time.thread_time() - cpu_started
            self._error = f"collect failed: {type(exc).__name__}: {exc}"
            self.last_run = CollectRun(duration, False, self._error, self._cpu_seconds)
            self._log_failure(exc)
        else:
            duration = time.perf_counter() - started
            self._cpu_seconds += time.thread_time() - cpu_started
            last_error = self.last_run.last_error if self.last_run is not None else ""
            self.last_run = CollectRun(duration, True, last_error, self._cpu_seconds)
            if self._error is not None:
                log.info("collect recovered", extra={"collector": self.name,
                                                     "failures_not_logged": self._failures_unlogged})
            self._error = None
            self._failures_unlogged = 0
            self._failure_logged_at = -math.inf
            self._collected.set()

    def _log_failure(self, exc: Exception) -> None:
        """The first failure with its traceback, then one line per FAILURE_LOG_INTERVAL_SECONDS."""
        now = self._clock()
        if now - self._failure_logged_at < FAILURE_LOG_INTERVAL_SECONDS:
            self._failures_unlogged += 1
            return
        extra = {"collector": self.name, "reason": self._error, "failures_not_logged": self._failures_unlogged}
        if self._failure_logged_at == -math.inf:
            log.error("collect failed", exc_info=exc, extra=extra)
        else:
            log.error("collect still failing", extra=extra)
        self._failure_logged_at = now
        self._failures_unlogged = 0

    def _safe_status(self) -> pb.CollectorStatus:
        try:
            status = self.collector.status()
        except Exception as exc:
            log.exception("status failed", extra={"collector": self.name})
            return pb.CollectorStatus(
                name=self.name, available=False,
                reason=f"status failed: {type(exc).__name__}: {exc}",
                interval_seconds=self.collector.interval_seconds,
            )
        status.name = status.name or self.name
        status.interval_seconds = status.interval_seconds or self.collector.interval_seconds
        return status

    def status(self) -> pb.CollectorStatus:
        """The collector's own status, overridden when its last sample failed."""
        status = self._safe_status()
        if status.available and self._error is not None:
            status.available = False
            status.reason = self._error
        return status

    def fill(self, snapshot: pb.HostSnapshot, status: pb.CollectorStatus) -> pb.CollectorStatus:
        """Add this collector's latest sample to ``snapshot``; returns the status to report.

        The collector fills a scratch message that is merged only when ``fill``
        succeeds, so a failing collector cannot leave half its data behind.
        """
        if not status.available or not self._collected.is_set():
            return status
        part = pb.HostSnapshot()
        try:
            self.collector.fill(part)
        except Exception as exc:
            log.exception("fill failed", extra={"collector": self.name})
            return pb.CollectorStatus(
                name=status.name, available=False,
                reason=f"fill failed: {type(exc).__name__}: {exc}",
                interval_seconds=status.interval_seconds,
            )
        snapshot.MergeFrom(part)
        return status

    def describe(self, info: pb.AgentInfo) -> None:
        part = pb.AgentInfo()
        try:
            self.collector.describe(part)
        except Exception:
            log.exception("describe failed", extra={"collector": self.name})
            return
        info.MergeFrom(part)
