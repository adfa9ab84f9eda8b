"""Recent values per series, kept by the console itself (late joiners still get graphs)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from tuiprof.model.values import Reading, Unavailable

DEFAULT_CAPACITY = 300
"""Five minutes at the agent's default 1 s interval."""


class Ring:
    """A fixed-size series of numbers; an unavailable sample is kept as a gap (None)."""

    __slots__ = ("_values",)

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"ring capacity must be at least 1, got {capacity}")
        self._values: deque[float | None] = deque(maxlen=capacity)

    def append(self, value: Reading) -> None:
        self._values.append(None if isinstance(value, Unavailable) else float(value))

    def values(self) -> list[float | None]:
        return list(self._values)

    def numbers(self) -> list[float]:
        """The known values, oldest first (gaps dropped), as sparklines want them."""
        return [v for v in self._values if v is not None]

    def __len__(self) -> int:
        return len(self._values)


class History:
    """Named rings for one host, e.g. ``cpu``, ``gpu_util``, ``gpu3.power``."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._rings: dict[str, Ring] = {}

    def append(self, series: str, value: Reading) -> None:
        ring = self._rings.get(series)
        if ring is None:
            ring = self._rings[series] = Ring(self._capacity)
        ring.append(value)

    def extend(self, samples: Iterable[tuple[str, Reading]]) -> None:
        for series, value in samples:
            self.append(series, value)

    def numbers(self, series: str) -> list[float]:
        ring = self._rings.get(series)
        return ring.numbers() if ring else []
