"""One Perfetto-loadable timeline from many ranks' Chrome traces, streamed rank by rank.

Each input (a Kineto trace or an agent timeline dump) is decoded on its own
(msgspec, keeping ``args`` as raw bytes), rewritten and appended to one
gzipped Chrome JSON file, then dropped: memory holds one rank plus the small
extracts the summary needs. Per rank:

- timestamps are shifted onto one shared base: every file's
  ``baseTimeNanoseconds`` + ``ts`` is wall-clock time, and the merged file
  keeps ``baseTimeNanoseconds`` = the earliest base, so wall clock =
  base + ts for every event of every rank;
- each original process (CPU pid, GPU device, "Spans") becomes one process
  track named ``rank R · host · <what>``, sorted by rank; when the job's
  parallel groups are known (``--groups``, else the process groups the traces
  list: ``parallel_groups``) named ``tp1 dp0 (rank 1) · host · <what>`` and
  sorted by group, outermost dimension first (the names and sort indices are
  written after every rank's events, once every rank's groups are read);
- flow ids are made unique per rank (Kineto reuses small ids in every file).

Across ranks, each collective (matched by ``trace_collectives`` within its
communicator) is linked with one flow chain (``s`` → ``t`` … → ``f``) in the
order the ranks started it. gloo's spans do not name their communicator: it
is read from the worker thread that ran them
(``agentd.traces.analysis.process_groups``, as the agent does), and a call
whose communicator cannot be told is linked to nothing. On request
(``link_matmuls``: a dimension), the n-th matmul of one shape is linked across
the ranks of each group of that dimension too (PyTorch's matmul CPU ops with
their input shapes: the trace needs ``record_shapes``).
"""

from __future__ import annotations

import gzip
import os
import pathlib
import re
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

import msgspec

from agentd.traces.analysis.extract import (
    DROPPED_METADATA, CollectiveCall, Event, FirstPass, RankExtractor, TraceFile, first_pass, rank_result, track,
)
from agentd.traces.analysis.summary import RankExtract, RankResult, hta_times
from agentd.traces.analysis.process_groups import ProcessGroup, name_gloo_calls, process_groups
from tuiprof.analysis.parallel_groups import (
    GroupLayout, GroupsSpecError, layout_from_process_groups, layout_from_spec, parse_groups,
)
from tuiprof.analysis.trace_collectives import match_calls
from tuiprof.analysis.trace_gzip import GzipPieces, Piece, compress_piece
from tuiprof.analysis.trace_summary import TraceSummary, summarize
from tuiprof.errors import BadInputError

if TYPE_CHECKING:  # only its type: tuiprof analyze starts without the capture model
    from tuiprof.model.capture import ClusterCapture

_BASE_PATTERN = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
# distributedInfo's own fields come before its nested lists and objects (pg_config).
_DISTRIBUTED_PATTERN = re.compile(rb'"distributedInfo"\s*:\s*\{([^{}]*)')
_RANK_PATTERN = re.compile(rb'"rank"\s*:\s*(\d+)')
_WORLD_PATTERN = re.compile(rb'"world_size"\s*:\s*(\d+)')
_CHUNK_BYTES = 1 << 20
_OVERLAP_BYTES = 4096
_RANK_STRIDE = 1000  # merged pid = (rank index + 1) * stride + ordinal
_FLOW_ID_SHIFT = 32
FLOW_CATEGORY = "collective"
MATMUL_FLOW_CATEGORY = "matmul"
# PyTorch's matmul ops that run one GEMM each (aten::matmul and aten::linear call one of these).
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"})


class TraceFormatError(BadInputError):
    """An input that is not a Chrome trace; the message names the file."""


_decode_file = msgspec.json.Decoder(TraceFile).decode


class _ShapeArgs(msgspec.Struct):
    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")  # empty: not recorded


_decode_shape_args = msgspec.json.Decoder(_ShapeArgs).decode
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class TraceHeader:
    """The per-file facts the merge needs before any events: wall-clock base and rank."""

    base_time_ns: int  # 0: the file has none (older Kineto wrote absolute µs timestamps)
    rank: int | None
    world_size: int | None


@dataclass(frozen=True)
class TraceInput:
    """One rank's file and what the capture knows about it (rank may come from the file)."""

    path: pathlib.Path
    host: str = ""
    rank: int | None = None
    pid: int | None = None
    header: TraceHeader | None = None  # already read (``trace_header``); None: read it here


@dataclass
class _Hop:
    """One rank's end of a flow chain: a collective call or a matmul."""

    rank_index: int
    pid: int | str
    tid: int | str
    ts: float


@dataclass(frozen=True)
class _Matmul:
    shape: str  # the op and its input shapes, e.g. aten::mm[[64, 64], [64, 64]]
    hop: _Hop


@dataclass
class MergeResult:
    output: pathlib.Path
    base_time_ns: int
    events: int
    ranks: list[RankResult] = field(default_factory=list)
    linked_collectives: int = 0
    layout: GroupLayout | None = None  # the parallel groups the ranks were laid out by; None: by rank
    linked_matmuls: int = 0


@dataclass(frozen=True)
class _RankJob:
    """One rank's work for a worker process."""

    source: TraceInput
    rank_index: int
    shift_us: float
    steps: str
    timeline: bool
    like_hta: bool
    matmuls: bool  # collect the matmuls to link


@dataclass
class _RankFacts:
    """The small results of one rank the merge joins across ranks."""

    calls: list[CollectiveCall]
    tracks: list[tuple[int, str]]  # each merged pid and what it is ("host · GPU 0")
    groups: list[ProcessGroup]  # the rank's process groups, in the order it made them
    matmuls: list[_Matmul]


@dataclass
class _RankPart:
    """What a worker sends back for one rank: its compressed events and its small results."""

    piece: Piece
    result: RankResult
    facts: _RankFacts
    events: int


def _read_bytes(path: pathlib.Path) -> bytes:
    data = path.read_bytes()
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except EOFError:
        raise TraceFormatError(f"{path}: truncated gzip (the file ends before its end marker): "
                               "copy it again once it is completely written") from None
    except (OSError, zlib.error) as exc:
        raise TraceFormatError(f"{path}: not a readable gzip file ({exc})") from None


def _chunks(path: pathlib.Path) -> Iterator[bytes]:
    """The file's bytes, decompressed when gzipped, in pieces of 1 MiB."""
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as f:
            while chunk := f.read(_CHUNK_BYTES):
                yield chunk
    except EOFError:
        raise TraceFormatError(f"{path}: truncated gzip (the file ends before its end marker): "
                               "copy it again once it is completely written") from None
    except (OSError, zlib.error) as exc:
        raise TraceFormatError(f"{path}: not a readable gzip file ({exc})") from None


def trace_header(path: pathlib.Path) -> TraceHeader:
    """``baseTimeNanoseconds`` and ``distributedInfo`` wherever the file has them.

    Kineto wrote ``baseTimeNanoseconds`` near the head, then (mid-2024 to
    early 2025) after the events, at the very end: the file is scanned until
    both are found, keeping an overlap so a key split between chunks is seen.
    """
    base: int | None = None
    dist: re.Match[bytes] | None = None
    carry = b""
    for chunk in _chunks(path):
        window = carry + chunk
        if base is None and (match := _BASE_PATTERN.search(window)):
            base = int(match.group(1))
        if dist is None:
            dist = _DISTRIBUTED_PATTERN.search(window)
        if base is not None and dist is not None:
            break
        carry = window[-_OVERLAP_BYTES:]
    rank = world = None
    if dist is not None:
        rank_match, world_match = _RANK_PATTERN.search(dist.group(1)), _WORLD_PATTERN.search(dist.group(1))
        rank = int(rank_match.group(1)) if rank_match else None
        world = int(world_match.group(1)) if world_match else None
    return TraceHeader(base or 0, rank, world)


def _load(path: pathlib.Path) -> TraceFile:
    try:
        return _decode_file(_read_bytes(path))
    except msgspec.ValidationError as exc:
        raise TraceFormatError(f"{path}: not a Kineto/Chrome trace ({exc}); "
                               "give the .json or .json.gz file the profiler wrote") from None
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: not JSON ({exc}); give the .json or .json.gz file the profiler wrote") \
            from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror}") from None


def merge_traces(inputs: Iterable[TraceInput], output: pathlib.Path, workers: int | None = None,
                 steps: str = "all", timeline: bool = True, like_hta: bool = False, groups: str | None = None,
                 link_matmuls: str | None = None) -> MergeResult:
    """Write the merged, gzipped timeline to ``output``; return each rank's results for ``summarize``.

    ``steps`` ("all" or "complete", see ``step_window``) chooses what the
    summary counts, ``like_hta`` whether it counts by HTA's rules
    (``agentd.traces.analysis.extract``); the merged timeline always keeps every event, as written. With
    ``timeline`` False only the summary is wanted: ``output`` gets the merged
    file's frame and the collective links, no rank's events (not encoded nor
    compressed).

    ``groups`` (``--groups``, e.g. ``tp2-dp2``) lays the ranks out by that
    layout, else by the process groups their traces list; ``link_matmuls``
    (a dimension of the layout) links same-shape matmuls across each of its
    groups. A layout that cannot be this job's is a ``GroupsSpecError``.

    Ranks are rewritten and compressed in ``workers`` processes (default: one
    per CPU, at most one per rank) and written in rank order as they finish.
    """
    dimensions = parse_groups(groups) if groups is not None else None
    headers = [(source, source.header or trace_header(source.path)) for source in inputs]
    sources = [source if source.rank is not None else replace(source, rank=header.rank) for source, header in headers]
    bases = [header.base_time_ns for _, header in headers]
    origin = min(bases, default=0)
    order = sorted(range(len(sources)), key=lambda i: (sources[i].rank is None, sources[i].rank or 0,
                                                       sources[i].host, sources[i].pid or 0, str(sources[i].path)))
    world_size = next((h.world_size for _, h in headers if h.world_size is not None), None) or \
        max((s.rank + 1 for s in sources if s.rank is not None), default=len(sources))
    # Checked before any rank is read: a layout that cannot be this job's is refused at once.
    spec_layout = layout_from_spec(dimensions, world_size, groups or "") if dimensions is not None else None
    jobs = [_RankJob(sources[i], index, (bases[i] - origin) / 1000.0, steps, timeline, like_hta,
                     link_matmuls is not None) for index, i in enumerate(order)]
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    result = MergeResult(output, origin, 0)
    hops: dict[tuple[str, ...], list[_Hop]] = {}
    with open(output, "wb") as out:
        writer = GzipPieces(out)
        # A fixed first element (metadata viewers ignore) lets every later piece start with a comma.
        writer.add(compress_piece(b'{"displayTimeUnit":"ms","baseTimeNanoseconds":%d,"traceEvents":['
                                  b'{"ph":"M","name":"tuiprof_merge","pid":0,"tid":0,"args":{"origin_unix_ns":%d}}'
                                  % (origin, origin)))
        if workers > 1:
            # Imported here: a merge of one file (tuiprof analyze on a small trace) starts without them.
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            _start_resource_tracker()
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                facts = _write_parts(pool.map(_rank_part, jobs), writer, result)
        else:
            facts = _write_parts(map(_rank_part, jobs), writer, result)
        ranks = [r.summary.rank for r in result.ranks]
        result.layout = spec_layout or layout_from_process_groups(
            {rank: f.groups for rank, f in zip(ranks, facts, strict=True) if rank is not None}, world_size)
        # A gloo call whose communicator cannot be told gets one of its rank's own: it is linked to nothing.
        calls = [name_gloo_calls(f.calls, f.groups, unknown=f"?@{index}") for index, f in enumerate(facts)]
        for rank_index, (rank_calls, keys) in enumerate(zip(calls, match_calls(calls), strict=True)):
            result.ranks[rank_index].collectives = [(key, call.ts) for key, call in zip(keys, rank_calls, strict=True)]
            for key, call in zip(keys, rank_calls, strict=True):
                hops.setdefault(key, []).append(_Hop(rank_index, call.pid, call.tid, call.ts))
        flows = _collective_flows(hops)
        result.linked_collectives = len({f.id for f in flows})
        if link_matmuls is not None:
            matmul_flows = _matmul_flows(facts, ranks, _layout_with(result.layout, link_matmuls), link_matmuls,
                                         first_id=result.linked_collectives + 1)
            result.linked_matmuls = len({f.id for f in matmul_flows})
            flows += matmul_flows
        if timeline:
            flows += _track_names(facts, ranks, result.layout, [s.source for s in jobs])
        tail = b"," + _encode(flows)[1:-1] if flows else b""
        ranks_json = [{"rank": r.summary.rank, "host": r.summary.host, "pid": r.summary.pid, "file": r.summary.file,
                       "groups": _place(result.layout, r.summary.rank)} for r in result.ranks]
        layout = result.layout.describe() if result.layout is not None else None
        writer.close(tail + b'],"tuiprof":'
                     + _encode({"origin_unix_ns": origin, "groups": layout, "ranks": ranks_json}) + b"}")
    return result


def _place(layout: GroupLayout | None, rank: int | None) -> dict[str, int] | None:
    """The rank's coordinates in the layout, for the merged file's ``tuiprof`` section."""
    if layout is None or rank is None or rank not in layout.coordinates:
        return None
    return dict(layout.coordinates[rank])


def _layout_with(layout: GroupLayout | None, dimension: str) -> GroupLayout:
    """The layout, when it has ``dimension``; else the error saying what to give."""
    if layout is None:
        raise GroupsSpecError(f"--link-matmuls {dimension}: the traces list no parallel groups; "
                              "give the layout with --groups (e.g. tp4-dp2)")
    if all(d.name != dimension for d in layout.dimensions):
        raise GroupsSpecError(f"--link-matmuls {dimension}: the layout {layout.describe()} has no {dimension} "
                              f"dimension; give one of {', '.join(d.name for d in layout.dimensions)}")
    return layout


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with a real stderr.

    The tracker is spawned with ``sys.stderr.fileno()``; inside the console
    (Textual) ``sys.stderr`` is a capture whose ``fileno()`` is -1, and the
    pool's first spawn failed with "bad value(s) in fds_to_keep", leaving its
    semaphores behind. The tracker then writes to /dev/null, not over the screen.
    """
    try:
        usable = sys.stderr is not None and sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        usable = False
    if usable:
        return
    from multiprocessing import resource_tracker

    saved = sys.stderr
    with open(os.devnull, "w") as devnull:
        sys.stderr = devnull
        try:
            resource_tracker.ensure_running()
        finally:
            sys.stderr = saved


MERGED_NAME = "merged.trace.json.gz"


def merge_capture(capture: ClusterCapture, output: pathlib.Path, steps: str = "all", like_hta: bool = False,
                  groups: str | None = None, link_matmuls: str | None = None) -> tuple[MergeResult, TraceSummary]:
    """A capture's fetched files merged into ``output/merged.trace.json.gz``, and their summary.

    What ``tuiprof trace`` and the traces screen both do once the files are in.
    """
    inputs = [TraceInput(f.local, f.host, f.rank, f.pid) for f in capture.files]
    merged = merge_traces(inputs, output / MERGED_NAME, steps=steps, like_hta=like_hta, groups=groups,
                          link_matmuls=link_matmuls)
    return merged, summarize(merged.ranks)


def _write_parts(parts: Iterable[_RankPart], writer: GzipPieces, result: MergeResult) -> list[_RankFacts]:
    """Append each rank's piece in order; return each rank's small results."""
    facts = []
    for part in parts:
        writer.add(part.piece)
        result.events += part.events
        result.ranks.append(part.result)
        facts.append(part.facts)
    return facts


def _rank_part(job: _RankJob) -> _RankPart:
    """One rank, start to end (runs in a worker process): rewrite, compress, summarise."""
    chunk, extract, facts = _rewrite(job)
    piece = compress_piece(b"," + chunk if chunk else b"")
    result = rank_result(extract, facts.calls)  # its collectives are keyed across ranks afterwards
    return _RankPart(piece, result, facts, extract.events)


def _rewrite(job: _RankJob) -> tuple[bytes, RankExtract, _RankFacts]:
    """One rank's events moved onto the shared base and its own pids, plus its summary extract
    (``agentd.traces.analysis.extract``: what the agent extracts on the node, here on the shared base)."""
    source, rank_index, shift_us, step_mode, like_hta = job.source, job.rank_index, job.shift_us, job.steps, job.like_hta
    trace = _load(source.path)
    rank = source.rank
    if rank is None and trace.distributedInfo is not None:
        rank = trace.distributedInfo.rank
    groups = process_groups(trace.distributedInfo.pg_config) if trace.distributedInfo is not None else []
    matmuls: list[_Matmul] = []
    extract = RankExtract(rank=rank, host=source.host, pid=source.pid, file=str(source.path))
    unset: Final = msgspec.UNSET  # Final: the type checker narrows ``x is unset`` like ``x is msgspec.UNSET``
    pids: dict[int | str, int] = {}
    labels: dict[int | str, str] = {}
    pid_base = (rank_index + 1) * _RANK_STRIDE
    flow_shift = rank_index << _FLOW_ID_SHIFT
    events = trace.traceEvents
    found = FirstPass()
    first_pass(events, shift_us, found, like_hta)
    extractor = RankExtractor(extract, found, step_mode, like_hta)
    for event in events:
        original_pid = event.pid
        if event.ph == "M" and event.name in DROPPED_METADATA:
            if event.name == "process_name" and event.args is not unset and original_pid is not unset:
                labels[original_pid] = str(msgspec.json.decode(event.args).get("name", ""))
            continue
        if original_pid is not unset:
            new_pid = pids.get(original_pid)
            if new_pid is None:
                new_pid = pids[original_pid] = pid_base + len(pids)
            event.pid = new_pid
        written = event.ts
        if written is unset:
            continue
        ts = event.ts = written + shift_us
        if event.id is not unset and type(event.id) is int:
            event.id += flow_shift
        dur = event.dur
        if event.ph != "X" or dur is unset:
            continue
        cat, name = event.cat, event.name
        if name is unset or cat is unset:
            continue
        if job.matmuls and name in MATMUL_OPS and (shape := _shape(name, event)) is not None:
            matmuls.append(_Matmul(shape, _Hop(rank_index, track(event.pid), track(event.tid), ts)))
        if like_hta:  # rounded on the file's own time base, as HTA reads it
            start, dur = hta_times(written, dur)
            ts = start + shift_us
        extractor.add(event, name, cat, ts, dur)
    facts = _RankFacts(extractor.finish(), [], groups, matmuls)
    extract.events = len(events)  # every event of the file, the metadata replaced by the merge's names included
    if not job.timeline:
        return b"", extract, facts
    facts.tracks = [(new_pid, f"{source.host or 'host?'} · {_label(original_pid, labels.get(original_pid, ''), source.pid)}")
                    for original_pid, new_pid in pids.items()]
    # One pass (a ``del`` per dropped event was quadratic: 186k of 456k events on HTA's MTIA trace).
    events = [e for e in events if not (e.ph == "M" and e.name in DROPPED_METADATA)]
    return _encode(events)[1:-1], extract, facts


def _shape(name: str, event: Event) -> str | None:
    """A matmul op and its input shapes (None: the trace did not record shapes)."""
    if event.args is msgspec.UNSET:
        return None
    try:
        dims = _decode_shape_args(event.args).dims
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return name + bytes(dims).decode() if dims else None


def _track_names(facts: list[_RankFacts], ranks: list[int | None], layout: GroupLayout | None,
                 sources: list[TraceInput]) -> list[Event]:
    """Every merged process track's name and sort index: by the layout's groups when the rank has a place in it,
    else by rank."""
    def who(index: int) -> str:
        rank = ranks[index]
        if rank is None:
            return f"pid {sources[index].pid or '?'}"
        return layout.label(rank) if layout is not None and rank in layout.coordinates else f"rank {rank}"

    def display_order(index: int) -> tuple[bool, tuple[int, ...]]:
        rank = ranks[index]
        placed = layout is not None and rank is not None and rank in layout.coordinates
        return (not placed, layout.sort_key(rank) if placed and layout is not None and rank is not None else (index,))

    events = []
    for position, index in enumerate(sorted(range(len(facts)), key=display_order)):
        for new_pid, what in facts[index].tracks:
            events.append(Event(ph="M", name="process_name", pid=new_pid, tid=0,
                                args=msgspec.Raw(_encode({"name": f"{who(index)} · {what}"}))))
            sort_index = (position + 1) * _RANK_STRIDE + new_pid % _RANK_STRIDE
            events.append(Event(ph="M", name="process_sort_index", pid=new_pid, tid=0,
                                args=msgspec.Raw(_encode({"sort_index": sort_index}))))
    return events


def _label(original_pid: int | str, name: str, process_pid: int | None) -> str:
    """What an original process track is: Kineto's string pids ("Spans") as they are, the OS
    process as ``CPU pid N (name)``, small integers (device indices) as the GPU they are
    (Kineto names device tracks after the process, "python3"; the GPU is only in a label),
    the negative ones (CUPTI's own overhead) by their name."""
    if isinstance(original_pid, str):
        return original_pid or "markers"
    if original_pid == process_pid or original_pid > 64:
        return f"CPU pid {original_pid}" + (f" ({name})" if name else "")
    if original_pid >= 0:
        return f"GPU {original_pid}"
    return name or f"device {original_pid}"


def _collective_flows(hops: dict[tuple[str, ...], list[_Hop]]) -> list[Event]:
    """One flow chain per collective seen on two or more ranks (named with its communicator when it has one)."""
    flows: list[Event] = []
    flow_id = 1
    for key, chain in hops.items():
        name = f"{key[1]} #{key[2]}" + (f" on group {key[0]}" if key[0] else "")
        linked = _flow_chain(chain, FLOW_CATEGORY, name, flow_id)
        flows += linked
        flow_id += bool(linked)
    return flows


def _matmul_flows(facts: list[_RankFacts], ranks: list[int | None], layout: GroupLayout, dimension: str,
                  first_id: int) -> list[Event]:
    """The n-th matmul of each shape linked across the ranks of each group of ``dimension``."""
    chains: dict[tuple[tuple[int, ...], str, int], list[_Hop]] = {}
    for rank, rank_facts in zip(ranks, facts, strict=True):
        group = layout.peers(rank, dimension) if rank is not None else None
        if group is None:
            continue
        seen: dict[str, int] = {}
        for matmul in sorted(rank_facts.matmuls, key=lambda m: m.hop.ts):
            occurrence = seen[matmul.shape] = seen.get(matmul.shape, -1) + 1
            chains.setdefault((group, matmul.shape, occurrence), []).append(matmul.hop)
    flows: list[Event] = []
    flow_id = first_id
    for (_, shape, occurrence), chain in chains.items():
        linked = _flow_chain(chain, MATMUL_FLOW_CATEGORY, f"{shape} #{occurrence} across {dimension}", flow_id)
        flows += linked
        flow_id += bool(linked)
    return flows


def _flow_chain(chain: list[_Hop], category: str, name: str, flow_id: int) -> list[Event]:
    """One flow chain through the hops of two or more ranks, in time order (Perfetto drops a flow whose end
    comes before its start); none for one rank's."""
    if len({hop.rank_index for hop in chain}) < 2:
        return []
    chain.sort(key=lambda hop: (hop.ts, hop.rank_index))
    flows = []
    for position, hop in enumerate(chain):
        ph = "s" if position == 0 else ("f" if position == len(chain) - 1 else "t")
        flows.append(Event(ph=ph, cat=category, name=name, pid=hop.pid, tid=hop.tid, ts=hop.ts, id=flow_id,
                           bp="e" if ph == "f" else msgspec.UNSET))
    return flows
