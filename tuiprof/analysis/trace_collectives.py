"""Which call on one rank is the same collective as which call on another.

A timeline dump carries each collective's sequence number: that is the key.
Kineto traces do not, so calls are numbered in order per (group, op) — but
every rank's window cuts the run at a slightly different call, and the n-th
call in one file may be the (n+1)-th in the next. Calls of one collective end
together on every rank (nobody leaves before the last one arrives), so each
rank's numbering is shifted to the offset that best lines its end times up
with the lowest rank's (smallest median gap, a few calls either way, only
when that clearly beats no shift). Calls so paired must also be able to be one
collective: GPU kernels only when they overlap in time (NCCL kernels do: the
first rank waits inside its kernel for the last; two kernels apart in time are
two operations, however the numbering lines up), CPU ops also when each lies
within the other ranks' traced spans of collectives (CPU ops such as gloo's end
once enqueued, so a late rank's op may follow the others' by any delay). Windows that do not overlap share no
collective, however the numbering lines up (seen on 2 x H200: two ranks'
5-iteration windows 200 ms apart).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from agentd.traces.analysis.extract import CollectiveCall

MAX_SHIFT = 3
# Room (µs, shared wall clock) for the clock offset between NTP-synced hosts when calls
# are checked against each other and against other ranks' spans. Hosts further apart
# than this give no meaningful start skew either.
CLOCK_SLACK_US = 1000.0
# Shifts tried in this order, so a tie keeps the smaller shift.
_SHIFTS = sorted(range(-MAX_SHIFT, MAX_SHIFT + 1), key=abs)

Key = tuple[str, str, str]  # group, op, occurrence
__all__ = ["CLOCK_SLACK_US", "CollectiveCall", "Key", "best_shift", "match_calls"]


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
    spans = [(min(c.ts for c in calls) - CLOCK_SLACK_US, max(c.end for c in calls) + CLOCK_SLACK_US) if calls
             else (0.0, 0.0) for calls in calls_by_rank]
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
        occurrences: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for r, positions in by_rank.items():
            for i, p in enumerate(positions):
                occurrences[i + shifts[r] - lowest].append((r, p))
        for occurrence, members in occurrences.items():
            calls = [calls_by_rank[r][p] for r, p in members]
            overlapping = max(c.ts for c in calls) <= min(c.end for c in calls) + CLOCK_SLACK_US
            together = overlapping or (not any(c.on_gpu for c in calls) and all(
                spans[other][0] <= call.ts and call.end <= spans[other][1] for call in calls for other, _ in members))
            for r, p in members:  # calls that cannot be one collective keep a key of their own rank: not linked
                keys[r][p] = (group, name, str(occurrence) if together else f"{occurrence}@{r}")
    return keys
