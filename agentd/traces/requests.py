"""Checking a CaptureTraceRequest whole, before anything is queued or created.

Every field is bounded: enums must be known values, lists hold at most
``MAX_LIST_ITEMS`` entries, strings that reach file names or a Kineto config
are plain names (``agentd.traces.paths.check_name``). A request that fails
gets one line (INVALID_ARGUMENT) saying which field and what is accepted.
"""

from __future__ import annotations

import re
import time

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.traces.paths import TracePathError, check_name, shown

MAX_DURATION_MS = 10 * 60 * 1000
MAX_ITERATIONS = 10_000
MAX_LAST_EVENTS = 1 << 20
MAX_LIST_ITEMS = 4096
# pid_max can be at most 2^22 on Linux.
MAX_PID = 1 << 22
MAX_START_AHEAD_SECONDS = 24 * 3600
_JOB_ID = re.compile(r"[A-Za-z0-9._+-]{1,64}")
KINDS = frozenset(pb.CaptureTraceRequest.Kind.values())


class CaptureRequestError(ValueError):
    """A CaptureTrace request that cannot be served as asked (INVALID_ARGUMENT)."""


def check_capture(request: pb.CaptureTraceRequest) -> str:
    """The request's span ("duration_ms", "iterations" or "last_events") once every field checks out."""
    if request.kind not in KINDS:
        raise CaptureRequestError(f"kind {request.kind} is unknown: use KINETO (0) or TIMELINE (1)")
    span: str | None = request.WhichOneof("span")
    _check_span(request, span)
    assert span is not None
    _check_filters(request)
    if request.output_subdir:
        try:
            check_name(request.output_subdir, "output_subdir")
        except TracePathError as exc:
            raise CaptureRequestError(str(exc)) from None
    start_s = request.start_time_unix_ms / 1000
    if request.start_time_unix_ms < 0 or start_s > time.time() + MAX_START_AHEAD_SECONDS:
        raise CaptureRequestError(f"start_time_unix_ms {request.start_time_unix_ms} is not within the next "
                                  f"{MAX_START_AHEAD_SECONDS // 3600} h (0: as soon as every process can start)")
    return span


def _check_span(request: pb.CaptureTraceRequest, span: str | None) -> None:
    if span is None:
        raise CaptureRequestError("say how long to trace: set duration_ms or iterations")
    if span == "duration_ms" and not 0 < request.duration_ms <= MAX_DURATION_MS:
        raise CaptureRequestError(f"duration_ms must be 1-{MAX_DURATION_MS}, got {request.duration_ms}")
    if span == "iterations" and not 0 < request.iterations <= MAX_ITERATIONS:
        raise CaptureRequestError(f"iterations must be 1-{MAX_ITERATIONS}, got {request.iterations}")
    is_timeline = request.kind == pb.CaptureTraceRequest.TIMELINE
    if span == "last_events" and not is_timeline:
        raise CaptureRequestError(
            "last_events is for timeline captures only; Kineto traces take duration_ms or iterations")
    if span == "iterations" and is_timeline:
        raise CaptureRequestError("timeline captures take duration_ms or last_events, not iterations")
    if span == "last_events" and not 0 < request.last_events <= MAX_LAST_EVENTS:
        raise CaptureRequestError(f"last_events must be 1-{MAX_LAST_EVENTS}, got {request.last_events}")


def _check_filters(request: pb.CaptureTraceRequest) -> None:
    if len(request.pids) > MAX_LIST_ITEMS or len(request.ranks) > MAX_LIST_ITEMS:
        raise CaptureRequestError(f"name at most {MAX_LIST_ITEMS} pids and {MAX_LIST_ITEMS} ranks "
                                  f"(got {len(request.pids)} and {len(request.ranks)})")
    bad_pid = next((p for p in request.pids if not 0 < p < MAX_PID), None)
    if bad_pid is not None:
        raise CaptureRequestError(f"pid {bad_pid} cannot exist: pids are 1-{MAX_PID - 1}")
    bad_rank = next((r for r in request.ranks if r < 0), None)
    if bad_rank is not None:
        raise CaptureRequestError(f"rank {bad_rank} is negative")
    if request.job_id and not _JOB_ID.fullmatch(request.job_id):
        raise CaptureRequestError(f"job_id {shown(request.job_id)} is not a job id: use 1-64 letters, digits, "
                                  "'.', '_', '+' or '-'")
