"""Messages from the data worker to the app."""

from __future__ import annotations

from textual.message import Message


class EventsPending(Message):
    """Host events are waiting in the app's inbox (posted once per batch, not per event)."""


class SourceEnded(Message):
    """The event source finished (a recording played to its end)."""
