"""The segment reader against bad files and against a writer that is busy."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from native.segment_forge import forged, recorded_segment
from native.support import segment_path, tuiprof_run
from tuiprof_native import segment


def write_copy(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def valid_bytes() -> bytes:
    """A real segment's bytes (a process that records one step)."""
    return recorded_segment()


def test_valid_copy_reads(tmp_path, valid_bytes):
    with segment.Segment(write_copy(tmp_path, "tuiprof-0-1", valid_bytes)) as seg:
        assert seg.header().counters.step_count == 1


def test_foreign_file_is_a_format_error_naming_the_path(tmp_path):
    path = write_copy(tmp_path, "tuiprof-0-2", os.urandom(segment.SEGMENT_SIZE))
    with pytest.raises(segment.SegmentFormatError, match=f"{path} is not a tuiprof segment"):
        segment.Segment(path)


def test_truncated_segment(tmp_path, valid_bytes):
    short = write_copy(tmp_path, "tuiprof-0-3", valid_bytes[: len(valid_bytes) // 2])
    with pytest.raises(segment.SegmentFormatError, match="truncated"):
        segment.Segment(short)
    tiny = write_copy(tmp_path, "tuiprof-0-4", valid_bytes[:100])
    with pytest.raises(segment.SegmentFormatError, match="smaller than a tuiprof segment header"):
        segment.Segment(tiny)


def test_other_layout_version(tmp_path, valid_bytes):
    data = bytearray(valid_bytes)
    struct.pack_into("<I", data, 8, segment.LAYOUT_VERSION + 1)
    with pytest.raises(segment.SegmentFormatError, match="layout version"):
        segment.Segment(write_copy(tmp_path, "tuiprof-0-5", bytes(data)))


def test_segment_still_being_created(tmp_path, valid_bytes):
    data = bytearray(valid_bytes)
    data[0:8] = bytes(8)
    with pytest.raises(segment.SegmentNotReadyError, match="not finished creating"):
        segment.Segment(write_copy(tmp_path, "tuiprof-0-6", bytes(data)))


def test_missing_file(tmp_path):
    with pytest.raises(segment.SegmentError, match="cannot open segment"):
        segment.Segment(tmp_path / "tuiprof-0-7")


def test_a_fifo_or_a_link_is_refused_without_blocking(tmp_path, valid_bytes):
    os.mkfifo(tmp_path / "tuiprof-0-8")  # no writer: a blocking open would never return
    with pytest.raises(segment.SegmentFormatError, match="not a regular file"):
        segment.Segment(tmp_path / "tuiprof-0-8")
    real = write_copy(tmp_path, "real", valid_bytes)
    (tmp_path / "tuiprof-0-9").symlink_to(real)
    with pytest.raises(segment.SegmentFormatError, match="symbolic link"):
        segment.Segment(tmp_path / "tuiprof-0-9")


def test_a_record_left_mid_update_is_a_busy_error_not_a_wait(tmp_path, valid_bytes):
    path = write_copy(tmp_path, "tuiprof-0-10", forged(valid_bytes, 10, counters_seq=5))
    with segment.Segment(path) as seg:
        assert seg.claimant()[0] == 10  # who it claims to be stays readable
        started = time.monotonic()
        with pytest.raises(segment.SegmentBusyError, match="stayed mid-update"):
            seg.header()
        assert time.monotonic() - started < 0.5
        path.write_bytes(forged(valid_bytes, 10, counters_seq=6))  # the writer finished
        assert seg.header().counters.step_count == 1


def test_a_segment_cut_after_it_was_opened(tmp_path, valid_bytes):
    path = write_copy(tmp_path, "tuiprof-0-11", valid_bytes)
    with segment.Segment(path) as seg:
        os.truncate(path, 4096)
        with pytest.raises(segment.SegmentFormatError, match="truncated"):
            seg.slots()


def test_names_parse_within_range():
    random = "0123456789abcdef"
    assert segment.parse_name(f"tuiprof-1000-42-{random}") == (1000, 42, False)  # the hook's names
    assert segment.parse_name(f"tuiprof-0-7-{random}{segment.INERT_SUFFIX}") == (0, 7, True)
    assert segment.parse_name("tuiprof-1000-42") == (1000, 42, False)  # an earlier hook's (same layout)
    assert segment.parse_name(f"tuiprof-0-7{segment.INERT_SUFFIX}") == (0, 7, True)
    for name in (f"tuiprof-0-{2**31}", "tuiprof-0-0", f"tuiprof-{2**32 - 1}-5", "tuiprof-0-5.exception",
                 "tuiprof-0-" + "9" * 40, "tuiprof--1-5", f"tuiprof-0-5-{random}{segment.EXCEPTION_SUFFIX}",
                 f"tuiprof-0-5-{random.upper()}", f"tuiprof-0-5-{random[1:]}", f"tuiprof-0-5-{random}0",
                 f"tuiprof-0-5-{random}-{random}"):
        assert segment.parse_name(name) is None, name


def test_discover_finds_only_segment_names(tmp_path, valid_bytes):
    write_copy(tmp_path, "tuiprof-1000-42", valid_bytes)
    write_copy(tmp_path, "tuiprof-x-1", b"")
    write_copy(tmp_path, "other", b"")
    assert segment.discover(str(tmp_path)) == [segment.SegmentFile(str(tmp_path / "tuiprof-1000-42"), 1000, 42)]


BUSY = textwrap.dedent("""
    import ctypes, os, sys, time
    lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
    lib.tuiprof_record_gc.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    lib.tuiprof_record_step()
    print("started", flush=True)
    t = time.time_ns()
    for i in range(200000):
        lib.tuiprof_record_gc(t, t + 1000)  # every GC pause is exactly 1 us
    lib.tuiprof_flush.argtypes = [ctypes.c_int]
    lib.tuiprof_flush(5000)
    print("done", flush=True)
    sys.stdin.readline()
""")


def test_reads_are_consistent_while_the_writer_is_busy(cleanup_segments):
    proc = tuiprof_run(sys.executable, "-c", BUSY, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    cleanup_segments.append(proc.pid)
    assert proc.stdout.readline().strip() == "started"
    seg = segment.Segment(segment_path(proc.pid))  # the first step created it before "started"
    reads = 0
    last = 0
    try:
        while proc.poll() is None and reads < 3000:
            c = seg.header().counters
            # counters are copied under their sequence lock: count and total always agree
            assert c.gc_pause_total_ns == c.gc_count * 1000
            assert c.gc_count >= last
            last = c.gc_count
            events = seg.events(since=max(0, seg.header().ring_head - 64))
            assert all(e.kind == "gc" and e.end_ns - e.start_ns == 1000 for e in events if e.kind != "step")
            assert [e.index for e in events] == sorted(e.index for e in events)
            reads += 1
        assert proc.stdout.readline().strip() == "done"
        header = seg.header()
        c = header.counters
        assert c.gc_count + c.dropped_records == 200000
        # the ring kept the newest entries only: the last RING_CAPACITY indices, in order
        ring = seg.events()
        assert header.ring_head == 1 + c.gc_count  # one step, then the GC pauses
        assert [e.index for e in ring] == list(range(header.ring_head - segment.RING_CAPACITY, header.ring_head))
    finally:
        seg.close()
        proc.communicate("\n", timeout=10)


STEP_ON_EACH_LINE = textwrap.dedent("""
    import ctypes, os, sys
    lib = ctypes.CDLL(os.environ["TUIPROF_HOOK_LIBRARY"])
    for line in sys.stdin:
        lib.tuiprof_record_step()
        lib.tuiprof_flush(1000)
        print("stepped", flush=True)
""")


def test_data_seq_moves_with_the_figures_and_not_with_heartbeats(cleanup_segments):
    """The hook bumps the header's data_seq after a pass that wrote (a step here), never for a heartbeat
    alone: what lets the agent leave a rank that did nothing unread (agentd.collectors.ranks)."""
    proc = tuiprof_run(sys.executable, "-c", STEP_ON_EACH_LINE, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    cleanup_segments.append(proc.pid)
    try:
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "stepped\n"
        with segment.Segment(segment_path(proc.pid)) as seg:
            assert seg.tells_changes
            time.sleep(0.2)  # the writer's last pass after the step is done
            before = seg.pulse()
            time.sleep(0.3)  # heartbeats, nothing else
            idle = seg.pulse()
            assert idle.heartbeat_ns > before.heartbeat_ns and idle.data_seq == before.data_seq
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "stepped\n"
            after = seg.pulse()
            assert after.data_seq > idle.data_seq and seg.header().counters.step_count == 2
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_a_segment_of_the_layout_before_data_seq_reads_without_it(tmp_path, valid_bytes):
    data = bytearray(valid_bytes)
    struct.pack_into("<I", data, 8, segment.LAYOUT_VERSION_NO_DATA_SEQ)
    with segment.Segment(write_copy(tmp_path, "tuiprof-0-9", bytes(data))) as seg:
        assert not seg.tells_changes and seg.pulse().data_seq is None
        assert seg.header().counters.step_count == 1
