"""What an event source may offer the console besides its events, as Protocols the app tests for.

Every source is an ``EventSource`` (``tuiprof.client.sources``); some offer more:

| feature        | what the console does with it                         | sources                                    |
|----------------|-------------------------------------------------------|--------------------------------------------|
| ``AsksAgents`` | its screens reach the agents as it does; reconnect    | LiveSource, LocalSource, PrometheusSource  |
| ``SamplesPmu`` | the PMU counters read only while a screen shows them  | LocalSource (this host's embedded agent)   |
| ``Pausable``   | pause and play                                        | ReplaySource                               |
| ``FleetView``  | Prometheus's verdicts; hosts watched over gRPC while open | PrometheusSource                       |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.host_client import RetryNow
from tuiprof.model.messages import HangStatus
from tuiprof.model.summary import SlowJob


@runtime_checkable
class AsksAgents(Protocol):
    """A source that talks to agents over gRPC: how it reaches them, and its "retry now"."""

    options: ConnectionOptions
    retry: RetryNow


@runtime_checkable
class SamplesPmu(Protocol):
    def sample_pmu(self, shown: bool) -> None:
        """Read the host-wide PMU counters while ``shown`` (a screen shows them), rest otherwise."""


@runtime_checkable
class Pausable(Protocol):
    paused: bool

    def pause(self) -> None: ...

    def resume(self) -> None: ...


@runtime_checkable
class FleetView(Protocol):
    """Prometheus mode: every host's row from Prometheus, chosen hosts from their agents over gRPC."""

    def hang(self, address: str) -> HangStatus | None:
        """The host's suspect or hung verdict as Prometheus has it (None: none, or watched over gRPC)."""

    def slow_jobs(self) -> list[SlowJob]:
        """The costliest slow jobs as Prometheus has them."""

    def attend(self, address: str, while_: Callable[[], bool]) -> None:
        """Watch this host's agent over gRPC while ``while_()`` holds."""

    def attend_ranks(self, while_: Callable[[], bool]) -> str:
        """Watch the agents of the hosts with ranks while ``while_()`` holds; says what it did."""
