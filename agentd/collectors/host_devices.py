"""Per-device counters (NICs, disks): totals that never go down, and their rates; one loop for both.

A device's counters are a NamedTuple of totals read from one /proc line. ``Unwrapped`` keeps
them from going down (psutil's ``nowrap``); ``DeviceRates`` turns each reading into one
message per device, sorted by name: its totals, and each of its rates since the previous
reading, or why there is none (the device's first sample, a counter reset).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from agentd.collectors.readings import Unavailable, counter_rate, put

# One device's totals: a NamedTuple of ints (``NicCounters``, ``DiskCounters``).
_CountersT = TypeVar("_CountersT", bound=NamedTuple)
_MessageT = TypeVar("_MessageT")


class Unwrapped(Generic[_CountersT]):
    """Totals that never go down, as psutil's ``nowrap=True`` keeps them.

    A counter read lower than the time before is taken as having wrapped (old drivers'
    32-bit counters): its previous value is added to it from then on. A device that
    disappears forgets what was added to its counters.
    """

    def __init__(self) -> None:
        self._last: dict[str, _CountersT] = {}
        self._added: dict[str, list[int]] = {}

    def __call__(self, readings: dict[str, _CountersT]) -> dict[str, _CountersT]:
        result = {}
        for name, now in readings.items():
            added = self._added.get(name)
            before = self._last.get(name)
            if before is not None:
                for index, (value, previous) in enumerate(zip(now, before, strict=True)):
                    if value < previous:
                        if added is None:
                            added = self._added[name] = [0] * len(now)
                        added[index] += previous
            result[name] = now if added is None else type(now)._make(v + a for v, a in zip(now, added, strict=True))
        for gone in self._added.keys() - readings.keys():
            del self._added[gone]
        self._last = dict(readings)
        return result


@dataclasses.dataclass(frozen=True)
class Rate:
    """One rate field of a device's message: the per-second increase of one of its counters.

    ``scale`` turns that increase into the field's unit (e.g. busy milliseconds per second
    into percent); an Unavailable is never scaled.
    """

    field: str
    counter: str
    scale: Callable[[float], float] | None = None

    def put(self, message: Any, before: NamedTuple | None, now: NamedTuple, seconds: float) -> None:
        rate = counter_rate(None if before is None else getattr(before, self.counter),
                            getattr(now, self.counter), seconds)
        put(message, self.field, rate if self.scale is None or isinstance(rate, Unavailable) else self.scale(rate))


class DeviceRates(Generic[_CountersT, _MessageT]):
    """Each device's message from one reading of every device's counters, with rates since the previous one.

    ``totals`` builds a device's message from its name and totals; ``rates`` are then put
    into it. The totals are ``Unwrapped`` first.
    """

    def __init__(self, totals: Callable[[str, _CountersT], _MessageT], rates: tuple[Rate, ...]) -> None:
        self._totals = totals
        self._rates = rates
        self._unwrapped: Unwrapped[_CountersT] = Unwrapped()
        self._previous: dict[str, _CountersT] = {}
        self._previous_at: float | None = None

    def __call__(self, readings: dict[str, _CountersT], now: float) -> list[_MessageT]:
        current = self._unwrapped(readings)
        seconds = 0.0 if self._previous_at is None else now - self._previous_at
        messages = []
        for name, counters in sorted(current.items()):
            message = self._totals(name, counters)
            before = self._previous.get(name)
            for rate in self._rates:
                rate.put(message, before, counters, seconds)
            messages.append(message)
        self._previous, self._previous_at = current, now
        return messages
