"""A cluster-wide trace capture as it goes: each host's targets, fetched files and error.

Filled by ``tuiprof.client.capture`` (the network side) and read by the trace
command, the traces screen and the merge (``tuiprof.analysis.trace_summary``).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

from agentd.proto.words import FINAL_TRACE_TARGET_STATES, trace_target_state
from tuiprof.model.messages import TraceTarget, TraceTargetState

FINAL_STATES = frozenset(TraceTargetState(trace_target_state(state)) for state in FINAL_TRACE_TARGET_STATES)


@dataclass(frozen=True)
class FetchedFile:
    host: str
    pid: int
    rank: int | None
    remote: str  # path relative to the agent's trace dir
    local: pathlib.Path


@dataclass
class HostProgress:
    """One host's capture as it goes: ``phase`` is starting, waiting (for a process to register with the
    agent), capturing, done or failed."""

    host: str
    phase: str = "starting"
    capture_id: str = ""
    targets: list[TraceTarget] = field(default_factory=list)
    files: list[FetchedFile] = field(default_factory=list)
    message: str = ""
    error: str = ""

    @property
    def finished_targets(self) -> int:
        return sum(t.state in FINAL_STATES for t in self.targets)

    @property
    def delivered(self) -> bool:
        """Every matched rank's file is here (a host that matched nothing delivered nothing)."""
        return not self.error and bool(self.targets) and len(self.files) == len(self.targets)

    def states_text(self) -> str:
        """How many targets are in each state, e.g. ``"1 capturing, 3 written"``."""
        states: dict[TraceTargetState, int] = {}
        for target in self.targets:
            states[target.state] = states.get(target.state, 0) + 1
        return ", ".join(f"{n} {state}" for state, n in sorted(states.items()))


@dataclass
class ClusterCapture:
    start_time_unix_ms: int
    hosts: list[HostProgress]

    @property
    def files(self) -> list[FetchedFile]:
        return [f for h in self.hosts for f in h.files]

    @property
    def matched(self) -> int:
        return sum(len(h.targets) for h in self.hosts)
