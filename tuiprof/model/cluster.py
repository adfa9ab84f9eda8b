"""The state of every watched host: reachable or not (why, since when), latest data, history."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.model.events import HostEvent, HostUnreachable, InfoReceived, SnapshotReceived, SummaryReceived
from tuiprof.model.history import DEFAULT_CAPACITY, History
from tuiprof.model.messages import AgentInfo, HangLevel, HostSnapshot
from tuiprof.model.summary import HostSummary, summarize
from tuiprof.model.values import Reading, Unavailable

CONNECTING = "connecting"


@dataclass(frozen=True)  # no slots: ``snapshot`` caches itself in the instance dict
class HostState:
    """One host as the console sees it.

    ``reachable`` is None until the first answer or failure. ``last_contact`` is the
    time of the last answer (None if it never answered); ``error`` says why the host
    is unreachable now. ``message`` is the last snapshot as received; ``snapshot``
    is its model, built the first time a view asks for it.
    """

    address: str
    reachable: bool | None = None
    error: str = ""
    last_contact: float | None = None
    info: AgentInfo | None = None
    message: pb.HostSnapshot | None = None
    summary: HostSummary | None = None

    @functools.cached_property
    def snapshot(self) -> HostSnapshot | None:
        return HostSnapshot.from_proto(self.message) if self.message is not None else None

    @property
    def name(self) -> str:
        """The agent's hostname once known, else the address the user gave."""
        if self.message is not None and self.message.hostname:
            return self.message.hostname
        return self.address


def history_samples(summary: HostSummary) -> tuple[tuple[str, Reading], ...]:
    """The series kept per host (the host view's graphs)."""
    return (
        ("cpu", summary.cpu_percent),
        ("memory", summary.memory_percent),
        ("gpu_util", summary.gpu_util_mean),
        ("sm_active", summary.sm_active_mean),
        ("power", summary.power_watts),
        ("busbw", summary.nccl_busbw_bytes_per_s),
        ("step", summary.step_time_seconds),
    )


class ClusterState:
    """Hosts in the order given; ``now`` follows the newest event (or ``tick``)."""

    def __init__(self, addresses: Iterable[str], history_capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = history_capacity
        self._hosts: dict[str, HostState] = {}
        self._history: dict[str, History] = {}
        self._names: Counter[str] = Counter()
        """How many watched agents answer with each name (kept as names change: asked at every redraw)."""
        self.now = 0.0
        self.version = 0
        """Bumped on every change, so views can skip redrawing when nothing changed."""
        for address in addresses:
            self.add(address)

    def add(self, address: str) -> None:
        if address not in self._hosts:
            self._hosts[address] = HostState(address, error=CONNECTING)
            self._names[address] += 1
            self._history[address] = History(self._capacity)
            self.version += 1

    def apply(self, event: HostEvent) -> HostState:
        self.add(event.host)
        old = self._hosts[event.host]
        self.now = max(self.now, event.at)
        # The two events that come by the thousand are built field by field: half the time of
        # dataclasses.replace, which a 10,000-host Prometheus refresh pays 10,000 times.
        if isinstance(event, SummaryReceived):
            self._history[event.host].extend(history_samples(event.summary), event.at)
            new = HostState(address=old.address, reachable=True, error="", last_contact=event.at, info=old.info,
                            message=old.message, summary=event.summary)
        elif isinstance(event, SnapshotReceived):
            summary = summarize(event.message)
            self._history[event.host].extend(history_samples(summary), event.at)
            new = HostState(address=old.address, reachable=True, error="", last_contact=event.at, info=old.info,
                            message=event.message, summary=summary)
            if new.name != old.name:  # only a snapshot carries the agent's hostname
                self._names[old.name] -= 1
                self._names[new.name] += 1
        elif isinstance(event, InfoReceived):
            info = AgentInfo.from_proto(event.message)
            new = dataclasses.replace(old, reachable=True, error="", last_contact=event.at, info=info)
        elif isinstance(event, HostUnreachable):
            new = dataclasses.replace(old, reachable=False, error=event.error)
        else:
            raise TypeError(f"not a host event: {event!r}")
        self._hosts[event.host] = new
        self.version += 1
        return new

    def tick(self, now: float) -> None:
        """Advance the clock used for "last contact N s ago"."""
        self.now = max(self.now, now)

    def host(self, address: str) -> HostState:
        try:
            return self._hosts[address]
        except KeyError:
            raise KeyError(f"unknown host {address!r}; watched: {', '.join(self._hosts)}") from None

    def history(self, address: str) -> History:
        return self._history[address]

    def hosts(self) -> list[HostState]:
        return list(self._hosts.values())

    def addresses(self) -> list[str]:
        return list(self._hosts)

    def shared_names(self) -> set[str]:
        """Hostnames two or more watched agents answer with (two agents on one machine)."""
        return {name for name, count in self._names.items() if count > 1}

    def label(self, state: HostState, shared: set[str] | None = None) -> str:
        """The host's name, told apart by its address when another agent has the same name
        (``shared``: ``shared_names()``, passed in when labelling many hosts)."""
        shared = self.shared_names() if shared is None else shared
        return f"{state.name}@{state.address}" if state.name in shared else state.name

    def since_contact(self, state: HostState) -> float | None:
        return None if state.last_contact is None else self.now - state.last_contact


_HANG_RANK = {HangLevel.HUNG: 1, HangLevel.SUSPECT: 2}


def worst_first(state: HostState) -> tuple[int, float, float]:
    """Sort key putting the host most in need of attention first.

    Unreachable, then hung, then suspect hosts; among the rest the lowest minimum
    GPU utilization (the idle GPU that holds the job back), then the slowest step.
    """
    if not state.reachable or state.summary is None:
        return (0, 0.0, 0.0)
    summary = state.summary
    level = _HANG_RANK.get(summary.hang_level, 3)
    low_util = summary.gpu_util_min
    step = summary.step_time_seconds
    return (
        level,
        float("inf") if isinstance(low_util, Unavailable) else low_util,
        0.0 if isinstance(step, Unavailable) else -step,
    )
