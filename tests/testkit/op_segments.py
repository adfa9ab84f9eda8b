"""Segments full of ops: a real segment's header with its slot table filled, as any user can write one.

``with_ops`` turns a segment the hook wrote (``native.segment_forge.recorded_segment``)
into one claiming ``ops`` distinct GEMM aggregates; ``PUBLISH`` is the program a
user runs to publish such segments for processes of their own (``sleep``s it
starts), the way one user made the agent report 130k ops (issue 24 item 4).
Offsets are those of ``tp_header`` and ``tp_slot`` in tuiprof_segment.h;
``check_ops`` reads the result back with the agent's own reader, so a layout
change fails there first.
"""

from __future__ import annotations

import os
import pathlib
import struct
import tempfile
import time

from native.segment_forge import PID_OFFSET, START_NS_OFFSET
from tuiprof_native import segment

SLOT_SIZE_OFFSET = 24       # tp_header.slot_size
SLOTS_USED_OFFSET = 224     # tp_header.slots_used
MAX_SLOTS = 512             # TP_MAX_SLOTS; the last one is the overflow slot
KIND_GEMM = 1
# Inside one tp_slot:
SLOT_KIND, SLOT_OP, SLOT_DTYPE, SLOT_M, SLOT_COUNT = 8, 16, 48, 96, 128
MAX_OPS_PER_SEGMENT = MAX_SLOTS - 1


def write_claim(path: pathlib.Path, prefix: bytes, pid: int) -> None:
    """A segment at ``path`` made of ``prefix`` (``with_ops``' bytes) claiming process ``pid``, started now
    (after the process: start it first), readable by its owner only; the rest of the segment a hole."""
    data = bytearray(prefix)
    struct.pack_into("<i", data, PID_OFFSET, pid)
    struct.pack_into("<Q", data, START_NS_OFFSET, time.time_ns())
    with path.open("wb") as out:
        out.write(data)
        out.truncate(segment.SEGMENT_SIZE)
    path.chmod(0o600)


def with_ops(data: bytes, ops: int, op: bytes = b"cublasGemmEx") -> bytes:
    """The header and slot table of ``data`` (a real segment) claiming ``ops`` GEMM slots named ``op``, each
    of its own shape (m = 1, 2, ...), called once; the rest of the segment is left out (a hole)."""
    assert 0 < ops <= MAX_OPS_PER_SEGMENT, ops
    slot_size = struct.unpack_from("<I", data, SLOT_SIZE_OFFSET)[0]
    out = bytearray(data[:segment.SLOTS_OFFSET + MAX_SLOTS * slot_size])
    struct.pack_into("<I", out, SLOTS_USED_OFFSET, ops)
    for i in range(ops):
        slot = segment.SLOTS_OFFSET + i * slot_size
        struct.pack_into("<I", out, slot + SLOT_KIND, KIND_GEMM)
        struct.pack_into("32s", out, slot + SLOT_OP, op)
        struct.pack_into("16s", out, slot + SLOT_DTYPE, b"fp32")
        struct.pack_into("<q", out, slot + SLOT_M, i + 1)
        struct.pack_into("<Q", out, slot + SLOT_COUNT, 1)
    return bytes(out)


def check_ops(prefix: bytes, ops: int) -> None:
    """``prefix`` (from ``with_ops``) read back as a whole segment holds ``ops`` slots as written."""
    with tempfile.NamedTemporaryFile(dir=segment.SEGMENT_DIR) as file:
        file.write(prefix)
        file.flush()
        os.ftruncate(file.fileno(), segment.SEGMENT_SIZE)
        read = segment.Segment(file.name)
        try:
            slots = read.slots()
        finally:
            read.close()
    assert len(slots) == ops, f"{len(slots)} slots read back, {ops} written: tp_slot moved, update the offsets"
    assert (slots[-1].kind, slots[-1].op, slots[-1].m, slots[-1].count) == ("gemm", "cublasGemmEx", ops, 1), slots[-1]


# Run as a user: argv[1] a file holding with_ops' bytes, argv[2] how many segments. Starts that many
# `sleep`s, gives each a segment named as the hook names it (a random stem) and claiming it (pid and
# start time patched in; sparse: the header and slots written, the rest a hole), prints their pids as
# one JSON line, and keeps them until stdin closes.
PUBLISH = f"PID_OFFSET, START_NS_OFFSET = {PID_OFFSET}, {START_NS_OFFSET}\n" + """
import json, os, struct, subprocess, sys, time
prefix, count = open(sys.argv[1], "rb").read(), int(sys.argv[2])
from tuiprof_native import segment
sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
time.sleep(0.05)  # each sleep has started: its start time is before the segment's
for proc in sleepers:
    data = bytearray(prefix)
    struct.pack_into("<i", data, PID_OFFSET, proc.pid)
    struct.pack_into("<Q", data, START_NS_OFFSET, time.time_ns())
    path = f"{segment.SEGMENT_DIR}/{segment.SEGMENT_PREFIX}{os.getuid()}-{proc.pid}-{os.urandom(segment.STEM_RANDOM_DIGITS // 2).hex()}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    assert os.write(fd, data) == len(data), f"{path}: a short write (is {segment.SEGMENT_DIR} full?)"
    os.ftruncate(fd, segment.SEGMENT_SIZE)
    os.close(fd)
print(json.dumps([proc.pid for proc in sleepers]), flush=True)
sys.stdin.read()
for proc in sleepers:
    proc.kill()
"""
