"""What the client layer reports about one host; the cluster state applies these in order.

``at`` is the wall-clock time (Unix seconds) the console received the event, so a
recording replays with its original timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuiprof.model.info import AgentInfo
from tuiprof.model.snapshot import HostSnapshot


@dataclass(frozen=True, slots=True)
class InfoReceived:
    host: str
    at: float
    info: AgentInfo


@dataclass(frozen=True, slots=True)
class SnapshotReceived:
    host: str
    at: float
    snapshot: HostSnapshot


@dataclass(frozen=True, slots=True)
class HostUnreachable:
    host: str
    at: float
    error: str


HostEvent = InfoReceived | SnapshotReceived | HostUnreachable
