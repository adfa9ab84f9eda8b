"""One log line per cause per window, so a misbehaving client cannot flood the agent's log."""

from __future__ import annotations

import logging
import threading
import time


class CauseLimitedLogger:
    """Logs the first occurrence of each cause, then at most one line per ``window_seconds``,
    saying how many were suppressed in between."""

    def __init__(self, logger: logging.Logger, window_seconds: float = 60.0) -> None:
        self._logger = logger
        self._window = window_seconds
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def warning(self, cause: str, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            self.counts[cause] = self.counts.get(cause, 0) + 1
            last = self._last.get(cause)
            if last is not None and now - last < self._window:
                self._suppressed[cause] = self._suppressed.get(cause, 0) + 1
                return
            self._last[cause] = now
            suppressed = self._suppressed.pop(cause, 0)
        self._logger.warning(
            "%s: " + message + " (%d more like this suppressed)", cause, *args, suppressed,
            extra={"cause": cause},
        )
