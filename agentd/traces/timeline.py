"""Timeline captures: the hook library's event ring of each rank, read from shared memory.

No cooperation from the training process is needed: the agent reads each
rank's segment, and either dumps the ring's last N events now, or notes the
ring position at the start time, waits the duration, and dumps what was added.
The file is Kineto-shaped Chrome JSON (``baseTimeNanoseconds``, ``distributedInfo``,
``traceEvents``) so the console merges and summarises it like a Kineto trace:
GEMMs and collectives are GPU ``kernel`` events (collectives named ``nccl:<op>``),
one lane per CUDA stream for GEMMs and one for collectives, steps are
``ProfilerStep#<n>`` annotations. GEMM times come from the GPU's own clock (the
hook anchors it to the host's), so calls that ran back to back touch and idle time
is the GPU's. A GEMM shape's first call includes lazy module loading: it is kept
out of the kernels (category ``first_call``, "first call (includes loading)"), so
compute time and the summaries leave it out. Only the GEMM calls the hook timed are
events (every call of a shape up to ``tuiprof.gemm_timing.timed_first``, then one in
``sample_every``, or, with ``sample_max`` set, one in a period per shape from ``sample_every``
to ``sample_max``); the rest are counted in the rank's figures, not here. Files go into the agent's own folder
``timeline/<uid>/`` for the uid the kernel gives for the rank's process, and are
written whole or not at all (``TraceDir.write_file``).

Timed Python functions (xpu-timer's host events, its bit 2) come from the rank's ``.functions`` file
(``agentd.collectors.rank_functions``), which keeps each function's newest
``rank_functions.MAX_RECENT_CALLS`` calls and is renewed once a second: they are ``python_function``
slices on the host lane (tid 0, with the steps), the calls that overlap the dump's span (a duration
dump waits up to ``FUNCTIONS_WAIT_S`` for the publication that covers its end; a last-events dump takes
the newest publication, calls since the first event dumped). A function called more often than that
in the span has its older calls left out; ``tuiprof.functions`` in the file says how many are kept.

A segment is a claim any local user can make: only those the kernel confirms
(``agentd.collectors.rank_claims``, the ranks collector's checks) are dumped,
each through the file opened when it was verified, and a caller who is not an
administrator gets only the timelines of their own processes.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from agentd.auth import Caller
from agentd.collectors import rank_claims
from agentd.collectors.rank_claims import Candidate, Refused
from agentd.collectors.rank_files import READ_LIMIT, read_owned_text
from agentd.collectors.rank_functions import FUNCTIONS_SUFFIX, MAX_RECENT_CALLS, MalformedFunctionsError, parse
from agentd.collectors.rank_places import Claimant, SegmentFolders
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.traces.capture import FAILED, REFUSED, SENT, WRITE_GRACE_SECONDS, WRITTEN, Capture, Target
from agentd.traces.paths import TIMELINE_FOLDER, TraceDir, TraceDirError, reason

log = logging.getLogger(__name__)

MAX_TARGETS = 4096
COLLECTIVES_TID = 1
FIRST_GEMM_STREAM_TID = 2  # then one lane per CUDA stream, in the order the streams first appear
FIRST_CALL = "first call (includes loading)"
HOST_TID = 0  # the steps' lane, and the timed Python functions'
FUNCTIONS_WAIT_S = 2.5  # the rank publishes its function calls once a second


@dataclass
class TimelineCapture(Capture):
    """Its targets move on in ``run``; status calls only report them."""

    span: str = "last_events"
    duration_ms: int = 0
    last_events: int = 0
    segments: dict[int, Any] = field(default_factory=dict)  # pid → its verified segment, open until ``run`` ends
    named_pids: dict[int, int] = field(default_factory=dict)  # pid → the pid its segment names (its container's)
    # pid → (its segment's folder, opened for ``run``; the segment's name; its owner): where its function calls are
    function_files: dict[int, tuple[int, str, int]] = field(default_factory=dict)
    hostname: str = ""

    def refresh(self, registry: object) -> None:
        """Nothing to poll: ``run`` sets each target's state when it writes or fails."""


def start(request: pb.CaptureTraceRequest, span: str, capture_id: str, label: str, trace_dir: TraceDir,
          hostname: str, caller: Caller) -> TimelineCapture:
    """Match ranks by their verified segments and plan the dump (``run`` performs it)."""
    now = time.time()
    start_unix = request.start_time_unix_ms / 1000 if request.start_time_unix_ms else now
    end = max(start_unix, now) + request.duration_ms / 1000 if span == "duration_ms" else now
    deadline = end + WRITE_GRACE_SECONDS
    capture = TimelineCapture(capture_id, trace_dir, [], start_unix if span == "duration_ms" else None, deadline,
                              span=span, duration_ms=request.duration_ms, last_events=request.last_events,
                              hostname=hostname)
    try:
        from tuiprof_native import segment  # compiled; absent until built
    except ImportError as exc:
        capture.message = f"timeline capture unavailable: the segment reader is not built ({exc})"
        return capture
    wanted_pids, wanted_ranks = set(request.pids), set(request.ranks)
    refused: collections.Counter[str] = collections.Counter()
    # Every container's /dev/shm too, for a root agent (its segments are opened, then the folders closed).
    folders = SegmentFolders(segment.SEGMENT_DIR, containers=os.geteuid() == 0)
    try:
        for candidate in _candidates(segment, folders, refused):
            if len(capture.targets) == MAX_TARGETS:
                capture.message = f"only the first {MAX_TARGETS} matching ranks are dumped; name pids or ranks"
                break
            opened = _open_verified(candidate, segment, folders, refused)
            if opened is None:
                continue
            seg, header, claimant = opened
            if ((wanted_pids and claimant.pid not in wanted_pids) or (request.job_id and header.job_id != request.job_id)
                    or (wanted_ranks and header.rank not in wanted_ranks)):
                seg.close()
                continue
            capture.targets.append(_plan(capture, trace_dir, label, claimant, header.rank, seg, caller))
            if capture.targets[-1].state == SENT:
                _keep_folder(capture, claimant, candidate)
    finally:
        folders.close()
    if refused:
        log.info("rank segments refused for a timeline", extra={"capture_id": capture_id, "refused": dict(refused)})
    if not capture.targets:
        capture.message = ("no processes matched: no tuiprof segment "
                           f"{'for those filters ' if wanted_pids or wanted_ranks or request.job_id else ''}"
                           "on this host; start the job under `tuiprof run`")
    return capture


def _candidates(segment: Any, folders: SegmentFolders, refused: collections.Counter[str]) -> list[Candidate]:
    """The segment files (not inert notes) in every folder; at most ``rank_claims.MAX_FILES_PER_OWNER``
    per owner, like the ranks collector's scan."""
    try:
        found = rank_claims.scan(folders.current(lambda: ()), segment, {})
    except FileNotFoundError:
        return []
    refused.update(found.refused)
    return sorted((c for c in found.candidates if not c.inert), key=lambda c: c.pid)


def _open_verified(candidate: Candidate, segment: Any, folders: SegmentFolders, refused: collections.Counter[str]
                   ) -> tuple[Any, Any, Claimant] | None:
    """The open segment of a live rank whose claim the kernel confirms (``rank_claims``), its header and
    its process; None otherwise. Segments are files any user can create under any name: one that claims
    another process or user is never dumped, nor attributed to that process."""
    try:
        seg, _, claimant, alive = rank_claims.open_verified(candidate, segment, folders)
    except Refused as refusal:
        refused[refusal.reason] += 1
        return None
    except segment.SegmentFormatError:
        refused[rank_claims.UNREADABLE] += 1
        return None
    except segment.SegmentError as exc:  # being created, busy, or gone since the scan
        log.info("segment skipped", extra={"pid": candidate.pid, "reason": str(exc)})
        return None
    if alive is None:  # the process is gone: nothing left that the kernel can vouch for
        seg.close()
        return None
    try:
        return seg, seg.header(), claimant
    except segment.SegmentError as exc:
        seg.close()
        log.info("segment skipped", extra={"pid": candidate.pid, "reason": str(exc)})
        return None


def _keep_folder(capture: TimelineCapture, claimant: Claimant, candidate: Candidate) -> None:
    """Hold the segment's folder open for ``run`` (a container's is closed when ``start`` ends), to read
    the rank's function calls beside the segment; without it the dump has none, and says why."""
    try:
        folder = os.open(candidate.folder.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        log.info("segment folder not reopened: no function calls in the timeline", extra={"pid": claimant.pid,
                                                                                         "reason": str(exc)})
        return
    capture.function_files[claimant.pid] = (folder, os.path.basename(candidate.path), claimant.uid)


def _plan(capture: TimelineCapture, trace_dir: TraceDir, label: str, claimant: Claimant, rank: int | None,
          seg: Any, caller: Caller) -> Target:
    """The target for one rank: its file in ``timeline/<uid>/``, or refused when the caller may not see it.
    ``seg`` (open, verified) is kept for ``run`` when the target is planned, closed otherwise."""
    stem = f"rank{rank}-pid{claimant.pid}" if rank is not None else f"pid{claimant.pid}"
    folder = (TIMELINE_FOLDER, str(claimant.uid))
    target = Target(claimant.pid, rank, "/".join((*folder, f"{label}-timeline-{stem}.json")), SENT)
    if not caller.owns(claimant.uid):
        seg.close()
        target.fail(REFUSED, f"the process belongs to uid {claimant.uid}; you ({caller}) may capture only your "
                             "own processes")
        return target
    try:
        trace_dir.agent_folder(folder)
    except (OSError, TraceDirError) as exc:
        seg.close()
        target.fail(FAILED, f"cannot create {'/'.join(folder)}/ under the trace dir: {reason(exc)}")
        return target
    capture.segments[claimant.pid] = seg
    capture.named_pids[claimant.pid] = claimant.pid if claimant.pid_in_container is None else claimant.pid_in_container
    return target


async def run(capture: TimelineCapture) -> None:
    """Dump every target's events, then mark it written (or failed with the reason); closes the segments."""
    try:
        await _dump_all(capture)
    finally:
        for seg in capture.segments.values():
            seg.close()
        for folder, _, _ in capture.function_files.values():
            os.close(folder)


async def _dump_all(capture: TimelineCapture) -> None:
    window: tuple[int, int] | None = None
    heads: dict[int, int] = {}
    if capture.span == "duration_ms":
        assert capture.start_unix is not None
        await asyncio.sleep(max(0.0, capture.start_unix - time.time()))
        begin_ns = time.time_ns()
        for target in capture.targets:
            if target.state != SENT:
                continue
            try:
                heads[target.pid] = capture.segments[target.pid].header().ring_head
            except OSError as exc:
                target.fail(FAILED, f"cannot read the segment: {reason(exc)}")
        await asyncio.sleep(capture.duration_ms / 1000)
        window = (begin_ns, time.time_ns())
    for target in capture.targets:
        if target.state != SENT:
            continue
        try:
            await asyncio.to_thread(_dump, capture, target, heads.get(target.pid, 0), window)
            target.state = WRITTEN
        except (OSError, Refused) as exc:
            target.fail(FAILED, f"cannot dump the timeline: {reason(exc)}")


def _dump(capture: TimelineCapture, target: Target, since: int, window: tuple[int, int] | None) -> None:
    seg = capture.segments[target.pid]
    header = seg.header()
    if header.pid != capture.named_pids[target.pid]:  # rewritten since it was verified: not that process's events
        raise Refused(rank_claims.HEADER_PID, f"the segment of pid {target.pid} now names pid {header.pid}")
    events = seg.events(since=since)
    if window is None:
        events = events[-capture.last_events:]
        span = (min((e.start_ns for e in events), default=0), time.time_ns())
    else:
        begin, end = window
        events = [e for e in events if e.start_ns <= end and (e.end_ns or e.start_ns) >= begin]
        span = window
    calls, functions_note = _function_calls(capture.function_files.get(target.pid), span, wait=window is not None)
    document = chrome_trace(events, header, capture.hostname, calls)
    document["tuiprof"]["functions"] = functions_note
    *folder, name = target.file.split("/")
    capture.trace_dir.write_file(folder, name, json.dumps(document).encode())


FunctionCall = tuple[str, int, int]  # a timed Python function's name, start (unix ns) and duration (ns)


def _function_calls(place: tuple[int, str, int] | None, span: tuple[int, int], wait: bool
                    ) -> tuple[list[FunctionCall], dict[str, Any]]:
    """The rank's timed function calls that overlap ``span`` (``wait``: for a publication written after its
    end), and what the file says of them (how many calls a function keeps; why there are none)."""
    note: dict[str, Any] = {"recent_calls_kept": MAX_RECENT_CALLS}
    if place is None:
        return [], {**note, "unavailable": "the segment's folder could not be reopened"}
    folder, segment_name, owner = place
    begin, end = span
    deadline = time.monotonic() + (FUNCTIONS_WAIT_S if wait else 0)
    while True:
        text = read_owned_text(f"/proc/self/fd/{folder}/{segment_name}{FUNCTIONS_SUFFIX}", owner, READ_LIMIT)
        if not text:
            return [], {**note, "unavailable": "no timed Python functions published by the rank (not a Python job "
                                               "under tuiprof run, or none timed)"}
        try:
            publication = parse(text)
        except MalformedFunctionsError as exc:
            return [], {**note, "unavailable": str(exc)}
        if publication.written_ns >= end or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    note["published_unix_ns"] = publication.written_ns
    calls = [(name, start, duration) for name, recent in publication.recent.items() for start, duration in recent
             if start <= end and start + duration >= begin]
    return calls, note


def chrome_trace(events: list[Any], header: Any, hostname: str,
                 function_calls: list[FunctionCall] | None = None) -> dict[str, Any]:
    """Kineto-shaped Chrome JSON for one rank's ring events and timed Python function calls (times
    relative to a whole-second base)."""
    calls = function_calls or []
    starts = [*(e.start_ns for e in events), *(start for _, start, _ in calls)]
    base_ns = (min(starts, default=header.start_ns) // 1_000_000_000) * 1_000_000_000
    pid = header.pid
    trace_events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": COLLECTIVES_TID, "args": {"name": "collectives"}},
    ]
    trace_events += [{"ph": "X", "cat": "python_function", "name": name, "pid": pid, "tid": HOST_TID,
                      "ts": (start - base_ns) / 1000, "dur": duration / 1000, "args": {"timed function": True}}
                     for name, start, duration in sorted(calls, key=lambda call: call[1])]
    stream_tids: dict[int, int] = {}
    steps = 0
    for event in events:
        if event.end_ns is None:
            continue  # still in flight when dumped
        ts, dur = (event.start_ns - base_ns) / 1000, (event.end_ns - event.start_ns) / 1000
        if event.kind == "gemm":
            trace_events.append(_gemm_event(event, pid, _stream_tid(stream_tids, trace_events, pid, event.stream),
                                            ts, dur))
        elif event.kind == "nccl":
            trace_events.append({"ph": "X", "cat": "kernel", "name": f"nccl:{event.op}", "pid": pid,
                                 "tid": COLLECTIVES_TID, "ts": ts, "dur": dur,
                                 "args": {"Collective name": event.op, "dtype": event.dtype, "bytes": event.bytes,
                                          "seq": event.op_seq, "comm": f"{event.comm_hash:x}"}})
        elif event.kind == "step":
            steps += 1
            trace_events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{event.op_seq or steps}",
                                 "pid": pid, "tid": HOST_TID, "ts": ts, "dur": dur, "args": {}})
    document: dict[str, Any] = {
        "schemaVersion": 1, "baseTimeNanoseconds": base_ns, "traceEvents": trace_events,
        "tuiprof": {"kind": "timeline", "host": hostname, "job_id": header.job_id,
                    "gemm_timing": {"timed_first": header.gemm_timed_first,
                                    "sample_every": header.gemm_sample_every,
                                    "sample_max": header.gemm_sample_max}}}
    if header.rank is not None:
        document["distributedInfo"] = {"rank": header.rank, "world_size": header.world_size}
    return document


def _stream_tid(stream_tids: dict[int, int], trace_events: list[dict[str, Any]], pid: int, stream: int) -> int:
    """The lane of a CUDA stream's GEMMs, named when first used."""
    tid = stream_tids.get(stream)
    if tid is None:
        tid = stream_tids[stream] = FIRST_GEMM_STREAM_TID + len(stream_tids)
        trace_events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                             "args": {"name": f"GEMM stream 0x{stream:x}"}})
    return tid


def _gemm_event(event: Any, pid: int, tid: int, ts: float, dur: float) -> dict[str, Any]:
    """A GEMM as a GPU kernel, or, for a shape's first call, as a slice outside the kernels."""
    args: dict[str, Any] = {"dtype": event.dtype, "b": event.b, "m": event.m, "n": event.n, "k": event.k,
                            "flops": event.flops}
    if event.first_call:
        return {"ph": "X", "cat": "first_call", "name": f"{event.op} ({FIRST_CALL})", "pid": pid, "tid": tid,
                "ts": ts, "dur": dur, "args": {**args, "first_call": True}}
    return {"ph": "X", "cat": "kernel", "name": event.op, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}
