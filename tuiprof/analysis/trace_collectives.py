"""Which call on one rank is the same collective as which call on another.

A timeline dump carries each collective's sequence number: that is the key.
Kineto traces do not, so calls are numbered in order per (group, op) — but
every rank's window cuts the run at a slightly different call, and the n-th
call in one file may be the (n+1)-th in the next. Calls of one collective end
together on every rank (nobody leaves before the last one arrives), so each
rank's numbering is shifted to the offset that best lines its end times up
with the lowest rank's (smallest median gap, a few calls either way, only
when that clearly beats no shift).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

MAX_SHIFT = 3
# Shifts tried in this order, so a tie keeps the smaller shift.
_SHIFTS = sorted(range(-MAX_SHIFT, MAX_SHIFT + 1), key=abs)

Key = tuple[str, str, str]  # group, op, occurrence


@dataclass(frozen=True)
class CollectiveCall:
    group: str
    name: str
    seq: int | None  # the real sequence number, when the trace has one
    ts: float  # start, µs on the shared base
    end: float
    pid: int | str
    tid: int | str


def best_shift(ends: list[float], reference: list[float]) -> int:
    """The offset s making ends[i] and reference[i + s] closest (median gap).

    A shift must keep most calls paired (three quarters, at least two) and
    halve the unshifted gap to win: short traces and evenly matched ones stay
    unshifted.
    """
    needed = max(2, math.ceil(0.75 * min(len(ends), len(reference))))
    gaps_at: dict[int, float] = {}
    for shift in _SHIFTS:
        gaps = [abs(end - reference[i + shift]) for i, end in enumerate(ends) if 0 <= i + shift < len(reference)]
        if len(gaps) >= needed:
            gaps_at[shift] = statistics.median(gaps)
    if not gaps_at:
        return 0
    best = min(gaps_at, key=lambda shift: (gaps_at[shift], abs(shift)))
    unshifted = gaps_at.get(0)
    return best if unshifted is None or gaps_at[best] <= unshifted / 2 else 0


def match_calls(calls_by_rank: list[list[CollectiveCall]]) -> list[list[Key]]:
    """For each rank's calls (in time order), the key naming the same collective on every rank."""
    streams: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rank_index, calls in enumerate(calls_by_rank):
        for position, call in enumerate(calls):
            streams[(call.group, call.name)][rank_index].append(position)
    keys: list[list[Key]] = [[("", "", "")] * len(calls) for calls in calls_by_rank]
    for (group, name), by_rank in streams.items():
        if all(calls_by_rank[r][p].seq is not None for r, positions in by_rank.items() for p in positions):
            for r, positions in by_rank.items():
                for p in positions:
                    keys[r][p] = (group, name, str(calls_by_rank[r][p].seq))
            continue
        reference_rank = min(by_rank)
        reference = [calls_by_rank[reference_rank][p].end for p in by_rank[reference_rank]]
        shifts = {r: 0 if r == reference_rank else best_shift([calls_by_rank[r][p].end for p in positions], reference)
                  for r, positions in by_rank.items()}
        lowest = min(shifts.values())
        for r, positions in by_rank.items():
            for i, p in enumerate(positions):
                keys[r][p] = (group, name, str(i + shifts[r] - lowest))
    return keys
