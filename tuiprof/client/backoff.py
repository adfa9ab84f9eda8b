"""Exponential reconnect delays with jitter, so a fleet of consoles does not retry in step."""

from __future__ import annotations

import random


class Backoff:
    """Delays ``initial``, ``initial*factor``, … up to ``maximum``; ``reset`` after a success."""

    def __init__(
        self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0, jitter: float = 0.2
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {initial}, {maximum}")
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self._next = initial

    def next(self) -> float:
        """The delay before the next attempt (and grow the one after)."""
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay * (1 + random.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self._next = self.initial
