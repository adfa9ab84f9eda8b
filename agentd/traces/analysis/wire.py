"""A rank's summary on the wire (``RankTraceSummary``) and back.

The per-rank result travels as JSON of ``RankResult`` (one schema, the
dataclasses of ``summary``); its collective calls travel as compact columns
per (group, op) in µs from the file's ``baseTimeNanoseconds``, so the console
can put every rank on one wall clock and key the calls across ranks
(``tuiprof.analysis.trace_reduce``).
"""

from __future__ import annotations

import msgspec

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.traces.analysis.extract import CollectiveCall
from agentd.traces.analysis.summary import RankResult

_encode = msgspec.json.Encoder().encode
_decode_result = msgspec.json.Decoder(RankResult).decode


class SummaryWireError(ValueError):
    """A ``RankTraceSummary`` whose contents do not decode; the message says what is wrong."""


def to_proto(result: RankResult, calls: list[CollectiveCall], base_time_ns: int, seconds: float
             ) -> pb.RankTraceSummary:
    streams: dict[tuple[str, str], list[CollectiveCall]] = {}
    for call in calls:
        streams.setdefault((call.group, call.name), []).append(call)
    return pb.RankTraceSummary(
        result_json=_encode(result).decode(), base_time_ns=base_time_ns, seconds=seconds,
        collectives=[_timings(group, name, stream) for (group, name), stream in streams.items()])


def _timings(group: str, name: str, calls: list[CollectiveCall]) -> pb.CollectiveTimings:
    sequenced = all(call.seq is not None for call in calls)
    return pb.CollectiveTimings(group=group, op=name, on_gpu=calls[0].on_gpu,
                                seq=[call.seq for call in calls if call.seq is not None] if sequenced else [],
                                start_us=[call.ts for call in calls], end_us=[call.end for call in calls])


def decode_result(result_json: str) -> RankResult:
    """The rank's result from ``RankTraceSummary.result_json``; SummaryWireError when it does not decode."""
    try:
        return _decode_result(result_json)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SummaryWireError(f"the agent's rank summary does not decode ({exc}): agent and console versions "
                               "may differ") from None
