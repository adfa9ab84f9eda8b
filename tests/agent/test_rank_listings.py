"""A segment folder is listed again only when it may have changed (``rank_claims.FolderListings``).

Real files in private folders on /dev/shm (tmpfs, as the ranks' own), scanned as the agent's own folder
(by path) and as a container's (through an open descriptor, ``/proc/self/fd/<fd>``). A listing that is
reused gives the very same Candidate objects; a fresh one makes new ones (nothing is ``followed`` here).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest

from agentd.collectors import rank_claims
from agentd.collectors.rank_claims import Candidate, FolderListings
from agentd.collectors.rank_places import SegmentFolder
from tuiprof_native import segment

SETTLED_S = 2 * rank_claims.RACY_MARGIN_NS / 1e9  # long enough for a folder's last change to be no longer racy
COARSE_TICK_NS = 10_000_000  # a kernel whose file times come from a 10 ms clock tick


@pytest.fixture
def make_folder() -> Iterator:
    """Make private folders on the segments' tmpfs: ``make_folder(through_fd)`` gives (its path, the
    SegmentFolder the scan reads it as). All removed at the end."""
    made: list[tuple[pathlib.Path, SegmentFolder]] = []

    def make(through_fd: bool = False) -> tuple[pathlib.Path, SegmentFolder]:
        path = pathlib.Path(tempfile.mkdtemp(dir=segment.SEGMENT_DIR))
        if through_fd:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            folder = SegmentFolder(f"/proc/self/fd/{fd}", f"{path} (as a container's)", own=False, fd=fd)
        else:
            folder = SegmentFolder(str(path), str(path), own=True)
        made.append((path, folder))
        return path, folder

    yield make
    for path, folder in made:
        folder.close()
        shutil.rmtree(path)


def claim(path: pathlib.Path, pid: int) -> None:
    """A file named as a claim of ``pid`` by this test's user (its contents are not looked at here)."""
    (path / f"{segment.SEGMENT_PREFIX}{os.getuid()}-{pid}").touch()


def by_pid(candidates: list[Candidate]) -> dict[int, Candidate]:
    return {c.pid: c for c in candidates}


def test_an_unchanged_folder_gives_its_last_listing_again(make_folder):
    own_path, own = make_folder()
    container_path, container = make_folder(through_fd=True)
    for path in (own_path, container_path):
        claim(path, 100)
        claim(path, 101)
        (path / f"{segment.SEGMENT_PREFIX}{os.getuid()}-101{segment.EXCEPTION_SUFFIX}").touch()
        claim(path, 2**40)  # a pid beyond pid_max: refused by name
    time.sleep(SETTLED_S)
    listings = FolderListings()
    first = listings.scan([own, container], segment, {})
    second = listings.scan([own, container], segment, {})
    assert [c.path for c in first.candidates] == [str(own_path / f"tuiprof-{os.getuid()}-{pid}") for pid in (100, 101)] \
        + [f"{container.path}/tuiprof-{os.getuid()}-{pid}" for pid in (100, 101)]
    assert all(again is before for again, before in zip(second.candidates, first.candidates, strict=True))
    assert second.side_files == first.side_files and len(first.side_files) == 2
    assert second.refused == first.refused == {rank_claims.BAD_NAME: 2}


def test_a_reused_listing_still_puts_followed_files_first_within_the_cap(make_folder, monkeypatch):
    monkeypatch.setattr(rank_claims, "MAX_FILES_PER_OWNER", 2)
    path, folder = make_folder()
    claim(path, 102)
    time.sleep(SETTLED_S)
    listings = FolderListings()
    [followed] = listings.scan([folder], segment, {}).candidates  # the collector follows it from now on
    claim(path, 100)
    claim(path, 101)
    time.sleep(SETTLED_S)
    listed = listings.scan([folder], segment, {followed.path: followed})
    reused = listings.scan([folder], segment, {followed.path: followed})
    assert [c.pid for c in reused.candidates] == [102, 100] and reused.candidates[0] is followed
    assert all(again is before for again, before in zip(reused.candidates, listed.candidates, strict=True))
    assert reused.over_cap == {os.getuid(): 1} and reused.refused == {rank_claims.OVER_CAP: 1}
    assert [c.pid for c in listings.scan([folder], segment, {}).candidates] == [100, 101]  # no longer followed


def test_a_file_made_in_the_same_clock_tick_as_the_listing_shows_next_time(make_folder, monkeypatch):
    """On a kernel whose file times come from a coarse clock tick, a file made right after a listing, in the
    tick of the folder's last change, leaves the folder's times as they were: that listing was racy, and is
    not reused. (This test's kernel may give fine times after a stat; the folder's times are taken to the
    tick here, as a coarse kernel's are.)"""
    path, folder = make_folder()
    folder_times = rank_claims._folder_times

    def coarse_times(folder: SegmentFolder) -> tuple[int, int, int, int]:
        device, inode, mtime, ctime = folder_times(folder)
        return device, inode, mtime - mtime % COARSE_TICK_NS, ctime - ctime % COARSE_TICK_NS

    monkeypatch.setattr(rank_claims, "_folder_times", coarse_times)
    for attempt in range(100):  # until the file is made within the tick of the folder's change before it
        claim(path, 1000 + 2 * attempt)
        listings = FolderListings()
        listings.scan([folder], segment, {})
        before = coarse_times(folder)
        claim(path, 1000 + 2 * attempt + 1)
        if coarse_times(folder) == before:
            break
    else:
        pytest.fail("no file was made in the same clock tick as the folder's change before it")
    assert 1000 + 2 * attempt + 1 in by_pid(listings.scan([folder], segment, {}).candidates)


def test_a_file_made_after_a_settled_listing_shows_next_time(make_folder):
    path, folder = make_folder()
    claim(path, 100)
    time.sleep(SETTLED_S)
    listings = FolderListings()
    assert set(by_pid(listings.scan([folder], segment, {}).candidates)) == {100}
    claim(path, 101)
    assert set(by_pid(listings.scan([folder], segment, {}).candidates)) == {100, 101}


def test_a_renamed_or_removed_file_is_gone_from_the_next_listing(make_folder):
    path, folder = make_folder()
    for pid in (100, 101, 102):
        claim(path, pid)
    time.sleep(SETTLED_S)
    listings = FolderListings()
    assert set(by_pid(listings.scan([folder], segment, {}).candidates)) == {100, 101, 102}
    (path / f"tuiprof-{os.getuid()}-100").rename(path / "elsewhere")
    (path / f"tuiprof-{os.getuid()}-101").unlink()
    assert set(by_pid(listings.scan([folder], segment, {}).candidates)) == {102}


def test_a_folder_no_longer_scanned_is_forgotten(make_folder):
    kept_path, kept = make_folder()
    gone_path, gone = make_folder(through_fd=True)
    claim(kept_path, 100)
    claim(gone_path, 200)
    time.sleep(SETTLED_S)
    listings = FolderListings()
    first = by_pid(listings.scan([kept, gone], segment, {}).candidates)
    listings.scan([kept], segment, {})
    again = by_pid(listings.scan([kept, gone], segment, {}).candidates)
    assert again[100] is first[100]
    assert again[200] is not first[200] and again[200] == first[200]  # listed anew: its last listing was dropped
