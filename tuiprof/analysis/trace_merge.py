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
  track named ``rank R · host · <what>``, sorted by rank;
- flow ids are made unique per rank (Kineto reuses small ids in every file).

Across ranks, each collective (matched by ``trace_collectives``) is linked
with one flow chain (``s`` → ``t`` … → ``f``) in the order the ranks started it.
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
    DROPPED_METADATA, CollectiveCall, Event, FirstPass, RankExtractor, TraceFile, first_pass, rank_result,
)
from agentd.traces.analysis.summary import RankExtract, RankResult, hta_times
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


class TraceFormatError(BadInputError):
    """An input that is not a Chrome trace; the message names the file."""


_decode_file = msgspec.json.Decoder(TraceFile).decode
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
class _CollectiveHop:
    rank_index: int
    pid: int | str
    tid: int | str
    ts: float


@dataclass
class MergeResult:
    output: pathlib.Path
    base_time_ns: int
    events: int
    ranks: list[RankResult] = field(default_factory=list)
    linked_collectives: int = 0


@dataclass
class _RankPart:
    """What a worker sends back for one rank: its compressed events and its small results."""

    piece: Piece
    result: RankResult
    calls: list[CollectiveCall]
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
                 steps: str = "all", timeline: bool = True, like_hta: bool = False) -> MergeResult:
    """Write the merged, gzipped timeline to ``output``; return each rank's results for ``summarize``.

    ``steps`` ("all" or "complete", see ``step_window``) chooses what the
    summary counts, ``like_hta`` whether it counts by HTA's rules
    (``agentd.traces.analysis.extract``); the merged timeline always keeps every event, as written. With
    ``timeline`` False only the summary is wanted: ``output`` gets the merged
    file's frame and the collective links, no rank's events (not encoded nor
    compressed).

    Ranks are rewritten and compressed in ``workers`` processes (default: one
    per CPU, at most one per rank) and written in rank order as they finish.
    """
    headers = [(source, source.header or trace_header(source.path)) for source in inputs]
    sources = [source if source.rank is not None else replace(source, rank=header.rank) for source, header in headers]
    bases = [header.base_time_ns for _, header in headers]
    origin = min(bases, default=0)
    order = sorted(range(len(sources)), key=lambda i: (sources[i].rank is None, sources[i].rank or 0,
                                                       sources[i].host, sources[i].pid or 0, str(sources[i].path)))
    jobs = [(sources[i], index, (bases[i] - origin) / 1000.0, steps, timeline, like_hta)
            for index, i in enumerate(order)]
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    result = MergeResult(output, origin, 0)
    hops: dict[tuple[str, ...], list[_CollectiveHop]] = {}
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
                calls = _write_parts(pool.map(_rank_part, jobs), writer, result)
        else:
            calls = _write_parts(map(_rank_part, jobs), writer, result)
        for rank_index, (rank_calls, keys) in enumerate(zip(calls, match_calls(calls), strict=True)):
            result.ranks[rank_index].collectives = [(key, call.ts) for key, call in zip(keys, rank_calls, strict=True)]
            for key, call in zip(keys, rank_calls, strict=True):
                hops.setdefault(key, []).append(_CollectiveHop(rank_index, call.pid, call.tid, call.ts))
        flows = _collective_flows(hops)
        result.linked_collectives = len({f.id for f in flows})
        tail = b"," + _encode(flows)[1:-1] if flows else b""
        ranks_json = [{"rank": r.summary.rank, "host": r.summary.host, "pid": r.summary.pid, "file": r.summary.file}
                      for r in result.ranks]
        writer.close(tail + b'],"tuiprof":' + _encode({"origin_unix_ns": origin, "ranks": ranks_json}) + b"}")
    return result


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


def merge_capture(capture: ClusterCapture, output: pathlib.Path, steps: str = "all", like_hta: bool = False
                  ) -> tuple[MergeResult, TraceSummary]:
    """A capture's fetched files merged into ``output/merged.trace.json.gz``, and their summary.

    What ``tuiprof trace`` and the traces screen both do once the files are in.
    """
    inputs = [TraceInput(f.local, f.host, f.rank, f.pid) for f in capture.files]
    merged = merge_traces(inputs, output / MERGED_NAME, steps=steps, like_hta=like_hta)
    return merged, summarize(merged.ranks)


def _write_parts(parts: Iterable[_RankPart], writer: GzipPieces, result: MergeResult) -> list[list[CollectiveCall]]:
    """Append each rank's piece in order; return each rank's collective calls."""
    calls = []
    for part in parts:
        writer.add(part.piece)
        result.events += part.events
        result.ranks.append(part.result)
        calls.append(part.calls)
    return calls


def _rank_part(job: tuple[TraceInput, int, float, str, bool, bool]) -> _RankPart:
    """One rank, start to end (runs in a worker process): rewrite, compress, summarise."""
    source, rank_index, shift_us, steps, timeline, like_hta = job
    chunk, extract, calls = _rewrite(source, rank_index, shift_us, steps, timeline, like_hta)
    piece = compress_piece(b"," + chunk if chunk else b"")
    result = rank_result(extract, calls)  # its collectives are keyed across ranks afterwards
    return _RankPart(piece, result, calls, extract.events)


def _rewrite(source: TraceInput, rank_index: int, shift_us: float, step_mode: str, timeline: bool = True,
             like_hta: bool = False) -> tuple[bytes, RankExtract, list[CollectiveCall]]:
    """One rank's events moved onto the shared base and its own pids, plus its summary extract
    (``agentd.traces.analysis.extract``: what the agent extracts on the node, here on the shared base)."""
    trace = _load(source.path)
    rank = source.rank
    if rank is None and trace.distributedInfo is not None:
        rank = trace.distributedInfo.rank
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
        if like_hta:  # rounded on the file's own time base, as HTA reads it
            start, dur = hta_times(written, dur)
            ts = start + shift_us
        extractor.add(event, name, cat, ts, dur)
    calls = extractor.finish()
    extract.events = len(events)  # every event of the file, the metadata replaced below included
    if not timeline:
        return b"", extract, calls
    # One pass (a ``del`` per dropped event was quadratic: 186k of 456k events on HTA's MTIA trace).
    events = [e for e in events if not (e.ph == "M" and e.name in DROPPED_METADATA)]
    for original_pid, new_pid in pids.items():
        label = _label(original_pid, labels.get(original_pid, ""), source.pid)
        where = f"rank {rank}" if rank is not None else f"pid {source.pid or '?'}"
        events.append(Event(ph="M", name="process_name", pid=new_pid, tid=0,
                            args=msgspec.Raw(_encode({"name": f"{where} · {source.host or 'host?'} · {label}"}))))
        events.append(Event(ph="M", name="process_sort_index", pid=new_pid, tid=0,
                            args=msgspec.Raw(_encode({"sort_index": new_pid}))))
    return _encode(events)[1:-1], extract, calls


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


def _collective_flows(hops: dict[tuple[str, ...], list[_CollectiveHop]]) -> list[Event]:
    """One flow chain per collective seen on two or more ranks, in time order (Perfetto drops a flow
    whose end comes before its start)."""
    flows: list[Event] = []
    flow_id = 1
    for key, chain in hops.items():
        if len({hop.rank_index for hop in chain}) < 2:
            continue
        chain.sort(key=lambda hop: (hop.ts, hop.rank_index))
        name = f"{key[1]} #{key[2]}"
        for position, hop in enumerate(chain):
            ph = "s" if position == 0 else ("f" if position == len(chain) - 1 else "t")
            flows.append(Event(ph=ph, cat=FLOW_CATEGORY, name=name, pid=hop.pid, tid=hop.tid, ts=hop.ts, id=flow_id,
                               bp="e" if ph == "f" else msgspec.UNSET))
        flow_id += 1
    return flows
