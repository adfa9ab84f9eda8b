"""The job's trace summary from the agents' per-rank summaries, without any trace file.

Each agent summarised its own ranks' files (``agentd.traces.analysis``) and
sent each rank's result with its collective calls' start and end times
(``TraceTarget.summary``). Here every rank's calls are put on one wall clock
(the earliest file's base, as the merge does), matched across ranks as the
merge's ``trace_collectives.match_calls`` does (``linked_occurrences``: each
collective's calls taken from the columns, never one object per call) and
reduced by ``trace_summary.summarize``: the same figures a merge of the fetched
files gives, in work and memory that grow with the number of ranks and calls,
not with trace bytes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from agentd.slowdown.waits import arrivals
from agentd.traces.analysis.summary import RankResult
from agentd.traces.analysis.wire import SummaryWireError, decode_result
from tuiprof.analysis.trace_collectives import CallColumns, Span, linked_occurrences, rank_span
from tuiprof.analysis.trace_summary import CollectiveStarts, TraceSummary, summarize
from tuiprof.model.capture import ClusterCapture
from tuiprof.model.messages import RankTraceSummary, TraceTargetState

NO_SUMMARY = ("the agent sent no summary of it: you may not fetch this file (a local user sees only their own "
              "ranks' files), or the agent predates summaries")


@dataclass(frozen=True)
class RemoteRank:
    """One rank's written file on its node, with the agent's summary of it."""

    host: str
    pid: int
    rank: int | None
    file: str  # relative to the agent's trace dir
    summary: RankTraceSummary

    @property
    def where(self) -> str:
        return f"{self.host}:{self.file}"


@dataclass
class ReducedSummary:
    summary: TraceSummary
    # Ranks with no summary: (rank, why); their files can still be fetched and analysed.
    missing: list[tuple[RemoteRank, str]]


def remote_ranks(capture: ClusterCapture) -> list[RemoteRank]:
    """Every written file of the capture."""
    return [RemoteRank(host.host, target.pid, target.rank_number, target.file, target.summary)
            for host in capture.hosts for target in host.targets if target.state == TraceTargetState.WRITTEN]


def reduce_summaries(ranks: list[RemoteRank]) -> ReducedSummary:
    """The cross-rank summary of ``ranks``; those without a usable summary are listed with the reason."""
    usable, missing = [], []
    for rank in ranks:
        if rank.summary.error:
            missing.append((rank, rank.summary.error))
        elif not rank.summary.result_json:
            missing.append((rank, NO_SUMMARY))
        else:
            usable.append(rank)
    origin = min((rank.summary.base_time_ns for rank in usable), default=0)
    decoded: list[tuple[RankResult, dict[Stream, CallColumns]]] = []
    for rank in usable:
        try:
            result = decode_result(rank.summary.result_json)
            streams = _streams(rank.summary, (rank.summary.base_time_ns - origin) / 1000.0)
        except SummaryWireError as exc:
            missing.append((rank, str(exc)))
            continue
        result.summary.host, result.summary.file, result.summary.pid = rank.host, rank.where, rank.pid
        if rank.rank is not None:
            result.summary.rank = rank.rank
        decoded.append((result, streams))
    # In rank order, as the merge: the lowest rank is the reference the others' calls are lined up with.
    decoded.sort(key=lambda item: (item[0].summary.rank is None, item[0].summary.rank or 0, item[0].summary.host,
                                   item[0].summary.pid or 0, item[0].summary.file))
    results = [result for result, _ in decoded]
    spans = [rank_span(streams.values()) for _, streams in decoded]
    by_stream: dict[Stream, dict[int, CallColumns]] = defaultdict(dict)
    for rank_index, (_, streams) in enumerate(decoded):
        for stream, columns in streams.items():
            by_stream[stream][rank_index] = columns
    calls = sum(len(columns.starts) for by_rank in by_stream.values() for columns in by_rank.values())
    return ReducedSummary(summarize(results, _collective_starts(results, by_stream, spans, calls)), missing)


def _collective_starts(results: list[RankResult], by_stream: dict[Stream, dict[int, CallColumns]],
                       spans: list[Span], calls: int) -> CollectiveStarts:
    """Each linked collective's arrival figures and last rank, straight from the columns (no object
    per call), in the order ``CollectiveStarts.of`` would meet them: by first rank, its streams' order, and
    the collective's place among that rank's calls."""
    numbers = [result.summary.rank for result in results]
    found = []
    for position, ((group, op), by_rank) in enumerate(by_stream.items()):
        for occurrence in linked_occurrences(by_rank, spans):
            figures = arrivals(occurrence.starts)
            found.append(((occurrence.ranks[0], position, occurrence.place), (group, op, occurrence.label),
                          (figures, numbers[occurrence.ranks[figures.last]])))
    found.sort(key=lambda item: item[0])
    return CollectiveStarts({key: figures for _, key, figures in found}, calls)


Stream = tuple[str, str]  # group, op


def _streams(summary: RankTraceSummary, shift_us: float) -> dict[Stream, CallColumns]:
    """The rank's calls per (group, op), moved by ``shift_us`` onto the shared clock."""
    streams = {}
    for timings in summary.collectives:
        count = len(timings.start_us)
        if len(timings.end_us) != count or (timings.seq and len(timings.seq) != count):
            raise SummaryWireError(f"the agent's timings of {timings.op!r} have {count} starts, "
                                   f"{len(timings.end_us)} ends and {len(timings.seq)} sequence numbers")
        streams[(timings.group, timings.op)] = CallColumns(
            [start + shift_us for start in timings.start_us], [end + shift_us for end in timings.end_us],
            list(timings.seq) if timings.seq else None, timings.on_gpu)
    return streams
