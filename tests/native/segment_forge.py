"""Real segment bytes, and hostile edits of them (what a local user can write into /dev/shm).

Offsets are those of ``tp_header`` in tuiprof_segment.h; ``recorded_segment`` checks them
against a segment the real hook wrote, so a layout change fails here first.
"""

from __future__ import annotations

import os
import pathlib
import struct
import sys
import time

from native.support import remove_rank_files, segment_path, tuiprof_run

PID_OFFSET = 56
START_NS_OFFSET = 200
COUNTERS_SEQ_OFFSET = 240
STEP_COUNT_OFFSET = 248

RECORD_ONE_STEP = ("import ctypes, os; lib = ctypes.CDLL(os.environ['TUIPROF_HOOK_LIBRARY']); "
                   "lib.tuiprof_record_step()")


def recorded_segment() -> bytes:
    """The segment of a real process that recorded one step (its files are removed)."""
    proc = tuiprof_run(sys.executable, "-c", RECORD_ONE_STEP)
    assert proc.wait(timeout=60) == 0
    path = segment_path(proc.pid)
    try:
        data = path.read_bytes()
    finally:
        remove_rank_files(proc.pid)
    assert struct.unpack_from("<i", data, PID_OFFSET)[0] == proc.pid, "tp_header.pid moved: update the offsets"
    assert struct.unpack_from("<QQ", data, COUNTERS_SEQ_OFFSET) == (2, 1), "tp_counters moved: update the offsets"
    assert abs(struct.unpack_from("<Q", data, START_NS_OFFSET)[0] - time.time_ns()) < 60e9
    return data


def forged(data: bytes, pid: int, start_ns: int | None = None, counters_seq: int | None = None) -> bytes:
    """``data`` claiming another ``pid`` (started at ``start_ns``, default now), its counters'
    sequence number optionally set (odd: a writer killed mid-update)."""
    out = bytearray(data)
    struct.pack_into("<i", out, PID_OFFSET, pid)
    struct.pack_into("<Q", out, START_NS_OFFSET, time.time_ns() if start_ns is None else start_ns)
    if counters_seq is not None:
        struct.pack_into("<Q", out, COUNTERS_SEQ_OFFSET, counters_seq)
    return bytes(out)


def plant(directory: pathlib.Path, name: str, data: bytes, owner: tuple[int, int] | None = None) -> pathlib.Path:
    """Write ``data`` as ``directory/name``, owned by ``owner`` (uid, gid; default: this process's user),
    mode 0600 like the hook's."""
    path = directory / name
    path.write_bytes(data)
    os.chmod(path, 0o600)
    if owner is not None:
        os.chown(path, *owner)
    return path
