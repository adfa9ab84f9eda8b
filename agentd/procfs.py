"""The one reader of ``/proc/<pid>``: what the kernel says about a process; and ``read_whole`` and
``read_attribute``, the one-``open`` readers of the /proc and /sys files the collectors sample.

``OpenProcFile`` reads a /proc file every interval without opening it again.

Everything the agent believes about a process (alive or not, its scheduler state,
when it started, whose it is and whether it still acts only as that user, its rank
and whether it runs CUDA) comes from here,
read directly rather than through psutil: a dump must never be attempted against a
process in uninterruptible sleep, and a pid the kernel has handed to a newer process
must never be taken for the old one (``ProcessStat.started_by``).

``environ`` and ``maps`` are readable only by the process's own user or root; when
they are not, the rank stays unknown and the process is treated as CPU-only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

# The kernel's one-letter states, named for humans (one vocabulary for the agent).
RUNNING = "running"
SLEEPING = "sleeping"
DISK_SLEEP = "disk-sleep"
STOPPED = "stopped"
ZOMBIE = "zombie"
DEAD = "dead"
GONE = "gone"  # no such process (or a newer process under the same pid)
_STATES = {
    "R": RUNNING, "S": SLEEPING, "I": "idle", "D": DISK_SLEEP, "T": STOPPED,
    "t": "tracing-stop", "Z": ZOMBIE, "X": DEAD,
}
# Launchers set one of these; torchrun's RANK wins.
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
# A process with any of these mapped can produce GPU activities.
CUDA_LIBRARIES = ("libcudart", "libtorch_cuda", "libcupti")
# Start times are in clock ticks; a process born this long after a claimed start is another one.
START_SLACK_NS = 2_000_000_000


@dataclass(frozen=True)
class ProcessStat:
    pid: int
    state: str
    start_ns: int  # wall clock (ns since the epoch) when the kernel started the process

    @property
    def alive(self) -> bool:
        return self.state not in (ZOMBIE, DEAD)

    def started_by(self, claimed_start_ns: int) -> bool:
        """Whether this process could be the one that claims to have started at ``claimed_start_ns``.

        A pid is reused by a process born later; one born after the claim (beyond
        clock-tick rounding) is not the claimant.
        """
        return self.start_ns <= claimed_start_ns + START_SLACK_NS


# /proc files are generated per read(2): a large buffer gets a whole file in one call.
_READ_CHUNK = 1 << 16


def read_whole(path: str) -> bytes:
    """The whole content of a /proc or /sys file: os.open and os.read, without a Python file object.

    The collectors read several such files every interval; a buffered text file costs more
    than the read itself. An OSError (missing, unreadable) propagates.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        # A short read is not the end: a seq_file read stops before a line that does not fit.
        chunks = []
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class OpenProcFile:
    """A /proc file opened once and read again from its start each time.

    The kernel generates a /proc text file anew for a read from offset 0, so ``pread``
    from 0 on the kept descriptor gives what ``read_whole`` gives, without the path
    lookup, open and close each time (on the VM, cold, about a third of reading the
    host collector's five files). The descriptor is opened at the first read; an
    OSError then (missing, unreadable) propagates and the next read tries again.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def read(self) -> bytes:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        chunks = []
        offset = 0
        while chunk := os.pread(self._fd, _READ_CHUNK, offset):  # a seq_file read may stop short
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_attribute(path: str) -> bytes:
    """A sysfs attribute file, or a /proc file of one short line (a thread's ``schedstat``): the kernel
    hands all of it (at most a page) to the first read(2), so no second read looks for the end."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, _READ_CHUNK)
    finally:
        os.close(fd)


@cache
def boot_time_ns() -> int:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1]) * 1_000_000_000
    raise OSError("no btime in /proc/stat")


def read_stat(pid: int) -> ProcessStat | None:
    """``/proc/<pid>/stat`` parsed, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    # The command name may contain spaces and parentheses: the fields follow the last ')'.
    fields = raw[raw.rindex(b")") + 2:].split()
    letter = fields[0].decode()
    start_ticks = int(fields[19])
    start_ns = boot_time_ns() + start_ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return ProcessStat(pid, _STATES.get(letter, f"unknown ({letter})"), start_ns)


def pid_max() -> int:
    """The kernel's pid wrap value (/proc/sys/kernel/pid_max): every pid is below it."""
    with open("/proc/sys/kernel/pid_max", "rb") as f:
        return int(f.read())


def state_of(pid: int) -> str:
    """``running``, ``sleeping``, ``disk-sleep``, ``stopped``, ``zombie``, ... or ``gone``."""
    stat = read_stat(pid)
    return GONE if stat is None else stat.state


def real_uid(pid: int) -> int | None:
    """The real uid of ``pid`` (first field of ``Uid:`` in /proc/<pid>/status), None when gone."""
    status = _read_status(pid)
    return None if status is None else status.uids[0]


@dataclass(frozen=True)
class ProcessStatus:
    """What ``/proc/<pid>/status`` says of a process's state and identity."""

    state: str
    uids: tuple[int, ...]  # real, effective, saved, filesystem
    gids: tuple[int, ...]


def parse_status(raw: bytes) -> ProcessStatus:
    """``State:``, ``Uid:`` and ``Gid:`` of a status file (they come in that order, within its first lines).

    Each is found by its line's start, not by splitting the whole file into lines: the ranks collector
    parses one status file per rank every interval, and the rest of the file (memory, signals, CPU lists)
    is most of it. No process can forge such a line: the kernel escapes a newline in the ``Name:`` it
    prints first."""
    state_at, uid_at, gid_at = raw.find(b"\nState:\t"), raw.find(b"\nUid:\t"), raw.find(b"\nGid:\t")
    if min(state_at, uid_at, gid_at) < 0:
        raise ValueError("no State:, Uid: and Gid: lines in a /proc/<pid>/status")
    letter = raw[state_at + 8:state_at + 9].decode()
    uids = tuple(map(int, line_from(raw, uid_at + 6).split()[:4]))
    gids = tuple(map(int, line_from(raw, gid_at + 6).split()[:4]))
    return ProcessStatus(_STATES.get(letter, f"unknown ({letter})"), uids, gids)


def line_from(raw: bytes, start: int) -> bytes:
    """``raw`` from ``start`` to the end of that line (its newline left out; the end of ``raw`` when none)."""
    end = raw.find(b"\n", start)
    return raw[start:end if end >= 0 else None]


def _read_status(pid: int) -> ProcessStatus | None:
    try:
        return parse_status(read_whole(f"/proc/{pid}/status"))
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None


# State:, Uid: and Gid: are within a status file's first dozen lines (the longest before them, Name:,
# is at most 64 characters).
_STATUS_HEAD = 4096


class StatusFile:
    """``/proc/<pid>/status`` of one process, opened once and read again each interval with one ``pread``.

    The descriptor stays bound to the process it was opened for: once that process is reaped, reading
    it fails with ESRCH (``read`` says None), also when its pid already belongs to a newer process. So
    the start time is checked once, when it is opened, and never needs reading again.
    """

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self._fd = fd

    @classmethod
    def open(cls, pid: int, claimed_start_ns: int) -> StatusFile | None:
        """The status file of ``pid`` when it is the process that claims to have started at
        ``claimed_start_ns`` (``ProcessStat.started_by``); None when it is gone or a later one."""
        try:
            fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return None
        held = cls(pid, fd)
        stat = read_stat(pid)  # after the open: the process the descriptor holds started no later
        if stat is None or not stat.started_by(claimed_start_ns) or held.read() is None:
            held.close()
            return None
        return held

    def read(self) -> ProcessStatus | None:
        """The process's status now; None once it is gone (reaped)."""
        if self._fd < 0:
            return None
        try:
            return parse_status(os.pread(self._fd, _STATUS_HEAD, 0))
        except ProcessLookupError:
            return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def ns_pids(pid: int) -> tuple[int, ...] | None:
    """``pid``'s pid in each pid namespace from the agent's down to its own (``NSpid:`` in
    /proc/<pid>/status): first the pid as the agent sees it, last the one the process itself sees
    (getpid() in a container). One entry when it shares the agent's pid namespace; None when gone."""
    try:
        raw = read_whole(f"/proc/{pid}/status")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    at = raw.find(b"\nNSpid:")  # a line's start (the kernel escapes a newline in the Name: before it)
    if at < 0:
        return (pid,)  # a kernel older than 4.1 lists no NSpid: one pid namespace as far as it tells
    return tuple(map(int, line_from(raw, at + 7).split()))


def namespace_inode(pid: int, kind: str) -> int | None:
    """The inode of ``pid``'s namespace of ``kind`` ("mnt", "net", "pid", "user", "ipc", "uts"):
    two processes share that namespace exactly when these are equal. None when gone or not allowed."""
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


UidMap = tuple[tuple[int, int, int], ...]  # (first uid inside, first uid outside, count), as /proc/<pid>/uid_map


def uid_map(pid: int) -> UidMap | None:
    """How ``pid``'s user namespace maps its uids onto the agent's (identity outside user
    namespaces: ``((0, 0, 4294967295),)``); None when gone."""
    try:
        text = read_whole(f"/proc/{pid}/uid_map")
    except OSError:
        return None
    return tuple((int(a), int(b), int(c)) for a, b, c in (line.split() for line in text.splitlines() if line.strip()))


def uid_outside(mapping: UidMap, uid: int) -> int | None:
    """The agent's view of the uid ``uid`` inside a user namespace with ``mapping``; None when unmapped
    (the kernel shows such a uid as the overflow uid, 65534: it owns nothing the agent can see)."""
    for inside, outside, count in mapping:
        if inside <= uid < inside + count:
            return outside + uid - inside
    return None


@dataclass(frozen=True)
class Credentials:
    """What a rank's process was when the agent confirmed it as its owner's: the agent counts
    its events and ptraces it on the owner's behalf only while it still is (``ineligible_reason``)."""

    uid: int  # the owner
    gid: int  # the process's real gid when confirmed
    exe: tuple[int, int] | None  # (st_dev, st_ino) of the program it ran; None when unreadable


def credentials(pid: int, owner_uid: int) -> Credentials | None:
    """``pid``'s credentials to hold it to from now on (None when it is gone)."""
    status = _read_status(pid)
    if status is None:
        return None
    return Credentials(owner_uid, status.gids[0], _exe_identity(pid))


def ineligible_reason(pid: int, confirmed: Credentials) -> str:
    """Why ``pid`` may no longer be counted or ptraced on its owner's behalf; "" when it may
    (``ineligible_reason_given`` with its status read now)."""
    return ineligible_reason_given(pid, confirmed, _read_status(pid))


def ineligible_reason_given(pid: int, confirmed: Credentials, status: ProcessStatus | None) -> str:
    """Why ``pid``, whose ``/proc/<pid>/status`` was just read as ``status`` (None: gone), may no longer
    be counted or ptraced on its owner's behalf; "" when it may.

    A rank that execs a set-user-ID or set-group-ID program keeps its pid and start time,
    so those do not tell. It stays eligible only while every uid and gid the kernel lists
    (real, effective, saved, filesystem) is the owner's, ``/proc/<pid>`` is owned by the
    owner (the kernel gives it to root when the process turns non-dumpable, as on such an
    exec) and it still runs the program it ran when confirmed. A process that is gone (or a
    zombie, whose program the kernel no longer names) did nothing since: "" (its final
    counter reading stands; there is nothing left to ptrace). Should the pid change hands between
    the status read and the two looks by path below, a newer process passes them only as the same
    owner running the same program."""
    if status is None:
        return ""
    reason = ids_changed_reason(pid, confirmed, status)
    if reason:
        return reason
    try:
        directory_owner = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return ""
    if directory_owner != confirmed.uid:
        return (f"process {pid} is not dumpable any more (/proc/{pid} belongs to uid {directory_owner}, "
                f"not its owner {confirmed.uid})")
    program = _exe_identity(pid)
    if program is not None and program != confirmed.exe:
        return f"process {pid} runs another program than when it was confirmed as a rank (it exec'd)"
    return ""


def ids_changed_reason(pid: int, confirmed: Credentials, status: ProcessStatus) -> str:
    """The part of ``ineligible_reason_given`` that ``status`` alone tells: why the uids and gids it lists
    (real, effective, saved, filesystem) are not all the confirmed owner's; "" when they are."""
    for kind, values, expected in (("uid", status.uids, confirmed.uid), ("gid", status.gids, confirmed.gid)):
        if len(values) != 4 or values.count(expected) != 4:
            listed = "/".join(str(v) for v in values)
            return (f"process {pid} no longer acts only as its owner: its {kind}s (real/effective/saved/filesystem) "
                    f"are {listed}, not all {expected} (a set-user-ID or set-group-ID program?)")
    return ""


def _exe_identity(pid: int) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:  # gone, a zombie, or a kernel thread: no program to name
        return None
    return st.st_dev, st.st_ino


def read_environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def rank_from_environ(env: dict[str, str]) -> int | None:
    for name in RANK_VARIABLES:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def uses_cuda(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return False
    return any(name in maps for name in CUDA_LIBRARIES)


@dataclass(frozen=True)
class ProcessFacts:
    rank: int | None
    cuda: bool
    alive: bool


def process_facts(pid: int) -> ProcessFacts:
    stat = read_stat(pid)
    return ProcessFacts(rank_from_environ(read_environ(pid)), uses_cuda(pid), stat is not None and stat.alive)


def proc_hides_processes(mountinfo: str = "/proc/self/mountinfo") -> str:
    """The hidepid option of the /proc this agent sees when it hides other users' processes
    ("invisible", "noaccess" or their numbers 2 and 1), "" when it does not.

    On such a node a user cannot see another user's command line in /proc; the agent, as root, can,
    and must not undo the admin's choice by showing it to them."""
    try:
        lines = read_whole(mountinfo).decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    mounted = [line for line in lines if line.split()[4:5] == ["/proc"] and " - proc " in line]
    if not mounted:
        return ""
    # The last mount on /proc is the one on top; its super options end the line (per mount since 5.8).
    options = mounted[-1].split(" - proc ", 1)[1].split()[-1].split(",")
    hidden = [option.split("=", 1)[1] for option in options if option.startswith("hidepid=")]
    return hidden[-1] if hidden and hidden[-1] not in ("0", "off") else ""
