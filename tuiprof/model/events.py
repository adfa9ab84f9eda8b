"""What the client layer reports about one host; the cluster state applies these in order.

Events carry the agent's wire messages untouched: building the model from them
is the cluster state's job, and it does so lazily (a console watching a thousand
hosts converts only what a view shows). ``at`` is the wall-clock time (Unix
seconds) the console received the event, so a recording replays with its timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentd.proto import tuiprof_agent_pb2 as pb
from tuiprof.model.summary import HostSummary


@dataclass(frozen=True, slots=True)
class InfoReceived:
    host: str
    at: float
    message: pb.AgentInfo


@dataclass(frozen=True, slots=True)
class SnapshotReceived:
    host: str
    at: float
    message: pb.HostSnapshot


@dataclass(frozen=True, slots=True)
class SummaryReceived:
    """A host's cluster-row figures computed elsewhere (by Prometheus), without a snapshot.

    ``at`` is when the figures were sampled (the agent's snapshot time), not when they came.
    """

    host: str
    at: float
    summary: HostSummary


@dataclass(frozen=True, slots=True)
class HostUnreachable:
    host: str
    at: float
    error: str


HostEvent = InfoReceived | SnapshotReceived | SummaryReceived | HostUnreachable
