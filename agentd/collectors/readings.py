"""The readings kit every collector shares: a value, or why there is none.

A collector that cannot give a number reports it unavailable with a reason,
never as 0. The pieces here are the ones host, gpu, pmu and the ranks
collector all need, so the same situation reads the same everywhere:

- ``Unavailable(reason)``: a reading that could not be taken. Functions return
  ``float | Unavailable`` (or ``int | Unavailable``) instead of raising or
  returning a sentinel number.
- ``FIRST_SAMPLE``, ``COUNTER_RESET``, ``NO_TIME_ELAPSED``: the reasons a rate
  between two readings of a monotonic counter does not exist.
- ``counter_rate(previous, current, seconds)``: that rate, or one of those reasons.
- ``put(message, field, value)``: set a proto field, or record in the message's
  ``unavailable`` map why it is unset.
- ``put_unavailable(message, fields, reason)``: several fields unset for one reason.

Messages here are our proto messages with an ``unavailable`` map<string, string>
(field name -> reason).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

FIRST_SAMPLE = "first sample"
COUNTER_RESET = "counter reset"
NO_TIME_ELAPSED = "no time elapsed between samples"


@dataclasses.dataclass(frozen=True)
class Unavailable:
    """A reading that could not be taken, and why (a sentence a user can act on)."""

    reason: str


def counter_rate(previous: float | None, current: float, seconds: float) -> float | Unavailable:
    """Per-second increase of a monotonic counter between two readings ``seconds`` apart.

    ``previous`` is None when there was no earlier reading (the first tick, a
    device that just appeared): FIRST_SAMPLE. A counter that went down (device
    reset, driver reload, process restart) gives COUNTER_RESET, never a negative rate.
    """
    if previous is None:
        return Unavailable(FIRST_SAMPLE)
    if current < previous:
        return Unavailable(COUNTER_RESET)
    if seconds <= 0:
        return Unavailable(NO_TIME_ELAPSED)
    return (current - previous) / seconds


def scaled(value: float | Unavailable, factor: float) -> float | Unavailable:
    """``value * factor`` as a float (unit conversion); an Unavailable passes through."""
    return value if isinstance(value, Unavailable) else float(value) * factor


def put(message: Any, field: str, value: float | Unavailable) -> None:
    """Set ``message.field``, or record in ``message.unavailable`` why it cannot be."""
    if isinstance(value, Unavailable):
        message.unavailable[field] = value.reason
    else:
        setattr(message, field, value)


def put_unavailable(message: Any, fields: Iterable[str], reason: str) -> None:
    """Leave every one of ``fields`` unset, each with ``reason``."""
    for field in fields:
        message.unavailable[field] = reason
