"""A Chrome trace's events in batches, read in pieces: never the whole file in memory.

The file is ``{…, "traceEvents": [event, event, …], …}``. What precedes the
array (schemaVersion, distributedInfo, …) and what follows it (traceName,
``baseTimeNanoseconds`` in mid-2024 Kineto) are decoded on their own; the
array is cut into batches of about ``BATCH_BYTES`` at a ``}`` followed by
``,`` and ``{`` — a cut is kept only when the batch before it decodes as a
list of events, so a ``}, {`` inside a string or a nested list never splits an
event (the cut moves to an earlier candidate, or the batch grows).

Other users write these files and the agent reads them as root, for everyone, so
what one file can cost is bounded: a stretch of the array with no place to cut
(one event) longer than ``MAX_EVENT_BYTES`` is refused, and the buffer is joined
and searched again only once another batch's bytes have come (linear in the
file, however long the stretch without a cut).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import msgspec

from agentd.traces.analysis.extract import Event, TraceFile
from agentd.traces.analysis.process_groups import ProcessGroup, process_groups

BATCH_BYTES = 4 << 20
# Bytes before the event array (metadata, distributedInfo with its process groups) we look through.
MAX_HEAD_BYTES = 64 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_CUT = re.compile(rb"\}\s*,\s*\{")
# The most bytes one event may take (more exactly: a stretch of the event array with no boundary between
# events). Kineto's events are a few hundred bytes, the largest (long Python stacks in args) a few KiB; a
# stretch past this is a file made to be buffered whole, refused rather than held.
MAX_EVENT_BYTES = 16 << 20
# The bytes of the buffer searched again for the events key when a piece comes (it may span the two pieces).
_KEY_OVERLAP = 4096
_CUTS_TRIED = 8
_TAIL_BYTES = 64 << 10

_decode_events = msgspec.json.Decoder(list[Event]).decode
_decode_file = msgspec.json.Decoder(TraceFile).decode


class TraceStreamError(ValueError):
    """Not a Chrome trace: the message says what is wrong."""


@dataclass
class TraceFacts:
    """What the file says outside its events."""

    base_time_ns: int = 0
    rank: int | None = None
    groups: list[ProcessGroup] = field(default_factory=list)  # its process groups, in the order it made them


def event_batches(chunks: Iterable[bytes], facts: TraceFacts) -> Iterator[list[Event]]:
    """The trace's events, batch by batch, in file order; ``facts`` is filled once the last batch is out."""
    pieces = iter(chunks)
    buffer = bytearray()
    searched = 0  # the buffer before this holds no events key (but for its last _KEY_OVERLAP bytes)
    while (start := _EVENTS_KEY.search(buffer, max(0, searched - _KEY_OVERLAP))) is None:
        if len(buffer) > MAX_HEAD_BYTES:
            raise TraceStreamError(f"not a Kineto/Chrome trace (no \"traceEvents\" array in the first "
                                   f"{MAX_HEAD_BYTES >> 20} MiB)")
        piece = next(pieces, None)
        if piece is None:
            raise TraceStreamError("not a Kineto/Chrome trace (no \"traceEvents\" array)")
        searched = len(buffer)
        buffer += piece
    head = _decode(_decode_file, bytes(buffer[:start.start()]) + b'"traceEvents":[]}')
    # Pieces are joined once per batch (appending each to the buffer copied it again for every piece), and
    # after a join that found no cut, only once another batch's bytes have come.
    waiting, size = [bytes(buffer[start.end():])], len(buffer) - start.end()
    del buffer
    cut_at = BATCH_BYTES
    for piece in pieces:
        waiting.append(piece)
        size += len(piece)
        if size < cut_at:
            continue
        batch, rest = _cut(b"".join(waiting))
        waiting, size = [rest], len(rest)
        if batch:
            cut_at = BATCH_BYTES
            yield batch
        elif size > MAX_EVENT_BYTES:
            raise TraceStreamError(f"not a trace the agent reads: {size >> 20} MiB of its event array hold no "
                                   f"boundary between events (one event may take at most "
                                   f"{MAX_EVENT_BYTES >> 20} MiB)")
        else:
            cut_at = size + BATCH_BYTES
    tail = _decode(_decode_file, b'{"traceEvents":[' + b"".join(waiting))
    yield tail.traceEvents
    facts.base_time_ns = head.baseTimeNanoseconds or tail.baseTimeNanoseconds
    for part in (head, tail):
        if part.distributedInfo is not None:
            if part.distributedInfo.rank is not None:
                facts.rank = part.distributedInfo.rank
            facts.groups = process_groups(part.distributedInfo.pg_config) or facts.groups


def _cut(buffer: bytes) -> tuple[list[Event], bytes]:
    """The whole events at the start of ``buffer`` and the rest (no events: the buffer grows)."""
    for end in reversed(_candidates(buffer)):
        try:
            events = _decode_events(b"[" + buffer[:end] + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        rest = buffer[end:].lstrip()
        return events, rest[1:]  # past the comma
    return [], buffer


def _candidates(buffer: bytes) -> list[int]:
    """Where a batch may end: just past the last ``_CUTS_TRIED`` ``}``s that ``, {`` follows in the buffer's
    last ``BATCH_BYTES // 2``. Looked for in the last ``_TAIL_BYTES`` first: hundreds of events end there."""
    lowest = max(0, len(buffer) - BATCH_BYTES // 2)
    tail = max(lowest, len(buffer) - _TAIL_BYTES)
    found = [match.start() + 1 for match in _CUT.finditer(buffer, tail)]
    if len(found) < _CUTS_TRIED and tail > lowest:
        found = [match.start() + 1 for match in _CUT.finditer(buffer, lowest)]
    return found[-_CUTS_TRIED:]


def _decode(decode: Callable[[bytes], TraceFile], data: bytes) -> TraceFile:
    try:
        return decode(data)
    except msgspec.ValidationError as exc:
        raise TraceStreamError(f"not a Kineto/Chrome trace ({exc})") from None
    except msgspec.DecodeError as exc:
        raise TraceStreamError(f"not JSON ({exc})") from None
