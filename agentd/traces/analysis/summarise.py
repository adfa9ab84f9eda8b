"""The agent summarises its ranks' trace files where they are, off the event loop, one at a time.

``Summariser.schedule(capture)`` queues every written file of a capture that
has no summary yet; one worker thread reads each (opened through the trace
dir: no links, plain files of the folder's owner), decodes it, and stores a
``RankTraceSummary`` — or one whose ``error`` says why there is none — in
``capture.summaries``. Files are read piece by piece (``stream``) and one at
a time, so the agent holds one rank's extract and one batch of events, or the
events of a small file (``KEEP_DECODED_BYTES``, decoded once), never a large
trace whole; a file that decompresses past ``MAX_TRACE_BYTES`` is left alone
(its summary says so: fetch it and run ``tuiprof analyze``).
Which caller may see a summary is decided when replying, as for FetchFile.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.traces.analysis.extract import Event, extract_rank, rank_result
from agentd.traces.analysis.stream import TraceFacts, TraceStreamError, event_batches
from agentd.traces.analysis.summary import RankExtract
from agentd.traces.analysis.wire import to_proto
from agentd.traces.capture import WRITTEN, Capture, Target
from agentd.traces.paths import TracePathError, TraceDir, reason, relative_parts

log = logging.getLogger(__name__)

# The most bytes (decompressed) of one trace the agent reads: beyond that, fetch it and analyse it elsewhere.
MAX_TRACE_BYTES = 4 << 30
# A file up to this size (decompressed JSON) is decoded once, its events (about twice its size) kept for the
# second pass; a larger one is read and decoded twice.
KEEP_DECODED_BYTES = 16 << 20
_READ_BYTES = 1 << 20


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
                   step_mode: str = "all") -> pb.RankTraceSummary:
    """One rank's summary of ``file`` (relative to the trace dir), or one whose ``error`` says why there is none.

    The file is read piece by piece (``stream``), twice unless it is small
    (``TraceEvents``): memory holds at most ``KEEP_DECODED_BYTES`` of the
    trace's events and the extract, never a large trace whole.
    """
    started = time.monotonic()
    facts = TraceFacts()
    extract = RankExtract(rank=rank, host=host, pid=pid, file=file)
    try:
        calls = extract_rank(TraceEvents(trace_dir, file, facts), extract, step_mode)
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
    result = rank_result(extract, calls)
    return to_proto(result, calls, facts.base_time_ns, time.monotonic() - started)


class Summariser:
    """Summarises captures' written files on one worker thread (one file at a time per agent)."""

    def __init__(self, trace_dir: TraceDir, hostname: str) -> None:
        self.trace_dir = trace_dir
        self.hostname = hostname
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="trace-summary")
        self._queued: set[tuple[str, str]] = set()

    def schedule(self, capture: Capture, may_read: Callable[[str], bool]) -> None:
        """Queue each written file of ``capture`` that the caller ``may_read``, has no summary and is not queued."""
        loop = asyncio.get_running_loop()
        for target in capture.targets:
            key = (capture.capture_id, target.file)
            if target.state != WRITTEN or target.file in capture.summaries or key in self._queued \
                    or not may_read(target.file):
                continue
            self._queued.add(key)
            future = loop.run_in_executor(self._pool, self._summarise, capture, target)
            future.add_done_callback(functools.partial(self._forget, key))

    def _forget(self, key: tuple[str, str], _: object) -> None:
        self._queued.discard(key)

    def _summarise(self, capture: Capture, target: Target) -> None:
        try:
            summary = summarise_file(self.trace_dir, target.file, self.hostname, target.pid, target.rank,
                                     capture.summary_steps)
        except Exception as exc:  # a bug here must not leave the capture waiting for this summary forever
            log.exception("trace summary failed", extra={"capture_id": capture.capture_id, "file": target.file})
            summary = pb.RankTraceSummary(error=f"the agent failed to summarise it ({type(exc).__name__}); "
                                                "see the agent's log, or fetch the file and run tuiprof analyze")
        capture.summaries[target.file] = summary
        log.info("trace summarised", extra={"capture_id": capture.capture_id, "file": target.file,
                                              "seconds": round(summary.seconds, 3), "error": summary.error or None})

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
