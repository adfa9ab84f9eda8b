"""The console's events from Prometheus: the cluster view's rows, and the hosts drilled into watched over gRPC.

Past about a thousand hosts the console stops holding a stream per agent and reads the fleet
from the Prometheus (or Thanos, Mimir, VictoriaMetrics) that already scrapes the agents'
``/metrics``. Each refresh's rows (``fleet.fetch_fleet``) reach the cluster state as
``SummaryReceived`` events, so the cluster screen cannot tell the sources apart; a host whose
newest snapshot is older than ``stale_after_s`` is unreachable as stale, its last figures kept.

The console still talks to single agents over gRPC for what is asked for: a host drilled into is
watched directly (``PrometheusSource.attend``) while its screen is open, and traces and stacks go
to the agents as in direct mode.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agentd.address import AgentAddress
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.host_client import Emit, HostClient, RetryNow
from tuiprof.client.prometheus.figures import HostSelection
from tuiprof.client.prometheus.fleet import FleetView, fetch_fleet
from tuiprof.client.prometheus.http import PrometheusClient, PrometheusError
from tuiprof.model.events import HostEvent, HostUnreachable, SummaryReceived
from tuiprof.model.messages import HangStatus
from tuiprof.model.summary import SlowJob

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S = 5.0
STALE_AFTER_S = 60.0
"""A host whose newest snapshot in Prometheus is older than this is shown stale (unreachable,
last figures kept): at the usual 15-30 s scrape interval that is two scrapes or more missed
(with the recording rules, the newest snapshot their last evaluation recorded: up to one
evaluation interval, 15 s in docs/prometheus, older than the newest scraped)."""
RANK_HOSTS_AT_ONCE = 1024
"""The NCCL/GEMM view watches at most this many hosts' agents over gRPC: one console follows
about a thousand streams in half a core (bench/console/console_fleet.md)."""


def stale_reason(age: float) -> str:
    return (f"stale: its newest snapshot in Prometheus is {age:.0f} s old (the agent stopped "
            "sampling, or Prometheus stopped scraping it)")


@dataclass
class FleetEvents:
    """Turns successive views into host events, each change once: a row only when its
    snapshot is new, an unreachable host only when its reason changes."""

    address_of: Callable[[str], str]
    stale_after_s: float = STALE_AFTER_S
    _sampled: dict[str, float] = field(default_factory=dict)
    _errors: dict[str, str] = field(default_factory=dict)

    def seen(self) -> list[str]:
        """Nodes seen so far: a node that vanishes later is reported missing, not forgotten."""
        return list(self._sampled)

    def forget(self, node: str) -> None:
        """Report the node afresh next time (its row was fed from elsewhere meanwhile)."""
        self._sampled.pop(node, None)
        self._errors.pop(node, None)

    def events(self, view: FleetView, skip: Iterable[str] = ()) -> list[HostEvent]:
        skipped = set(skip)
        result: list[HostEvent] = []
        for node, row in view.rows.items():
            if node in skipped:
                continue
            if self._sampled.get(node) != row.sampled_at:
                self._sampled[node] = row.sampled_at
                self._errors.pop(node, None)
                result.append(SummaryReceived(self.address_of(node), row.sampled_at, row.summary))
            age = view.evaluated_at - row.sampled_at
            if age > self.stale_after_s:
                self._unreachable(result, node, view.evaluated_at, stale_reason(age))
        for node, reason in view.missing.items():
            if node not in skipped:
                self._sampled.setdefault(node, float("nan"))  # NaN: seen, no figure (never equal)
                self._unreachable(result, node, view.evaluated_at, reason)
        return result

    def all_unreachable(self, at: float, error: str, skip: Iterable[str] = ()) -> list[HostEvent]:
        """Prometheus itself failed: every known host is unknown now, for that reason."""
        skipped = set(skip)
        result: list[HostEvent] = []
        for node in self._sampled:
            if node not in skipped:
                self._unreachable(result, node, at, error)
        return result

    def _unreachable(self, result: list[HostEvent], node: str, at: float, error: str) -> None:
        # the age in a stale reason grows every refresh: compare the kind of reason, not its text
        kind = error.split(":", 1)[0]
        if self._errors.get(node, "").split(":", 1)[0] != kind:
            result.append(HostUnreachable(self.address_of(node), at, error))
        self._errors[node] = error


NO_VIEW_YET = "no answer from Prometheus yet: no host with ranks known (try again after a refresh)"
NO_RANKS = "no host in Prometheus has training processes (ranks appear once started with `tuiprof run`)"


@dataclass(frozen=True)
class RankHosts:
    """The agents asked about ranks (``addresses``) of the ``with_ranks`` hosts Prometheus shows with some."""

    addresses: list[str]
    with_ranks: int

    def cut(self) -> str:
        """What the bound left out and how to narrow the view ("" when nothing was)."""
        if len(self.addresses) == self.with_ranks:
            return ""
        return (f"the first {len(self.addresses)} of {self.with_ranks} hosts with ranks (hung or suspect "
                "first, then by name); name the job with --slurm-job or fewer hosts with --match to see the rest")


@dataclass
class PrometheusSource:
    """The console's events from Prometheus every ``refresh_s``; hosts drilled into from their agents.

    ``agent_port`` and ``options`` say how to reach an agent over gRPC (the cluster
    state is keyed by agent address, so traces and stacks find them as in direct mode).
    """

    url: str
    selection: HostSelection
    options: ConnectionOptions
    agent_port: int
    refresh_s: float = DEFAULT_REFRESH_S
    stale_after_s: float = STALE_AFTER_S
    live: bool = True
    retry: RetryNow = field(default_factory=RetryNow)
    last_view: FleetView | None = None
    _attended: dict[str, tuple[asyncio.Task[None], Callable[[], bool]]] = field(default_factory=dict)
    _emit: Emit | None = None

    def __post_init__(self) -> None:
        self._events = FleetEvents(self.address, self.stale_after_s)
        self._nodes: dict[str, str] = {}
        """Node of each agent address, and address of each node."""
        self._addresses: dict[str, str] = {}
        self._released: set[str] = set()
        """Nodes watched over gRPC until now: their next row is built afresh from Prometheus."""

    def address(self, node: str) -> str:
        address = self._addresses.get(node)
        if address is None:  # asked for every host at every refresh: made once per node
            address = self._addresses[node] = str(AgentAddress(node, self.agent_port))
            self._nodes[address] = node
        return address

    @property
    def hosts(self) -> list[str]:
        return [self.address(node) for node in self.selection.expected]

    async def run(self, emit: Emit) -> None:
        self._emit = emit
        async with PrometheusClient(self.url) as client:
            try:
                while True:
                    started = time.monotonic()
                    await self.refresh(client, emit)
                    await self.retry.sleep(max(0.0, self.refresh_s - (time.monotonic() - started)))
            finally:
                for task, _ in self._attended.values():
                    task.cancel()

    async def refresh(self, client: PrometheusClient, emit: Emit) -> None:
        """One round of queries, turned into events (a failed round makes every host unknown)."""
        self._release_closed()
        attended = [self._nodes[a] for a in self._attended]
        last = self.last_view
        previous = {} if last is None else last.rows
        if self._released:
            previous = {node: row for node, row in previous.items() if node not in self._released}
        try:
            # the rules are most likely loaded at fleet scale (they make it work): the first guess
            view = await fetch_fleet(client, self.selection, self._events.seen(),
                                     guess=True if last is None else last.recorded, previous=previous)
        except PrometheusError as exc:
            log.warning("prometheus refresh failed", extra={"url": self.url, "error": str(exc)})
            for event in self._events.all_unreachable(time.time(), str(exc), attended):
                emit(event)
            return
        self._released.clear()
        self.last_view = view
        for event in self._events.events(view, attended):
            emit(event)

    def attended(self) -> list[str]:
        """The hosts watched over gRPC now."""
        return list(self._attended)

    def hang(self, address: str) -> HangStatus | None:
        """The host's suspect or hung verdict as Prometheus has it; None when it has none, or
        when the host is watched over gRPC (its own snapshots then carry the verdict)."""
        if self.last_view is None or address in self._attended:
            return None
        return self.last_view.hangs.get(self._nodes.get(address, address))

    def slow_jobs(self) -> list[SlowJob]:
        """The costliest slow jobs as Prometheus has them (the agents' verdicts, each judged on its host)."""
        return self.last_view.slow_jobs if self.last_view is not None else []

    def rank_hosts(self) -> RankHosts | None:
        """The hosts the console asks over gRPC about their ranks (the NCCL/GEMM view, stacks):
        those with ranks in Prometheus, the hung or suspect ones first, then by name, at most
        ``RANK_HOSTS_AT_ONCE``; None before Prometheus's first answer."""
        view = self.last_view
        if view is None:
            return None
        with_ranks = sorted((node for node, row in view.rows.items() if row.rank_count > 0),
                            key=lambda node: (node not in view.hangs, node))
        return RankHosts([self.address(node) for node in with_ranks[:RANK_HOSTS_AT_ONCE]], len(with_ranks))

    def attend_ranks(self, while_: Callable[[], bool]) -> str:
        """Watch over gRPC, while ``while_()`` holds, the agents of ``rank_hosts`` (the NCCL/GEMM
        view: per-op latencies, first calls and how each figure was timed are in the agents'
        snapshots only). Says what it did."""
        chosen = self.rank_hosts()
        if chosen is None:
            return NO_VIEW_YET
        for address in chosen.addresses:
            self.attend(address, while_)
        if not chosen.addresses:
            return NO_RANKS
        text = f"the ranks of {len(chosen.addresses)} host(s), from their agents over gRPC while this view is open"
        return f"{text}: {chosen.cut()}" if chosen.cut() else text

    def attend(self, address: str, while_: Callable[[], bool]) -> None:
        """Watch this host's agent over gRPC while ``while_()`` holds (its screen is open)."""
        if address in self._attended or self._emit is None:
            return
        client = HostClient(AgentAddress.parse(address, self.agent_port), self.options, self._emit, retry=self.retry)
        self._attended[address] = (asyncio.create_task(client.run(), name=f"watch {address}"), while_)

    def _release_closed(self) -> None:
        for address, (task, while_) in list(self._attended.items()):
            if not while_():
                task.cancel()
                del self._attended[address]
                node = self._nodes.get(address, address)
                self._events.forget(node)
                self._released.add(node)
