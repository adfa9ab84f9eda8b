"""Who held a collective up, and for how long: the arrival figures of one collective across its ranks.

In synchronous training a collective cannot finish before its last rank starts
it; the others wait inside it. Had the last rank started with the one before
it (the runner-up), the collective could have begun that much earlier: that
gap, latest start minus the runner-up's, is the time the last rank alone held
the job up at this collective. Summed per rank over a window it is the rank's
cost to the job, the figure of a what-if in which only that rank arrives on time.
Live verdicts and trace summaries both use this one definition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class Arrivals(NamedTuple):
    """One collective's starts across the calls that took part (µs on one clock). A named tuple: made for
    every collective the console joins, and one is made in less than half a frozen dataclass's time."""

    earliest: float
    latest: float
    held_us: float  # latest − the runner-up's start: how long the last to start held the others alone
    last: int  # position of the last start among the given ones (on a tie, the later position)
    calls: int


def arrivals(starts: Sequence[float]) -> Arrivals:
    """The arrival figures of one collective from each call's start (at least one)."""
    # Builtins only (no Python loop per start, which heapq.nlargest has): the console runs this for
    # every collective of a 1024-rank job it joins, up to 4,000 a round (bench/slowdown/scale.py).
    latest = max(starts)
    last = len(starts) - 1 - list(reversed(starts)).index(latest)
    others = list(starts)
    del others[last]
    runner_up = max(others, default=latest)
    return Arrivals(min(starts), latest, latest - runner_up, last, len(starts))
