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

    def warning(self, cause: str, message: str, *args: object, fields: dict[str, object] | None = None) -> None:
        """Log ``message % args`` for ``cause`` unless one was logged within the window; ``fields`` are
        the line's structured facts (``extra``)."""
        self._log(logging.WARNING, cause, message, args, fields)

    def info(self, cause: str, message: str, *args: object, fields: dict[str, object] | None = None) -> None:
        """As ``warning``, for events that are normal unless they repeat fast."""
        self._log(logging.INFO, cause, message, args, fields)

    def _log(self, level: int, cause: str, message: str, args: tuple[object, ...],
             fields: dict[str, object] | None) -> None:
        now = time.monotonic()
        with self._lock:
            self.counts[cause] = self.counts.get(cause, 0) + 1
            last = self._last.get(cause)
            if last is not None and now - last < self._window:
                self._suppressed[cause] = self._suppressed.get(cause, 0) + 1
                return
            self._last[cause] = now
            suppressed = self._suppressed.pop(cause, 0)
        self._logger.log(level, "%s: " + message + " (%d more like this suppressed)", cause, *args, suppressed,
                         extra={**(fields or {}), "cause": cause})
