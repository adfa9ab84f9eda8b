"""The agent summarises its ranks' trace files where they are, off the event loop, one per owner at a time.

``Summariser.schedule(capture)`` queues every written file of a capture that
has no summary yet, in a queue per owner (the uid whose folder holds it); a
worker thread reads each (opened through the trace dir: no links, plain files
of the folder's owner), decodes it, and stores a ``RankTraceSummary`` — or one
whose ``error`` says why there is none — in ``capture.summaries``. Owners are
served round-robin, one file of an owner at a time and at most
``MAX_SUMMARY_WORKERS`` files at once, so one user's large or hostile files
never hold up another user's capture. Files are read piece by piece
(``stream``), so a worker holds one rank's extract and one batch of events, or
the events of a small file (``KEEP_DECODED_BYTES``, decoded once), never a
large trace whole; a file that decompresses past ``MAX_TRACE_BYTES``, or a
gzipped one that inflates more than ``MAX_INFLATION_RATIO`` times, is left
alone (its summary says so).
Which caller may see a summary is decided when replying, as for FetchFile.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import gzip
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.traces.analysis.extract import Event, extract_rank, rank_result
from agentd.traces.analysis.process_groups import name_gloo_calls
from agentd.traces.analysis.stream import TraceFacts, TraceStreamError, event_batches
from agentd.traces.analysis.summary import RankExtract
from agentd.traces.analysis.wire import to_proto
from agentd.traces.capture import WRITTEN, Capture, Target
from agentd.traces.paths import TracePathError, TraceDir, owner_uid, reason, relative_parts

log = logging.getLogger(__name__)

# The most bytes (decompressed) of one trace the agent reads: beyond that, fetch it and analyse it elsewhere.
MAX_TRACE_BYTES = 4 << 30
# A file up to this size (decompressed JSON) is decoded once, its events (about twice its size) kept for the
# second pass; a larger one is read and decoded twice.
KEEP_DECODED_BYTES = 16 << 20
_READ_BYTES = 1 << 20
# A gzipped trace whose JSON is more than this many times its compressed bytes is refused: Kineto's traces
# inflate 7-25 times (tests/traces/data/corpus), a gzip bomb (a run of one byte) about 1000 times.
MAX_INFLATION_RATIO = 200
# The ratio is judged once this much JSON has come out (a small file's gzip header and tail skew it).
_RATIO_JUDGED_AFTER = 16 << 20
# Files summarised at once, each by a worker thread, each of another owner (an owner's files go one by one).
MAX_SUMMARY_WORKERS = 2


class TraceTooLarge(Exception):
    pass


def trace_chunks(trace_dir: TraceDir, file: str, limit: int = MAX_TRACE_BYTES) -> Iterator[bytes]:
    """The file's bytes in pieces, gunzipped when gzipped; TraceTooLarge past ``limit``."""
    fd, _ = trace_dir.open_file(relative_parts(file, "file"))
    with os.fdopen(fd, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw) if gzipped else raw
        total = 0
        while piece := stream.read(_READ_BYTES):
            total += len(piece)
            if total > limit:
                raise TraceTooLarge(f"it holds more than {limit >> 30} GiB of JSON, more than the agent reads; "
                                    "fetch it (tuiprof trace --fetch all) and run tuiprof analyze")
            if gzipped and total > _RATIO_JUDGED_AFTER and total > MAX_INFLATION_RATIO * raw.tell():
                raise TraceTooLarge(f"its {raw.tell()} gzipped bytes inflated to {total} bytes already, more than "
                                    f"{MAX_INFLATION_RATIO} times (traces inflate 7-25 times): not summarised")
            yield piece


class TraceEvents:
    """``extract_rank``'s two reads of a file, piece by piece (``stream``). The events of a file up to
    ``KEEP_DECODED_BYTES`` (decompressed) are kept from the first read for the second, which then neither
    reads nor decodes again; a larger file is read twice, one batch of events in memory at a time."""

    def __init__(self, trace_dir: TraceDir, file: str, facts: TraceFacts) -> None:
        self._trace_dir, self._file, self._facts = trace_dir, file, facts
        self._kept: list[list[Event]] | None = None

    def __call__(self) -> Iterator[list[Event]]:
        return iter(self._kept) if self._kept is not None else self._read()

    def _read(self) -> Iterator[list[Event]]:
        read = 0

        def counted() -> Iterator[bytes]:
            nonlocal read
            for piece in trace_chunks(self._trace_dir, self._file):
                read += len(piece)
                yield piece

        kept: list[list[Event]] | None = []
        for batch in event_batches(counted(), self._facts):
            if read > KEEP_DECODED_BYTES:
                kept = None  # too large to keep: the second pass reads the file again
            elif kept is not None:
                kept.append(batch)
            yield batch
        self._kept = kept


def summarise_file(trace_dir: TraceDir, file: str, host: str, pid: int, rank: int | None,
                   step_mode: str = "all", like_hta: bool = False) -> pb.RankTraceSummary:
    """One rank's summary of ``file`` (relative to the trace dir), or one whose ``error`` says why there is none.

    The file is read piece by piece (``stream``), twice unless it is small
    (``TraceEvents``): memory holds at most ``KEEP_DECODED_BYTES`` of the
    trace's events and the extract, never a large trace whole.
    """
    started = time.monotonic()
    facts = TraceFacts()
    extract = RankExtract(rank=rank, host=host, pid=pid, file=file)
    try:
        calls = extract_rank(TraceEvents(trace_dir, file, facts), extract, step_mode, like_hta)
    except TraceStreamError as exc:
        return pb.RankTraceSummary(error=str(exc))
    except EOFError:
        return pb.RankTraceSummary(error="truncated gzip (the file ends before its end marker)")
    except (TraceTooLarge, TracePathError) as exc:
        return pb.RankTraceSummary(error=str(exc))
    except (OSError, zlib.error) as exc:
        return pb.RankTraceSummary(error=f"cannot read it: {reason(exc)}")
    if extract.rank is None:
        extract.rank = facts.rank
    # gloo's calls named with their group here, so the console pairs them within it; a call whose group cannot
    # be told gets one of this rank's own (ranks are host and pid: pids repeat across hosts).
    calls = name_gloo_calls(calls, facts.groups, unknown=f"?@{host}:{pid}")
    result = rank_result(extract, calls)
    return to_proto(result, calls, facts.base_time_ns, time.monotonic() - started)


@dataclass(frozen=True)
class _Job:
    capture: Capture
    target: Target

    @property
    def key(self) -> tuple[str, str]:
        return (self.capture.capture_id, self.target.file)


class Summariser:
    """Summarises captures' written files on ``MAX_SUMMARY_WORKERS`` threads, one file per owner at a time,
    owners served round-robin. Scheduling runs on the event loop (``schedule`` and each file's completion)."""

    def __init__(self, trace_dir: TraceDir, hostname: str) -> None:
        self.trace_dir = trace_dir
        self.hostname = hostname
        self._pool = ThreadPoolExecutor(MAX_SUMMARY_WORKERS, thread_name_prefix="trace-summary")
        self._queued: set[tuple[str, str]] = set()  # waiting or being summarised
        # Owner (None: the agent's own folders) -> files waiting; an owner's turn comes in insertion order.
        self._waiting: collections.OrderedDict[int | None, collections.deque[_Job]] = collections.OrderedDict()
        self._busy: set[int | None] = set()  # owners with a file being summarised

    def schedule(self, capture: Capture, may_read: Callable[[str], bool]) -> None:
        """Queue each written file of ``capture`` that the caller ``may_read``, has no summary and is not queued."""
        for target in capture.targets:
            job = _Job(capture, target)
            if target.state != WRITTEN or target.file in capture.summaries or job.key in self._queued \
                    or not may_read(target.file):
                continue
            self._queued.add(job.key)
            self._waiting.setdefault(_owner(target.file), collections.deque()).append(job)
        self._start_next()

    def _start_next(self) -> None:
        """Start the waiting files of owners not being served, round-robin, while a worker is free."""
        loop = asyncio.get_running_loop()
        for owner in list(self._waiting):
            if len(self._busy) >= MAX_SUMMARY_WORKERS:
                return
            if owner in self._busy:
                continue
            jobs = self._waiting.pop(owner)
            job = jobs.popleft()
            if jobs:  # the owner's next file waits behind every other owner's
                self._waiting[owner] = jobs
            self._busy.add(owner)
            future = loop.run_in_executor(self._pool, self._summarise, job.capture, job.target)
            future.add_done_callback(functools.partial(self._done, owner, job.key))

    def _done(self, owner: int | None, key: tuple[str, str], _: object) -> None:
        self._busy.discard(owner)
        self._queued.discard(key)
        self._start_next()

    def _summarise(self, capture: Capture, target: Target) -> None:
        try:
            summary = summarise_file(self.trace_dir, target.file, self.hostname, target.pid, target.rank,
                                     capture.summary_steps, capture.summary_like_hta)
        except Exception as exc:  # a bug here must not leave the capture waiting for this summary forever
            log.exception("trace summary failed", extra={"capture_id": capture.capture_id, "file": target.file})
            summary = pb.RankTraceSummary(error=f"the agent failed to summarise it ({type(exc).__name__}); "
                                                "see the agent's log, or fetch the file and run tuiprof analyze")
        capture.summaries[target.file] = summary
        log.info("trace summarised", extra={"capture_id": capture.capture_id, "file": target.file,
                                              "seconds": round(summary.seconds, 3), "error": summary.error or None})

    def close(self) -> None:
        self._waiting.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _owner(file: str) -> int | None:
    """The uid whose folder holds ``file`` (None: the agent's own)."""
    try:
        return owner_uid(relative_parts(file, "file"))
    except TracePathError:
        return None
