"""Where the console's host events come from: live agents, this host, or a recording."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agentd.address import AgentAddress
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.host_client import Emit, RetryNow, watch_all
from tuiprof.model.events import HostEvent

if TYPE_CHECKING:  # the agent is imported only when one is started
    from agentd.embedded import EmbeddedAgent


class EventSource(Protocol):
    """Runs until cancelled (or until a recording ends), reporting host events."""

    @property
    def hosts(self) -> list[str]:
        """The hosts known before any event arrives (the cluster view shows them at once)."""

    live: bool

    async def run(self, emit: Emit) -> None: ...


@dataclass
class LiveSource:
    """One client per agent."""

    addresses: list[AgentAddress]
    options: ConnectionOptions
    live: bool = True
    retry: RetryNow = field(default_factory=RetryNow)

    @property
    def hosts(self) -> list[str]:
        return [str(a) for a in self.addresses]

    async def run(self, emit: Emit) -> None:
        await watch_all(self.addresses, self.options, emit, self.retry)


@dataclass
class LocalSource:
    """This host, through an agent embedded in the console process (its snapshots taken in-process).

    The agent reads the host-wide PMU counters only while a screen shows them (``sample_pmu``),
    and serves gRPC from the first channel the console opens to it (``options.in_process``). It serves
    Kineto in the user's console folder, where `tuiprof run` points their jobs (agentd.kineto.console_folder).
    """

    options: ConnectionOptions
    live: bool = True
    hosts: list[str] = field(default_factory=list)
    retry: RetryNow = field(default_factory=RetryNow)
    _agent: EmbeddedAgent | None = field(default=None, init=False, repr=False)
    _pmu_shown: bool = field(default=False, init=False, repr=False)

    async def run(self, emit: Emit) -> None:
        from tuiprof.client.local import embedded_agent, serve_grpc, watch_embedded

        async with embedded_agent(self.options.interval_ms, pmu_when_shown=True, console_kineto_folder=True) as agent:
            self._agent = agent
            agent.sample_pmu(self._pmu_shown)
            self.options.in_process.add(agent.address, lambda: serve_grpc(agent))
            try:
                await watch_embedded(agent, self.options, emit)
            finally:
                self.options.in_process.remove(agent.address)
                self._agent = None

    def set_interval(self, interval_ms: int) -> None:
        """Snapshots every ``interval_ms`` from the agent's next tick on: it samples at the console's
        interval, and is changed in place (a restart would make it a new host, on a new port)."""
        self.options = dataclasses.replace(self.options, interval_ms=interval_ms)
        if self._agent is not None:
            self._agent.set_interval(interval_ms / 1000)

    def sample_pmu(self, shown: bool) -> None:
        """Whether a screen shows this host's PMU counters now (the agent reads them only then)."""
        self._pmu_shown = shown
        if self._agent is not None:
            self._agent.sample_pmu(shown)


@dataclass
class ReplaySource:
    """A recording, at its original pace times ``speed`` (0: everything at once).

    ``pause``/``resume`` stop and restart the clock (post-mortems: stop at the
    moment things went wrong and look around).
    """

    events: Sequence[HostEvent]
    speed: float = 1.0
    live: bool = False
    paused: bool = False
    _resumed: asyncio.Event = field(default_factory=asyncio.Event)
    _paused_for: float = 0.0
    _paused_at: float = 0.0

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(event.host for event in self.events))

    def pause(self) -> None:
        if not self.paused:
            self.paused, self._paused_at = True, time.monotonic()
            self._resumed.clear()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self._paused_for += time.monotonic() - self._paused_at
            self._resumed.set()

    async def run(self, emit: Emit) -> None:
        if not self.events:
            return
        start_wall, start_at = time.monotonic(), self.events[0].at
        for event in self.events:
            while self.paused:
                await self._resumed.wait()
            if self.speed > 0:
                due = start_wall + self._paused_for + (event.at - start_at) / self.speed
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                    while self.paused:  # paused while sleeping: wait, then keep the pace
                        await self._resumed.wait()
            emit(event)
