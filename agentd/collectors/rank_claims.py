"""Rank segment files are claims; what the kernel says decides.

Anyone can write ``/dev/shm``. A file named ``tuiprof-<uid>-<pid>-<random>`` claims
"process <pid>, running as <uid>, made me" — and the agent runs as root and
later dumps the stacks of the processes it reports as ranks. So a segment (or
an inert hook's ``.inert`` note) is believed only when:

- its name parses, both numbers in range, the pid below the kernel's pid_max;
- the name's pid and uid place it (``rank_places``): in a container's ``/dev/shm`` they are
  the pid and uid the process sees, and must belong to a process of that container, whose
  host pid and host uid stand for them below;
- it is a regular file owned by that uid;
- the pid in its header is the pid in its name (segments);
- process <pid>, when alive and started no later than the segment (a later
  process under a reused pid is another one), runs with that real uid.

A claim about a process that is gone is about the past (the rank exited); it
never makes the process a target. The hook draws the ``<random>`` part of its
names from getrandom, so no one can take a rank's names ahead of it; which
files are a process's is found by listing the directory (any number of claims
per pid may exist, each judged on its own: ``ranks`` reports one segment per
process). Anything else is refused: skipped, counted
per reason, logged once per file (rate-limited), never reported.

The directory is scanned with one ``lstat`` per name; at most
``MAX_FILES_PER_OWNER`` files of one owner in one folder are considered (each container's
``/dev/shm`` is a folder: pods commonly all run as root), so one user's junk
costs a bounded amount of work and never crowds out another user's ranks.

A folder is listed again only when it may have changed (``FolderListings``: issue 28's cost, 200
containers' folders every interval): its own ``stat`` (device, inode, modification and change
times) is taken before the listing, and while it is what it was then, the last listing stands,
its Candidates the very same objects (the ranks collector reads that as "the file is as it was").
Creating, removing or renaming a name changes the folder's times; a listing taken within
``RACY_MARGIN_NS`` of the folder's last change is not reused (git's racy index entries), so a name
made later in the same clock tick is not missed. The trade-off: a listed file's own ``lstat``
(a ``write(2)``, ``chmod`` or truncation of that file) is not taken again while its folder is
unchanged. Only the file's owner (or root) can do that, and the owner can change the same bytes
through a shared mapping, which on tmpfs changes no time at all, so the ``lstat`` never proved the
bytes unchanged; a refused file is judged again when its folder changes or ``REJUDGE_SECONDS``
pass (``Refusals.still_refused``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import stat
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agentd import procfs
from agentd.collectors.rank_files import read_owned_text
from agentd.collectors.rank_function_requests import REQUEST_SUFFIX
from agentd.collectors.rank_functions import FUNCTIONS_SUFFIX
from agentd.text import printable

if TYPE_CHECKING:  # rank_places raises this module's Refused
    from agentd.collectors.rank_places import Claimant, SegmentFolder, SegmentFolders

log = logging.getLogger(__name__)

# A node runs a few dozen ranks per user at most (8 GPUs × a few processes each);
# 256 leaves room for many jobs while bounding what one owner's files cost per interval.
MAX_FILES_PER_OWNER = 256
NOTE_LIMIT = 4096  # an inert note is one line
# The hook writes a segment's magic microseconds after creating the file; one still
# without it this long after is junk (judged once, not reopened every interval).
NOT_READY_LIMIT_NS = 2_000_000_000
# A refused file is judged again when it changes, and at least this often anyway.
REJUDGE_SECONDS = 60.0
REFUSAL_LOGS_PER_MINUTE = 20
# A folder's times come from the kernel's coarse clock (one tick: 1 to 10 ms), so a name made in the
# same tick as the folder's last change leaves its times as they were. A listing is reused only when
# the folder last changed longer than this before the listing: any later change falls in a later tick
# and shows. Several ticks at any kernel's HZ; a clock set back makes every listing look too recent,
# and so listed again, which is safe.
RACY_MARGIN_NS = 50_000_000
_SECOND_NS = 1_000_000_000

# Why a file was refused (the keys refusals are counted under).
BAD_NAME = "name"                # numbers out of range, pid at or above pid_max
NOT_REGULAR = "not-regular"      # FIFO, symlink, socket, directory
OWNER = "owner"                  # the file's owner is not the uid in its name
HEADER_PID = "header-pid"        # the header names another pid than the file name
PROCESS_UID = "process-uid"      # the process runs as another user than the claim
UNREADABLE = "unreadable"        # not a segment of this layout: foreign, truncated, corrupt
OVER_CAP = "over-cap"            # more than MAX_FILES_PER_OWNER files of one owner
PID_NAMESPACE = "pid-namespace"  # in a container's /dev/shm, a pid no process of that container has
AMBIGUOUS_PID = "ambiguous-pid"  # a /dev/shm shared across pid namespaces where two processes have that pid
REASONS = (BAD_NAME, NOT_REGULAR, OWNER, HEADER_PID, PROCESS_UID, UNREADABLE, OVER_CAP, PID_NAMESPACE,
           AMBIGUOUS_PID)  # the whole set


class Refused(Exception):
    """A claim the kernel does not confirm; ``reason`` is the key it is counted under."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A name in the segment directory that parses, with what ``lstat`` says of the file."""

    folder: SegmentFolder  # where it was found (rank_places)
    path: str
    uid: int  # claimed by the name (as the process sees it: in a container, the container's uid)
    pid: int  # claimed by the name (as the process sees it: in a container, its pid there)
    inert: bool  # an inert hook's note, not a segment
    owner: int
    regular: bool
    identity: tuple[int, ...]  # (dev, ino, size, mtime, ctime): a refusal stands while it is unchanged
    changed_ns: int  # ctime: the note was written no earlier (no user can set it back)


@dataclasses.dataclass
class Scan:
    candidates: list[Candidate]
    refused: collections.Counter[str]  # refusals decided from names and counts alone
    over_cap: dict[int, int]  # owner → files beyond MAX_FILES_PER_OWNER (summed over folders)
    # The paths named as files beside a segment (``_beside_a_segment``), whatever they are: the ranks
    # collector looks at such a file (``rank_files.SidecarFile``) only when the listing holds it.
    side_files: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Listing:
    """What one listing of a folder found, and the folder's ``stat`` taken just before it."""

    folder_times: tuple[int, int, int, int]  # the folder's (dev, ino, mtime, ctime)
    settled: bool  # the folder had not changed for RACY_MARGIN_NS when it was listed: reusable
    pid_limit: int  # the kernel's pid_max names were judged against
    by_owner: dict[int, list[Candidate]] = dataclasses.field(default_factory=dict)  # owner → its files here, by pid
    side_files: set[str] = dataclasses.field(default_factory=set)
    bad_names: int = 0  # names refused as BAD_NAME


class FolderListings:
    """The segment folders' last listings, each reused while its folder's ``stat`` shows it unchanged
    (the module's docstring says why that is enough). Held by the ranks collector across intervals; a
    folder no longer scanned is forgotten."""

    def __init__(self) -> None:
        self._last: dict[SegmentFolder, _Listing] = {}

    def scan(self, folders: list[SegmentFolder], layout: Any, followed: Mapping[str, Candidate]) -> Scan:
        """Every segment or note name in the ``folders`` with its file's facts, at most
        ``MAX_FILES_PER_OWNER`` per owner and folder (those already ``followed`` first, then by pid).
        ``layout`` is ``tuiprof_native.segment`` (its prefix, suffix and ``parse_name``). A folder that
        changed is listed with one ``lstat`` per name, and a ``followed`` file (by path) that ``lstat``
        shows unchanged is its Candidate again."""
        pid_limit = procfs.pid_max()
        now_ns = time.time_ns()  # before any folder's stat: a listing is racy against this time
        listings: dict[SegmentFolder, _Listing] = {}
        for folder in folders:
            try:
                listings[folder] = self._listing(folder, layout, pid_limit, followed, now_ns)
            except FileNotFoundError:
                if folder.own:
                    raise
        self._last = listings
        return _merged(listings.values(), followed)

    def _listing(self, folder: SegmentFolder, layout: Any, pid_limit: int, followed: Mapping[str, Candidate],
                 now_ns: int) -> _Listing:
        times = _folder_times(folder)
        last = self._last.get(folder)
        if last is not None and last.settled and last.folder_times == times and last.pid_limit == pid_limit:
            return last
        return _list(folder, layout, pid_limit, followed, times, _settled(times, now_ns))


def scan(folders: list[SegmentFolder], layout: Any, followed: Mapping[str, Candidate]) -> Scan:
    """``FolderListings.scan`` once, every folder listed (a timeline capture's one look)."""
    return FolderListings().scan(folders, layout, followed)


def _folder_times(folder: SegmentFolder) -> tuple[int, int, int, int]:
    """The folder's (device, inode, mtime, ctime): through its open descriptor when it has one (a
    container's)."""
    st = os.stat(folder.path) if folder.fd is None else os.fstat(folder.fd)
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def _settled(folder_times: tuple[int, int, int, int], now_ns: int) -> bool:
    """Whether a listing of a folder with these times, taken after ``now_ns``, may be reused while they
    stay so: its last change is older than RACY_MARGIN_NS. Times in whole seconds (a file system that
    keeps no finer ones: its tick is a second or more) never settle."""
    _, _, mtime, ctime = folder_times
    return max(mtime, ctime) < now_ns - RACY_MARGIN_NS and mtime % _SECOND_NS != 0 and ctime % _SECOND_NS != 0


def _list(folder: SegmentFolder, layout: Any, pid_limit: int, followed: Mapping[str, Candidate],
          folder_times: tuple[int, int, int, int], settled: bool) -> _Listing:
    listing = _Listing(folder_times, settled, pid_limit)
    with os.scandir(folder.path) as entries:
        for entry in entries:
            if not entry.name.startswith(layout.SEGMENT_PREFIX):
                continue
            kept = followed.get(entry.path)
            if kept is not None and kept.folder is folder:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if kept.identity == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) \
                        and kept.owner == st.st_uid and kept.regular == stat.S_ISREG(st.st_mode):
                    listing.by_owner.setdefault(st.st_uid, []).append(kept)  # the name parsed, the file is as it was
                    continue
            parsed = layout.parse_name(entry.name)
            if parsed is None and _beside_a_segment(entry.name, layout):
                listing.side_files.add(entry.path)
                continue
            if parsed is None or parsed[1] >= pid_limit:
                if _claims_a_pid(entry.name, layout):
                    listing.bad_names += 1
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            uid, pid, inert = parsed
            listing.by_owner.setdefault(st.st_uid, []).append(Candidate(
                folder, entry.path, uid, pid, inert, st.st_uid, stat.S_ISREG(st.st_mode),
                (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), st.st_ctime_ns))
    for files in listing.by_owner.values():
        files.sort(key=lambda c: c.pid)
    return listing


def _merged(listings: Iterable[_Listing], followed: Mapping[str, Candidate]) -> Scan:
    """The folders' listings as one Scan: each owner's files of each folder capped at
    MAX_FILES_PER_OWNER, those ``followed`` first (the listings themselves are left as they are)."""
    result = Scan([], collections.Counter(), {})
    for listing in listings:
        result.side_files |= listing.side_files
        if listing.bad_names:
            result.refused[BAD_NAME] += listing.bad_names
        for owner, files in listing.by_owner.items():
            first = [c for c in files if c.path in followed]  # files are by pid (``_list``)
            ordered = files if len(first) == len(files) else first + [c for c in files if c.path not in followed]
            result.candidates.extend(ordered[:MAX_FILES_PER_OWNER])
            if len(ordered) > MAX_FILES_PER_OWNER:
                result.over_cap[owner] = result.over_cap.get(owner, 0) + len(ordered) - MAX_FILES_PER_OWNER
                result.refused[OVER_CAP] += len(ordered) - MAX_FILES_PER_OWNER
    return result


def _beside_a_segment(name: str, layout: Any) -> bool:
    """Whether ``name`` is a segment's name (not a note's) with the suffix of a file put beside it: its last
    exception, its Flight Recorder progress, its timed functions (the startup hook's), or the agent's
    request to time others."""
    stem, dot, suffix = name.rpartition(".")
    side = (layout.EXCEPTION_SUFFIX, layout.FLIGHT_SUFFIX, FUNCTIONS_SUFFIX, REQUEST_SUFFIX)
    parsed = layout.parse_name(stem) if dot and f".{suffix}" in side else None
    return parsed is not None and not parsed[2]


def _claims_a_pid(name: str, layout: Any) -> bool:
    """``tuiprof-<digits>-<digits>[-<random>][.inert]`` with numbers out of range: a claim, refused
    (not a side file)."""
    parts = name.removeprefix(layout.SEGMENT_PREFIX).removesuffix(layout.INERT_SUFFIX).split("-")
    return 2 <= len(parts) <= 3 and parts[0].isdigit() and parts[1].isdigit()


def place(candidate: Candidate, folders: SegmentFolders) -> Claimant:
    """The file-level claim: a regular file, of a process its folder holds (``rank_places``), owned by
    that process's uid (the name's, mapped as the host sees it). The claimant, or Refused."""
    if not candidate.regular:
        raise Refused(NOT_REGULAR, f"{candidate.path} is not a regular file (a FIFO, link or directory "
                                   "under a rank file's name)")
    device, inode = candidate.identity[:2]
    claimant = folders.claimant(candidate.folder, candidate.pid, candidate.uid, (device, inode))
    if candidate.owner != claimant.uid:
        mapped = f" (uid {claimant.uid} on the host)" if claimant.uid != candidate.uid else ""
        raise Refused(OWNER, f"{candidate.path} is owned by uid {candidate.owner} but its name claims uid "
                             f"{candidate.uid}{mapped}")
    return claimant


def check_header_pid(candidate: Candidate, header_pid: int) -> None:
    if header_pid != candidate.pid:
        raise Refused(HEADER_PID, f"{candidate.path} names pid {candidate.pid} but its header says pid "
                                  f"{header_pid}")


def live_process(pid: int, uid: int, claimed_start_ns: int, path: str) -> procfs.ProcessStatus | None:
    """The claimant process's status if it is alive, None when it is gone (also when its pid now
    belongs to a process started after the claim). Raises Refused when it runs as another user."""
    process = watch_process(pid, uid, claimed_start_ns, path)
    if process is None:
        return None
    try:
        return owned_status(process, uid, path)
    finally:
        process.close()


def watch_process(pid: int, uid: int, claimed_start_ns: int, path: str) -> procfs.StatusFile | None:
    """The claimant process's status file held open (``procfs.StatusFile``: bound to that process, so
    its start time is checked this once), None when it is gone or a later process has its pid. Raises
    Refused when it runs as another user."""
    process = procfs.StatusFile.open(pid, claimed_start_ns)
    if process is not None:
        try:
            owned_status(process, uid, path)
        except Refused:
            process.close()
            raise
    return process


def owned_status(process: procfs.StatusFile, uid: int, path: str) -> procfs.ProcessStatus | None:
    """The claimant process's status now (one read), None once it is gone. Raises Refused when it runs
    as another user than ``uid``."""
    status = process.read()
    if status is not None and status.uids[0] != uid:
        raise Refused(PROCESS_UID, f"{path} claims pid {process.pid} runs as uid {uid}, but it runs as uid "
                                   f"{status.uids[0]}")
    return status


def open_verified(candidate: Candidate, layout: Any, folders: SegmentFolders
                  ) -> tuple[Any, int, Claimant, procfs.ProcessStatus | None]:
    """Open a segment and check its claim: (the open ``layout.Segment``, its verified start, the
    process it is of, that process when alive or None when gone). Raises Refused, or
    ``layout.SegmentError`` (not ready yet, replaced, not a segment). ``layout`` is
    ``tuiprof_native.segment``."""
    claimant = place(candidate, folders)
    try:
        seg = layout.Segment(candidate.path)
    except layout.SegmentNotReadyError:
        check_still_unready(candidate, time.time_ns())  # refused once it stays unfinished
        raise
    try:
        if (seg.device, seg.inode, seg.owner_uid) != (*candidate.identity[:2], candidate.owner):
            raise layout.SegmentError(f"{candidate.path} was replaced while it was opened")
        pid, start_ns = seg.claimant()
        check_header_pid(candidate, pid)
        alive = live_process(claimant.pid, claimant.uid, start_ns, candidate.path)
    except BaseException:
        seg.close()
        raise
    return seg, start_ns, claimant, alive


def check_still_unready(candidate: Candidate, now_ns: int) -> None:
    """A segment the writer has not finished: fine for a moment, refused once it stays so."""
    age_s = (now_ns - candidate.changed_ns) / 1e9
    if age_s * 1e9 >= NOT_READY_LIMIT_NS:
        raise Refused(UNREADABLE, f"{candidate.path} is still not a finished segment {age_s:.0f} s after it was "
                                  "last changed (no magic): not a segment being created")


def read_note(candidate: Candidate) -> str:
    """The first line of an inert hook's note ("" when empty); its owner was checked (``place``)."""
    text = read_owned_text(candidate.path, candidate.owner, NOTE_LIMIT)
    return printable((text or "").strip().split("\n", 1)[0].strip())


def no_segment_reason(directory: str, segment_size: int) -> str:
    """Why a hook that left an empty note has no segment, as far as the agent can tell."""
    try:
        vfs = os.statvfs(directory)
    except OSError as exc:
        return f"the hook could not create its segment in {directory}: {exc.strerror}"
    free, total = vfs.f_bavail * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize
    return (f"the hook could not create its segment ({byte_size(segment_size)}): {directory} has "
            f"{byte_size(free)} free of {byte_size(total)}")


def byte_size(n: int) -> str:
    """``0 B``, ``64 KiB``, ``1.2 MiB``."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    text = f"{value:.1f}".removesuffix(".0") if value < 10 else f"{value:.0f}"
    return f"{text} {unit}"


class Refusals:
    """Files refused now (per reason), and their log lines: once per file and reason, at most
    ``REFUSAL_LOGS_PER_MINUTE`` a minute (the rest summed up in one line)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[int, ...], str, float]] = {}  # path → (identity, reason, when)
        self.counts: collections.Counter[str] = collections.Counter()
        self._over_cap: dict[int, int] = {}
        self._window_start = time.monotonic()
        self._logged = 0
        self._suppressed = 0

    def still_refused(self, candidate: Candidate) -> bool:
        """Whether this very file (unchanged since) was refused before; counted again if so,
        without opening it: junk costs one lstat per interval."""
        seen = self._seen.get(candidate.path)
        if seen is None or seen[0] != candidate.identity or time.monotonic() - seen[2] >= REJUDGE_SECONDS:
            return False
        self.counts[seen[1]] += 1
        return True

    def refuse(self, candidate: Candidate, refusal: Refused) -> None:
        self.counts[refusal.reason] += 1
        seen = self._seen.get(candidate.path)
        self._seen[candidate.path] = (candidate.identity, refusal.reason, time.monotonic())
        if seen is not None and seen[:2] == (candidate.identity, refusal.reason):
            return
        self._log("rank file refused", {"path": candidate.path, "why": refusal.reason, "reason": str(refusal)})

    def start_interval(self, scan_result: Scan) -> None:
        """Begin counting a new scan, with the refusals it already decided."""
        self.counts = collections.Counter(scan_result.refused)
        for owner, extra in scan_result.over_cap.items():
            if self._over_cap.get(owner) is None:
                self._log("too many rank files of one owner: the rest are ignored",
                          {"uid": owner, "ignored": extra, "followed_at_most": MAX_FILES_PER_OWNER})
        self._over_cap = dict(scan_result.over_cap)

    def forget_missing(self, present: set[str]) -> None:
        self._seen = {p: v for p, v in self._seen.items() if p in present}

    def _log(self, message: str, extra: dict[str, object]) -> None:
        now = time.monotonic()
        if now - self._window_start >= 60:
            if self._suppressed:
                log.warning("rank file refusals not logged in the last minute", extra={"count": self._suppressed})
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged >= REFUSAL_LOGS_PER_MINUTE:
            self._suppressed += 1
            return
        self._logged += 1
        log.warning(message, extra=extra)
