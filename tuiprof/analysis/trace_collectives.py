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
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, islice, pairwise

from agentd.traces.analysis.extract import CollectiveCall

MAX_SHIFT = 3
# Room (µs, shared wall clock) for the clock offset between NTP-synced hosts when calls
# are checked against each other and against other ranks' spans. Hosts further apart
# than this give no meaningful start skew either.
CLOCK_SLACK_US = 1000.0
# Shifts tried in this order, so a tie keeps the smaller shift.
_SHIFTS = sorted(range(-MAX_SHIFT, MAX_SHIFT + 1), key=abs)

Key = tuple[str, str, str]  # group, op, occurrence
__all__ = ["CLOCK_SLACK_US", "CallColumns", "CollectiveCall", "Key", "Occurrence", "best_shift", "linked_occurrences",
           "match_calls", "occurrences", "rank_span"]


def best_shift(ends: list[float], reference: list[float]) -> int:
    """The offset s making ends[i] and reference[i + s] closest (median gap).

    A shift must keep most calls paired (three quarters, at least two) and
    halve the unshifted gap to win: short traces and evenly matched ones stay
    unshifted.
    """
    needed = max(2, math.ceil(0.75 * min(len(ends), len(reference))))
    best, best_gap, unshifted = 0, math.inf, math.inf
    for shift in _SHIFTS:  # smaller shifts first: a tie keeps the smaller one; 0 comes first
        first, stop = max(0, -shift), min(len(ends), len(reference) - shift)
        if stop - first < needed:
            continue
        # ends[i] against reference[i + shift] for every i both have
        differences = map(operator.sub, ends[first:stop], reference[first + shift:stop + shift])
        # A shift whose gap is not below the best so far, or is above half the unshifted one, cannot win.
        gap = _median_unless_above(differences, stop - first, min(best_gap, unshifted / 2))
        if shift == 0:
            unshifted = gap
        if gap < best_gap:
            best, best_gap = shift, gap
    return best if best_gap <= unshifted / 2 else 0


def _median_unless_above(differences: Iterator[float], count: int, bound: float) -> float:
    """The median gap (``statistics.median`` of the ``count`` differences' sizes), or inf once it is sure to be
    above ``bound``: when the first ``count - (count - 1) // 2`` differences all lie beyond ``bound`` on one
    side, at most ``(count - 1) // 2`` gaps are within it, so the middle one (both middle ones for an even
    count) is above it. A wrong shift's ends are a whole call period or more early (or late): half of them
    settle it, without the sort."""
    head = list(islice(differences, count - (count - 1) // 2))
    if min(head) > bound or max(head) < -bound:
        return math.inf
    gaps = sorted(map(abs, chain(head, differences)))
    middle = count // 2
    return gaps[middle] if count % 2 else (gaps[middle - 1] + gaps[middle]) / 2


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


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One collective as every rank that took part saw it: what keys it, who called it and when.

    ``ranks`` and ``starts`` go call by call in rank order (a rank's calls in
    its own order): with real sequence numbers a rank can repeat one.
    """

    label: str
    place: int  # the position of its first call among the first rank's calls
    ranks: list[int]  # rank index of each call
    starts: Sequence[float]  # each call's start


def linked_occurrences(by_rank: dict[int, CallColumns], spans: Sequence[Span]) -> list[Occurrence]:
    """The collectives of one (group, op) that more than one call names, as ``occurrences`` keys them.

    The calls ``occurrences`` labels ``<n>@<rank index>`` (a key of one call)
    are left out, and so is a collective only one call names.
    """
    if all(columns.seqs is not None for columns in by_rank.values()):
        return _sequenced(by_rank)
    offsets = _offsets(by_rank)
    linked = []
    for run in _runs(by_rank, offsets):
        if len(run.ranks) < 2:
            continue
        lead = offsets[run.ranks[0]]
        linked += [Occurrence(str(occurrence), occurrence - lead, run.ranks, run.starts[occurrence - run.first])
                   for occurrence in _linked(run, by_rank, spans)]
    return linked


def occurrences(by_rank: dict[int, CallColumns], spans: Sequence[Span]) -> dict[int, list[str]]:
    """For each rank's calls of one (group, op), the occurrence naming the same collective on every rank.

    ``by_rank``: rank index → its calls; ``spans``: every rank's ``rank_span``.
    A call that cannot be one collective with the others numbered alike gets an
    occurrence of its own rank (``<n>@<rank index>``): it is not linked.
    """
    if all(columns.seqs is not None for columns in by_rank.values()):
        return {r: [str(seq) for seq in columns.seqs or ()] for r, columns in by_rank.items()}
    offsets = _offsets(by_rank)
    shared = {occurrence for run in _runs(by_rank, offsets) for occurrence in _linked(run, by_rank, spans)}
    labels: dict[int, list[str]] = {}
    for r, columns in by_rank.items():
        numbers = range(offsets[r], offsets[r] + len(columns.starts))
        labels[r] = [str(n) if n in shared else f"{n}@{r}" for n in numbers]
    return labels


def _offsets(by_rank: dict[int, CallColumns]) -> dict[int, int]:
    """The occurrence number of each rank's first call: each rank's numbering shifted to line its ends up with
    the lowest rank's, counted from 0 on the rank that starts earliest."""
    reference_rank = min(by_rank)
    reference = list(by_rank[reference_rank].ends)
    shifts = {r: 0 if r == reference_rank else best_shift(list(columns.ends), reference)
              for r, columns in by_rank.items()}
    lowest = min(shifts.values())
    return {r: shift - lowest for r, shift in shifts.items()}


@dataclass(frozen=True, slots=True)
class _Run:
    """Consecutive occurrences numbered alike on the same ranks, as columns: one tuple per occurrence."""

    first: int  # occurrence number of the first
    ranks: list[int]  # rank indices, ascending
    starts: list[tuple[float, ...]]  # per occurrence, each rank's start
    ends: list[tuple[float, ...]]


def _runs(by_rank: dict[int, CallColumns], offsets: dict[int, int]) -> list[_Run]:
    """Every occurrence, in number order, grouped where the ranks calling it change (a rank's window starts
    or ends): usually one run for the whole trace, so each occurrence's calls are one slice per rank."""
    order = sorted(by_rank)
    bounds = sorted({bound for r in order for bound in (offsets[r], offsets[r] + len(by_rank[r].starts))})
    runs = []
    for first, stop in pairwise(bounds):
        ranks = [r for r in order if offsets[r] <= first and stop <= offsets[r] + len(by_rank[r].starts)]
        if ranks:
            starts = (by_rank[r].starts[first - offsets[r]:stop - offsets[r]] for r in ranks)
            ends = (by_rank[r].ends[first - offsets[r]:stop - offsets[r]] for r in ranks)
            runs.append(_Run(first, ranks, list(zip(*starts, strict=True)), list(zip(*ends, strict=True))))
    return runs


def _linked(run: _Run, by_rank: dict[int, CallColumns], spans: Sequence[Span]) -> list[int]:
    """The occurrences of ``run`` whose calls can be one collective: they overlap in time (within the clock
    slack), or, CPU ops only (gloo's end once enqueued), each lies within every calling rank's traced span."""
    cpu_only = not any(by_rank[r].on_gpu for r in run.ranks)
    latest_span_start = max(spans[r][0] for r in run.ranks)
    earliest_span_end = min(spans[r][1] for r in run.ranks)
    linked = []
    for occurrence, (starts, ends) in enumerate(zip(run.starts, run.ends, strict=True), start=run.first):
        if max(starts) <= min(ends) + CLOCK_SLACK_US or (
                cpu_only and latest_span_start <= min(starts) and max(ends) <= earliest_span_end):
            linked.append(occurrence)
    return linked


def _sequenced(by_rank: dict[int, CallColumns]) -> list[Occurrence]:
    """Calls keyed by their real sequence numbers (timeline dumps): every call of one number is one collective."""
    by_seq: dict[int, tuple[int, list[int], list[float]]] = {}  # seq → place, ranks, starts
    for r in sorted(by_rank):
        columns = by_rank[r]
        for place, (seq, start) in enumerate(zip(columns.seqs or (), columns.starts, strict=True)):
            calls = by_seq.setdefault(seq, (place, [], []))
            calls[1].append(r)
            calls[2].append(start)
    return [Occurrence(str(seq), place, ranks, starts) for seq, (place, ranks, starts) in by_seq.items()
            if len(starts) > 1]


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
            for place, label in zip(positions[(group, name)][r], labels, strict=True):
                keys[r][place] = (group, name, label)
    return keys


def _columns(calls: list[CollectiveCall]) -> CallColumns:
    seqs = [call.seq for call in calls if call.seq is not None]
    return CallColumns([call.ts for call in calls], [call.end for call in calls],
                       seqs if len(seqs) == len(calls) else None, any(call.on_gpu for call in calls))
