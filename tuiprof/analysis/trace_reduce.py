"""The job's trace summary from the agents' per-rank summaries, without any trace file.

Each agent summarised its own ranks' files (``agentd.traces.analysis``) and
sent each rank's result with its collective calls' start and end times
(``TraceTarget.summary``). Here every rank's calls are put on one wall clock
(the earliest file's base, as the merge does), keyed across ranks by
``trace_collectives.match_calls`` and reduced by ``trace_summary.summarize``:
the same figures a merge of the fetched files gives, in work and memory that
grow with the number of ranks and calls, not with trace bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentd.traces.analysis.wire import SummaryWireError, from_wire
from tuiprof.analysis.trace_collectives import match_calls
from tuiprof.analysis.trace_summary import TraceSummary, summarize
from tuiprof.model.capture import ClusterCapture
from tuiprof.model.messages import RankTraceSummary

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
            for host in capture.hosts for target in host.targets if target.state == "written"]


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
    decoded = []
    for rank in usable:
        try:
            result, calls = from_wire(rank.summary.result_json, rank.summary.collectives,
                                      (rank.summary.base_time_ns - origin) / 1000.0)
        except SummaryWireError as exc:
            missing.append((rank, str(exc)))
            continue
        result.summary.host, result.summary.file, result.summary.pid = rank.host, rank.where, rank.pid
        if rank.rank is not None:
            result.summary.rank = rank.rank
        decoded.append((result, calls))
    # In rank order, as the merge: the lowest rank is the reference the others' calls are lined up with.
    decoded.sort(key=lambda item: (item[0].summary.rank is None, item[0].summary.rank or 0, item[0].summary.host,
                                   item[0].summary.pid or 0, item[0].summary.file))
    results = [result for result, _ in decoded]
    calls_by_rank = [calls for _, calls in decoded]
    for result, calls, keys in zip(results, calls_by_rank, match_calls(calls_by_rank)):
        result.collectives = [(key, call.ts) for key, call in zip(keys, calls)]
    return ReducedSummary(summarize(results), missing)
