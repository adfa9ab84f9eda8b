"""A reading is a number or an explicit Unavailable carrying the reason (never a 0)."""

from __future__ import annotations

from dataclasses import dataclass

NOT_REPORTED = "not reported by the agent"
REASONS_FIELD = "unavailable"
"""The map a proto message has, when it has one, of why each of its unset fields is unset."""


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A value the agent could not read, and why."""

    reason: str

    def __str__(self) -> str:
        return f"unavailable: {self.reason}"


Reading = int | float | Unavailable


def available(values: list[Reading] | tuple[Reading, ...]) -> list[float]:
    """The numbers among ``values``, unavailable ones left out."""
    return [v for v in values if not isinstance(v, Unavailable)]


def first_reason(values: list[Reading] | tuple[Reading, ...], default: str) -> Unavailable:
    """The reason of the first unavailable reading, or ``default`` when there is none."""
    for v in values:
        if isinstance(v, Unavailable):
            return v
    return Unavailable(default)
