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

    def append_gap(self) -> None:
        """No value at this sample time (the series was not in the sample)."""
        self._values.append(None)

    def values(self) -> list[float | None]:
        return list(self._values)

    def numbers(self) -> list[float]:
        """The known values, oldest first (gaps dropped), as sparklines want them."""
        return [v for v in self._values if v is not None]

    def __len__(self) -> int:
        return len(self._values)


class History:
    """Named rings for one host, e.g. ``cpu``, ``gpu_util``, ``gpu3.util``, sampled together.

    Every ``extend`` is one sample time: each series gets a value then, a series
    the sample lacks gets a gap, so every ring lines up with the newest times.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._rings: dict[str, Ring] = {}
        self._times: deque[float] = deque(maxlen=capacity)

    def extend(self, samples: Iterable[tuple[str, Reading]], at: float) -> None:
        """One sample taken at ``at`` (Unix seconds)."""
        self._times.append(at)
        fresh = dict(samples)
        rings = self._rings
        for series, value in fresh.items():
            ring = rings.get(series)
            if ring is None:
                ring = rings[series] = Ring(self._capacity)
            ring.append(value)
        # every series of the sample has a ring now: equal counts, no ring left without a value
        # (the usual case, checked without a lookup per ring: ten thousand hosts a refresh)
        if len(rings) != len(fresh):
            for series, ring in rings.items():
                if series not in fresh:
                    ring.append_gap()

    def numbers(self, series: str) -> list[float]:
        ring = self._rings.get(series)
        return ring.numbers() if ring else []

    def points(self, series: str) -> list[tuple[float, float]]:
        """``(time, value)`` of the known values, oldest first (gaps dropped)."""
        ring = self._rings.get(series)
        if ring is None:
            return []
        values = ring.values()
        times = list(self._times)[len(self._times) - len(values):]
        return [(at, value) for at, value in zip(times, values, strict=True) if value is not None]

    def series(self, prefix: str) -> list[str]:
        """Names of the series that start with ``prefix``, in the order they first came."""
        return [name for name in self._rings if name.startswith(prefix)]
