"""The console's reduce of agent summaries against the merge of the same files, and the straggler picks.

The agent-side summariser (``agentd.traces.analysis.summarise``) runs here on real trace files in a real trace
dir, as each node's agent does; the reduce gets only what the wire carries (``RankTraceSummary``) and must give
the figures the merge of the files gives."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.traces.analysis import stream, summarise
from agentd.traces.analysis.extract import CollectiveCall
from agentd.traces.analysis.summary import RankResult
from agentd.traces.analysis.wire import to_proto
from agentd.traces.analysis.summarise import summarise_file
from agentd.traces.paths import TraceDir
from tuiprof.analysis.stragglers import trace_stragglers
from tuiprof.analysis.trace_merge import TraceInput, merge_traces
from tuiprof.analysis.trace_collectives import match_calls
from tuiprof.analysis.trace_reduce import NO_SUMMARY, RemoteRank, reduce_summaries
from tuiprof.analysis.trace_summary import RankHold, RankSummary, TraceSummary, summarize, summary_json
from tuiprof.model import convert
from tuiprof.model.messages import RankTraceSummary

from traces.test_trace_analysis import BASE0, BASE1, RANK0, RANK1, kernel, write_trace

CORPUS = pathlib.Path(__file__).parent / "data" / "corpus"


def on_node(trace_dir: TraceDir, source: pathlib.Path, host: str, rank: int | None) -> RemoteRank:
    """``source`` written into the trace dir and summarised there, as the agent on ``host`` does."""
    folder = trace_dir.user_folder(os.getuid())
    name = f"{host}-{source.name}"
    shutil.copy(source, trace_dir.path / folder / name)
    summary = summarise_file(trace_dir, f"{folder}/{name}", host, 4242, rank)
    return RemoteRank(host, 4242, rank, f"{folder}/{name}", convert.from_proto(RankTraceSummary, summary))


def comparable(summary: TraceSummary) -> dict:
    document = summary_json(summary)
    for rank in document["ranks"]:
        rank.pop("file")
    return document


def test_reduced_summaries_equal_the_merge_of_the_files(trace_dir, tmp_path):
    # Rank 1's clock base is 2 µs after rank 0's: the reduce must line the ranks up as the merge does.
    zero = write_trace(tmp_path / "r0.json", BASE0, RANK0, rank=0)
    one = write_trace(tmp_path / "r1.json.gz", BASE1, RANK1, rank=1, gz=True)
    ranks = [on_node(trace_dir, one, "host-b", None), on_node(trace_dir, zero, "host-a", 0)]
    reduced = reduce_summaries(ranks)
    merged = merge_traces([TraceInput(one, "host-b", None, 4242), TraceInput(zero, "host-a", 0, 4242)],
                          tmp_path / "m.json.gz", workers=1)
    assert reduced.missing == []
    assert comparable(reduced.summary) == comparable(summarize(merged.ranks))
    assert reduced.summary.collectives_compared == 2  # both all-reduces keyed across the two hosts
    assert [r.file for r in reduced.summary.ranks] == [f"host-a:{ranks[1].file}", f"host-b:{ranks[0].file}"]


@pytest.mark.parametrize(("batch_bytes", "tail_bytes", "keep_bytes"), [
    (4096, 100, 0), (4096, stream._TAIL_BYTES, summarise.KEEP_DECODED_BYTES),
    (stream.BATCH_BYTES, stream._TAIL_BYTES, 0), (stream.BATCH_BYTES, stream._TAIL_BYTES, summarise.KEEP_DECODED_BYTES)])
def test_reduced_corpus_pair_equals_the_merge(trace_dir, tmp_path, monkeypatch, batch_bytes, tail_bytes, keep_bytes):
    # 4 KiB batches: the agent reads each file in hundreds of cuts (a cut inside an event would lose or break it);
    # a 100-byte tail holds fewer than the cuts tried (they are looked for in the batch's last half then).
    # keep_bytes 0: the second pass reads and decodes the file again instead of reusing the first pass's events.
    monkeypatch.setattr(stream, "BATCH_BYTES", batch_bytes)
    monkeypatch.setattr(stream, "_TAIL_BYTES", tail_bytes)
    monkeypatch.setattr(summarise, "KEEP_DECODED_BYTES", keep_bytes)
    names = ["hta_nccl_rank0.json.gz", "hta_nccl_rank1.json.gz"]
    ranks = [on_node(trace_dir, CORPUS / name, f"node{i}", None) for i, name in enumerate(names)]
    merged = merge_traces([TraceInput(CORPUS / name, f"node{i}", None, 4242) for i, name in enumerate(names)],
                          tmp_path / "m.json.gz", workers=1)
    reduced = reduce_summaries(ranks)
    expected = summarize(merged.ranks)
    assert comparable(reduced.summary) == comparable(expected)
    assert expected.collectives_compared > 0


STREAMS = [("pg0", "allreduce"), ("pg0", "broadcast"), ("pg1", "allreduce")]


@st.composite
def jobs(draw) -> list[list[CollectiveCall]]:
    """Each rank's calls, stream after stream in one order for every rank, on a coarse grid: windows cut at
    different calls, calls that overlap within the clock slack or not, and many equal starts (ties)."""
    streams = draw(st.lists(st.sampled_from(STREAMS), min_size=1, max_size=3, unique=True))
    on_gpu, sequenced = draw(st.booleans()), draw(st.booleans())
    job = []
    for _ in range(draw(st.integers(2, 6))):
        calls = []
        for group, op in streams:
            first = draw(st.integers(0, 3))
            for n in range(first, first + draw(st.integers(0, 8))):
                start = 1000.0 * n + 400 * draw(st.integers(0, 3))
                end = start + 400 * draw(st.integers(0, 3))
                seq = draw(st.integers(0, 10)) if sequenced else None  # repeats on one rank too
                calls.append(CollectiveCall(group, op, seq, start, end, 1, 1, on_gpu))
        job.append(calls)
    return job


@settings(max_examples=300, deadline=None)
@given(jobs())
def test_reduce_keys_collectives_as_the_per_call_matching_does(job):
    # The reduce goes from the wire's columns straight to each collective's figures; the merge keys every
    # call (match_calls) and summarises call by call. Same calls, same skews, ties and order included.
    def result(number: int, calls: list[CollectiveCall]) -> RankResult:
        return RankResult(RankSummary(number, f"h{number}", number, f"h{number}:f", 0, 0), [], {},
                          unsequenced_collectives=sum(call.seq is None for call in calls))

    remote = [RemoteRank(f"h{number}", number, number, "f",
                         convert.from_proto(RankTraceSummary, to_proto(result(number, calls), calls, 0, 0.0)))
              for number, calls in enumerate(job)]
    # Each rank's calls stream by stream in the order the reduce meets the streams (going through the ranks).
    streams = list(dict.fromkeys((call.group, call.name) for calls in job for call in calls))
    job = [sorted(calls, key=lambda call: streams.index((call.group, call.name))) for calls in job]
    per_call = [result(number, calls) for number, calls in enumerate(job)]
    for rank_result, calls, keys in zip(per_call, job, match_calls(job), strict=True):
        rank_result.collectives = [(key, call.ts) for key, call in zip(keys, calls, strict=True)]
    reduced = reduce_summaries(remote[::-1])  # in any order: ranks are sorted
    expected = summarize(per_call)
    assert json.dumps(summary_json(reduced.summary)) == json.dumps(summary_json(expected))  # dicts' order too


def test_ranks_without_a_summary_are_listed_with_the_reason(trace_dir, tmp_path):
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    bad = on_node(trace_dir, tmp_path / "notes.json", "host-a", 0)
    # What a reply carries for a file the caller may not fetch: no summary at all.
    hidden = dataclasses.replace(bad, summary=convert.from_proto(RankTraceSummary, pb.RankTraceSummary()), rank=1)
    reduced = reduce_summaries([bad, hidden])
    assert reduced.summary.ranks == []
    [(first, why_bad), (second, why_hidden)] = reduced.missing
    assert first is bad and why_bad.startswith("not a Kineto/Chrome trace")
    assert second is hidden and why_hidden == NO_SUMMARY


def rank(number: int, compute_us: float | None = None) -> RankSummary:
    return RankSummary(number, f"host{number}", 100 + number, f"host{number}:trace.json", 10, 1,
                       compute_us=compute_us)


def test_stragglers_the_rank_others_waited_for_and_a_typical_one():
    holds = [RankHold(2, "host2", 3, 90_000.0, None, None), RankHold(0, "host0", 6, 3_000.0, None, None)]
    summary = TraceSummary([rank(0), rank(1), rank(2), rank(3)], 9, [], {"0": 6, "2": 3}, holds, [], "by order")
    [straggler, typical] = trace_stragglers(summary)
    assert straggler.rank == 2 and straggler.why == ("the others waited 90.0 ms for it (last to start 3 of 9 "
                                                     "collectives compared)")
    assert typical.rank == 1 and typical.why == "a typical rank to compare with" and typical.host == "host1"


def test_stragglers_by_compute_and_none_when_nothing_stands_out():
    ranks = [rank(i, 1000.0) for i in range(7)] + [rank(7, 2500.0)]
    summary = summarize_like(ranks)
    picks = trace_stragglers(summary)
    assert [p.rank for p in picks][0] == 7 and picks[0].why == "GPU compute 2.50× the median rank's"
    assert trace_stragglers(summarize_like([rank(i, 1000.0) for i in range(8)])) == []


def summarize_like(ranks: list[RankSummary]) -> TraceSummary:
    return TraceSummary(ranks, 0, [], {}, [], [], "")


def test_cuts_never_split_an_event(trace_dir, tmp_path, monkeypatch):
    # "}, {" inside names and inside lists of objects in args, read in 64-byte batches: every event whole, once.
    odd = [kernel("gemm}, {odd", 200 + i, 5, shapes=[{"m": i}, {"n": 2}], note="}, {") for i in range(40)]
    zero = write_trace(tmp_path / "r0.json", BASE0, RANK0 + odd, rank=0)
    one = write_trace(tmp_path / "r1.json", BASE1, RANK1 + odd, rank=1)
    monkeypatch.setattr(stream, "BATCH_BYTES", 64)
    reduced = reduce_summaries([on_node(trace_dir, zero, "host-a", 0), on_node(trace_dir, one, "host-b", 1)])
    merged = merge_traces([TraceInput(zero, "host-a", 0, 4242), TraceInput(one, "host-b", 1, 4242)],
                          tmp_path / "m.json.gz", workers=1)
    assert comparable(reduced.summary) == comparable(summarize(merged.ranks))
    assert reduced.summary.ranks[0].events == len(RANK0) + len(odd) + 5  # the 5 events write_trace adds
    assert any(t.name == "gemm}, {odd" and t.count == 40 for t in reduced.summary.ranks[0].top_kernels)


def test_a_truncated_file_gets_an_error_not_a_summary(trace_dir, tmp_path):
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes((CORPUS / "hta_nccl_rank0.json.gz").read_bytes()[:5000])
    reduced = reduce_summaries([on_node(trace_dir, cut, "host-a", 0)])
    [(_, why)] = reduced.missing
    assert why == "truncated gzip (the file ends before its end marker)"
