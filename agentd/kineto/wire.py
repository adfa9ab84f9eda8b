"""libkineto's IPC-fabric framing: one datagram = a 40-byte header + payload.

Header: ``u64 size`` (payload bytes, little endian) then ``char type[32]``
(NUL padded). Payloads: ``ctxt`` = (int32 gpu, int32 pid, int64 job id);
``req`` = (int32 type bitmask, int32 n, int64 job id, int32 pids[n]) where
pids are the sender's own pid then its ancestors. Replies reuse the header:
a ``req`` reply carries the raw config text (empty when nothing is pending),
a ``ctxt`` reply one int32. Layout verified against real PyTorch in
shared/research/dynolog.md §1.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct("<Q32s")
CONTEXT = struct.Struct("<iiq")
REQUEST_HEAD = struct.Struct("<iiq")
HEADER_SIZE = HEADER.size  # 40
MAX_PIDS = 64  # libkineto sends at most 11; more is garbage

# Bits of a poll's type field: 1 asks for event profiler configs (which the agent serves none of), 2 for
# activity (trace) configs.
WANTS_ACTIVITIES = 2


class FrameError(ValueError):
    """A datagram that is not a valid IPC-fabric message.

    ``cause`` is a short stable key ("truncated", "size-mismatch", ...) used to
    rate-limit the log line per cause.
    """

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class ContextMessage:
    gpu: int
    pid: int
    job_id: int


@dataclass(frozen=True)
class PollMessage:
    wants: int
    job_id: int
    pids: tuple[int, ...]

    @property
    def wants_activities(self) -> bool:
        return bool(self.wants & WANTS_ACTIVITIES)


def parse(datagram: bytes) -> ContextMessage | PollMessage:
    """Decode one datagram, or raise FrameError saying what is wrong with it."""
    if len(datagram) < HEADER_SIZE:
        raise FrameError("truncated", f"datagram of {len(datagram)} bytes is shorter than the 40-byte header")
    size, raw_type = HEADER.unpack_from(datagram)
    payload = datagram[HEADER_SIZE:]
    if size != len(payload):
        raise FrameError(
            "size-mismatch", f"header says {size} payload bytes but the datagram carries {len(payload)}"
        )
    kind = raw_type.split(b"\0", 1)[0]
    if kind == b"ctxt":
        if size != CONTEXT.size:
            raise FrameError("bad-ctxt", f"ctxt payload must be {CONTEXT.size} bytes, got {size}")
        return ContextMessage(*CONTEXT.unpack(payload))
    if kind == b"req":
        if size < REQUEST_HEAD.size:
            raise FrameError("bad-req", f"req payload of {size} bytes is shorter than its 16-byte head")
        wants, count, job_id = REQUEST_HEAD.unpack_from(payload)
        if not 0 < count <= MAX_PIDS:
            raise FrameError("bad-req", f"req names {count} pids; expected 1-{MAX_PIDS}")
        if size != REQUEST_HEAD.size + 4 * count:
            raise FrameError(
                "bad-req", f"req with {count} pids must be {REQUEST_HEAD.size + 4 * count} bytes, got {size}"
            )
        pids = struct.unpack_from(f"<{count}i", payload, REQUEST_HEAD.size)
        return PollMessage(wants, job_id, pids)
    raise FrameError("unknown-type", f"unknown message type {kind[:32]!r}")


def encode(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), kind) + payload


def poll_reply(config: str) -> bytes:
    """A ``req`` reply: the config text, or a bare header when nothing is pending."""
    return encode(b"req", config.encode())


def context_reply(count: int) -> bytes:
    return encode(b"ctxt", struct.pack("<i", count))


def poll_request(wants: int, job_id: int, pids: tuple[int, ...]) -> bytes:
    """What libkineto sends (used by tests and the bench to play a client)."""
    return encode(b"req", REQUEST_HEAD.pack(wants, len(pids), job_id) + struct.pack(f"<{len(pids)}i", *pids))


def context_request(gpu: int, pid: int, job_id: int) -> bytes:
    return encode(b"ctxt", CONTEXT.pack(gpu, pid, job_id))
