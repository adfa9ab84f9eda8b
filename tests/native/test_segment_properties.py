"""Property tests of the segment reader: whatever bytes a file holds, however it is cut,
even while it is open, reading it never crashes the process (no SIGBUS, no endless
seqlock loop) and only ever raises the reader's typed errors."""

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from native.segment_forge import recorded_segment
from tuiprof_native import segment

TYPED = (segment.SegmentFormatError, segment.SegmentNotReadyError, segment.SegmentBusyError)
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def valid_bytes() -> bytes:
    return recorded_segment()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("segments")


def read_everything(seg: segment.Segment) -> None:
    seg.claimant()
    seg.header()
    seg.slots()
    seg.inflight()
    seg.events()


def open_and_read(path: pathlib.Path) -> None:
    """Read every part of ``path``; a typed error is an answer, anything else fails the test."""
    try:
        with segment.Segment(path) as seg:
            read_everything(seg)
    except TYPED:
        pass


# Patches: where (anywhere, but mostly in the header and the first records) and what.
patches = st.lists(st.tuples(st.one_of(st.integers(0, 1024), st.integers(0, segment.SEGMENT_SIZE - 1)),
                             st.binary(min_size=1, max_size=16)), max_size=12)


@PROPERTY_SETTINGS
@given(data=st.binary(max_size=4096))
def test_random_small_files(folder, data):
    path = folder / "small"
    path.write_bytes(data)
    open_and_read(path)


@PROPERTY_SETTINGS
@given(edits=patches, length=st.one_of(st.just(None), st.integers(0, segment.SEGMENT_SIZE + 64)))
def test_edited_and_cut_segments(folder, valid_bytes, edits, length):
    data = bytearray(valid_bytes)
    for offset, chunk in edits:
        data[offset:offset + len(chunk)] = chunk[: len(data) - offset]
    path = folder / "edited"
    path.write_bytes(bytes(data[:length] if length is not None else data))
    open_and_read(path)


@PROPERTY_SETTINGS
@given(edits=patches, length=st.integers(0, segment.SEGMENT_SIZE - 1))
def test_segments_cut_while_open(folder, valid_bytes, edits, length):
    """Opened whole, then edited in place and truncated under the reader (a mapped reader dies of SIGBUS)."""
    path = folder / "cut"
    path.write_bytes(valid_bytes)
    with segment.Segment(path) as seg:
        with open(path, "r+b", buffering=0) as f:  # unbuffered: nothing written after the cut
            for offset, chunk in edits:
                f.seek(offset)
                f.write(chunk)
            os.ftruncate(f.fileno(), length)
        try:
            read_everything(seg)
        except TYPED:
            pass
        else:
            raise AssertionError(f"a segment cut to {length} bytes read as whole")
