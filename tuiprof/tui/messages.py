"""Messages to the app: from the data worker, and from screens about what they show."""

from __future__ import annotations

from textual.message import Message


class EventsPending(Message):
    """Host events are waiting in the app's inbox (posted once per batch, not per event)."""


class SourceEnded(Message):
    """The event source finished (a recording played to its end)."""


class PmuShown(Message):
    """Whether the screen on view shows its host's PMU counters (this host's embedded agent
    reads them only then: the read is costly on a VM with many CPUs)."""

    def __init__(self, shown: bool) -> None:
        super().__init__()
        self.shown = shown
