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
import operator
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agentd.traces.analysis.extract import CollectiveCall

MAX_SHIFT = 3
# Room (µs, shared wall clock) for the clock offset between NTP-synced hosts when calls
# are checked against each other and against other ranks' spans. Hosts further apart
# than this give no meaningful start skew either.
CLOCK_SLACK_US = 1000.0
# Shifts tried in this order, so a tie keeps the smaller shift.
_SHIFTS = sorted(range(-MAX_SHIFT, MAX_SHIFT + 1), key=abs)

Key = tuple[str, str, str]  # group, op, occurrence
__all__ = ["CLOCK_SLACK_US", "CallColumns", "CollectiveCall", "Key", "best_shift", "match_calls", "occurrences",
           "rank_span"]


def best_shift(ends: list[float], reference: list[float]) -> int:
    """The offset s making ends[i] and reference[i + s] closest (median gap).

    A shift must keep most calls paired (three quarters, at least two) and
    halve the unshifted gap to win: short traces and evenly matched ones stay
    unshifted.
    """
    needed = max(2, math.ceil(0.75 * min(len(ends), len(reference))))
    gaps_at: dict[int, float] = {}
    for shift in _SHIFTS:
        first, stop = max(0, -shift), min(len(ends), len(reference) - shift)
        if stop - first >= needed:  # ends[i] against reference[i + shift] for every i both have
            gaps = map(abs, map(operator.sub, ends[first:stop], reference[first + shift:stop + shift]))
            gaps_at[shift] = statistics.median(gaps)
    if not gaps_at:
        return 0
    best = min(gaps_at, key=lambda shift: (gaps_at[shift], abs(shift)))
    unshifted = gaps_at.get(0)
    return best if unshifted is None or gaps_at[best] <= unshifted / 2 else 0


@dataclass(frozen=True, slots=True)
class CallColumns:
    """One rank's calls of one collective op on one group, in start order (µs on the shared clock)."""

    starts: Sequence[float]
    ends: Sequence[float]
    seqs: Sequence[int] | None  # None: the trace does not give every call's sequence number
    on_gpu: bool


Span = tuple[float, float]  # a rank's first collective start and last end, widened by CLOCK_SLACK_US


def rank_span(streams: Iterable[CallColumns]) -> Span:
    streams = [s for s in streams if s.starts]
    if not streams:
        return (0.0, 0.0)
    return (min(s.starts[0] for s in streams) - CLOCK_SLACK_US, max(max(s.ends) for s in streams) + CLOCK_SLACK_US)


def occurrences(by_rank: dict[int, CallColumns], spans: Sequence[Span]) -> dict[int, list[str]]:
    """For each rank's calls of one (group, op), the occurrence naming the same collective on every rank.

    ``by_rank``: rank index → its calls; ``spans``: every rank's ``rank_span``.
    A call that cannot be one collective with the others numbered alike gets an
    occurrence of its own rank (``<n>@<rank index>``): it is not linked.
    """
    if all(columns.seqs is not None for columns in by_rank.values()):
        return {r: [str(seq) for seq in columns.seqs or ()] for r, columns in by_rank.items()}
    reference_rank = min(by_rank)
    reference = list(by_rank[reference_rank].ends)
    shifts = {r: 0 if r == reference_rank else best_shift(list(columns.ends), reference)
              for r, columns in by_rank.items()}
    lowest = min(shifts.values())
    members: dict[int, list[int]] = defaultdict(list)  # occurrence → rank indices
    for r, columns in by_rank.items():
        offset = shifts[r] - lowest
        for i in range(len(columns.starts)):
            members[i + offset].append(r)
    together: dict[int, bool] = {}
    for occurrence, ranks in members.items():
        starts = [by_rank[r].starts[occurrence - shifts[r] + lowest] for r in ranks]
        ends = [by_rank[r].ends[occurrence - shifts[r] + lowest] for r in ranks]
        if max(starts) <= min(ends) + CLOCK_SLACK_US:
            together[occurrence] = True
        else:  # CPU ops (gloo's end once enqueued): each call inside every member's traced span
            together[occurrence] = not any(by_rank[r].on_gpu for r in ranks) and \
                max(spans[r][0] for r in ranks) <= min(starts) and max(ends) <= min(spans[r][1] for r in ranks)
    shared = {occurrence: str(occurrence) for occurrence, linked in together.items() if linked}
    labels: dict[int, list[str]] = {}
    for r, columns in by_rank.items():
        offset = shifts[r] - lowest
        labels[r] = [shared.get(i + offset) or f"{i + offset}@{r}" for i in range(len(columns.starts))]
    return labels


def match_calls(calls_by_rank: list[list[CollectiveCall]]) -> list[list[Key]]:
    """For each rank's calls (in time order), the key naming the same collective on every rank."""
    positions: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rank_index, calls in enumerate(calls_by_rank):
        for position, call in enumerate(calls):
            positions[(call.group, call.name)][rank_index].append(position)
    streams = {stream: {r: _columns([calls_by_rank[r][p] for p in places]) for r, places in by_rank.items()}
               for stream, by_rank in positions.items()}
    spans = [rank_span(streams[stream][r] for stream in streams if r in streams[stream])
             for r in range(len(calls_by_rank))]
    keys: list[list[Key]] = [[("", "", "")] * len(calls) for calls in calls_by_rank]
    for (group, name), by_rank in streams.items():
        for r, labels in occurrences(by_rank, spans).items():
            for place, label in zip(positions[(group, name)][r], labels):
                keys[r][place] = (group, name, label)
    return keys


def _columns(calls: list[CollectiveCall]) -> CallColumns:
    seqs = [call.seq for call in calls if call.seq is not None]
    return CallColumns([call.ts for call in calls], [call.end for call in calls],
                       seqs if len(seqs) == len(calls) else None, any(call.on_gpu for call in calls))
