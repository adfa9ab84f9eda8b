"""Where rank files are: the agent's own ``/dev/shm`` and every container's, and whose process a
name's pid and uid mean there.

A rank in a container (its own mount namespace, usually a private tmpfs on ``/dev/shm``) writes
its segment into the container's ``/dev/shm``, names it with the pid and uid it sees (its own pid
and user namespaces), and the agent on the host must find the file and the host's process for it.

- **Finding the folders.** The agent groups processes by mount namespace and opens each namespace's
  ``/dev/shm`` through one of its processes: ``/proc/<pid>/root``, then ``dev`` and ``shm`` with
  ``O_NOFOLLOW|O_DIRECTORY``, so a container that made either a link gets nothing followed. Folders
  are told apart by (device, inode): a ``--ipc=host`` container shares the host's and is read once.
  The folder stays open; its files are opened through ``/proc/self/fd/<fd>/<name>`` (the folder
  the agent checked, whatever the container does to its path since).
- **When.** Listing /proc and reading each process's namespaces costs about 85 ms of CPU on a node of
  2000 processes (issue 28). Without the kernel's process events (``agentd.proc_events``: an agent
  outside the initial namespaces hears none) it is done every ``SCAN_SECONDS``. With them, it is done
  on the first call, after events were lost and every ``FULL_SCAN_SECONDS``; in between only the
  processes that exec'd or exited since the last call are looked at again, each as the listing looks
  at it. A new container is found at its first process's exec: runtimes (runc, enroot, apptainer,
  unshare(1)) make its namespaces, then exec its entrypoint. Each exec in another mount namespace
  opens that namespace's ``/dev/shm`` again, so a tmpfs mounted over it after the namespace's first
  exec (``unshare --mount sh -c 'mount ... /dev/shm; exec rank'``) is found at the next one. A process
  that exited leaves its folder's processes at once: its pid may be reused. Either way /proc is also
  listed (at most once an interval) when a name cannot be placed. A folder no process holds any more
  is closed by the next listing, unless a followed rank's file is in it: no event tells that a
  namespace lost its last process (a child forked without exec is never heard of).
- **Placing a claim.** A name ``tuiprof-<uid>-<pid>-…`` in a folder can only be about a process
  whose ``/dev/shm`` that folder is: among those, the one whose innermost pid (``NSpid``: the pid it
  sees itself) is ``<pid>``. Its host pid is what the agent reports, ptraces and counts; its uid is
  the name's uid mapped through that process's user namespace (``uid_map``), which the file's
  owner and the process's real uid must then equal (``rank_claims``). A container cannot name a
  host process or another container's: they are not among the candidates. Two candidates (a
  ``--ipc=host`` container's pid and a host pid alike) are told apart by which of them has the file
  mapped (``/proc/<pid>/map_files``' listing in ``maps``), else refused.

In the agent's own folder a pid no process holds is a rank that exited (reported so, as always);
in a container's folder it is refused: the pid means nothing outside the container, and the agent
can say nothing true about it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import time
from collections.abc import Callable, Collection
from typing import NamedTuple

from agentd import containers, proc_events, procfs
from agentd.collectors.rank_claims import AMBIGUOUS_PID, OWNER, PID_NAMESPACE, Refused
from agentd.proto import tuiprof_agent_pb2 as pb

log = logging.getLogger(__name__)

SCAN_SECONDS = 5.0  # without process events: how often /proc is listed for new mount namespaces
# With them: how often /proc is listed all the same. A process that entered another mount namespace with
# unshare(2) or setns(2) and did not exec is named by no event; the listing also closes dead containers' folders.
FULL_SCAN_SECONDS = 60.0
MAX_FOLDERS = 1024  # mount namespaces' /dev/shm folders followed at once (a node runs a few hundred containers)
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWN_PID_NAMESPACE = procfs.namespace_inode(os.getpid(), "pid")
_OWN_MOUNT_NAMESPACE = procfs.namespace_inode(os.getpid(), "mnt")


class Claimant(NamedTuple):
    """The process a rank file's name means, as the host sees it."""

    pid: int  # host pid
    uid: int  # the name's uid mapped into the agent's user namespace
    pid_in_container: int | None  # the pid the process sees itself, when not the host's
    container: pb.Container | None  # the container, pod or SLURM job its cgroup names (read once, when placed)


@dataclasses.dataclass(eq=False)
class SegmentFolder:
    """One ``/dev/shm`` the agent reads rank files from."""

    path: str  # where its files are opened: the host path, or /proc/self/fd/<fd> for a container's
    label: str  # for people: "/dev/shm", or "/dev/shm of mount namespace 4026532177 (pid 4242)"
    own: bool  # the agent's own /dev/shm
    fd: int | None = None
    members: set[int] = dataclasses.field(default_factory=set)  # host pids in them, in the agent's pid namespace
    foreign: dict[int, int] = dataclasses.field(default_factory=dict)  # host pid → innermost pid, other pid namespaces

    def candidates(self, claimed_pid: int) -> list[int]:
        """Host pids in this folder's namespaces whose own pid is ``claimed_pid``."""
        found = [claimed_pid] if claimed_pid in self.members else []
        found += [host for host, inner in self.foreign.items() if inner == claimed_pid]
        return found

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class SegmentFolders:
    """The agent's own segment folder and, when ``containers``, every other mount namespace's
    ``/dev/shm``; places the names found in them (``claimant``)."""

    def __init__(self, own_directory: str, containers: bool) -> None:
        self.own = SegmentFolder(own_directory, own_directory, own=True)
        self.containers = containers
        self._folders: dict[tuple[int, int], SegmentFolder] = {}  # (device, inode) → a container's folder
        self._scanned_at = -SCAN_SECONDS  # when /proc was last listed
        self._heard_since_scan = False  # every process event since then was heard and applied
        self._rescan_asked = False

    def current(self, in_use: Callable[[], Collection[str]],
                heard: proc_events.Changes | None = None) -> list[SegmentFolder]:
        """The folders to scan this interval (the own one first). ``in_use``: gives the folder paths whose
        files are still followed, kept open while any is (asked only when /proc is listed). ``heard``: the process events drained since
        the last call, just before this one (None: none are heard, /proc is listed every SCAN_SECONDS)."""
        if self.containers:
            if self._rescan_asked or self._scan_due(heard):
                self._scan(in_use())
            elif heard is not None:
                for pid in heard.execs | heard.exits:
                    self._look_again(pid)
            # Events missed while none were passed: the next call that passes some lists /proc first.
            self._heard_since_scan = heard is not None
        return [self.own, *self._folders.values()]

    def claimant(self, folder: SegmentFolder, claimed_pid: int, claimed_uid: int,
                 mapped: tuple[int, int]) -> Claimant:
        """The process a name in ``folder`` means. ``mapped``: the file's (device, inode), to tell two
        candidates apart. Raises Refused when the folder's namespaces hold no such process (a
        container's folder) or cannot tell which; in the agent's own folder a pid nobody holds is the
        name's pid and uid as they are (a rank that exited)."""
        candidates = folder.candidates(claimed_pid)
        if not candidates and self.containers:
            self._rescan_asked = True  # a process newer than the last scan: look again next interval
        if not candidates:
            if folder.own:
                return Claimant(claimed_pid, claimed_uid, None, containers.container_of(claimed_pid))
            raise Refused(PID_NAMESPACE, f"no process whose /dev/shm is {folder.label} has pid {claimed_pid} in its "
                                         "own pid namespace: the name claims a process outside that container "
                                         "(or one that already exited)")
        if len(candidates) > 1:
            candidates = [pid for pid in candidates if _maps_file(pid, mapped)]
            if len(candidates) != 1:
                raise Refused(AMBIGUOUS_PID, f"pid {claimed_pid} in {folder.label} names more than one process "
                                             "(a shared /dev/shm across pid namespaces) and not exactly one has "
                                             "the file mapped")
        host_pid = candidates[0]
        mapping = procfs.uid_map(host_pid)  # identity outside user namespaces
        uid = procfs.uid_outside(mapping, claimed_uid) if mapping is not None else None
        if uid is None:
            raise Refused(OWNER, f"uid {claimed_uid} of a name in {folder.label} is not mapped by process "
                                 f"{host_pid}'s user namespace")
        return Claimant(host_pid, uid, folder.foreign.get(host_pid), containers.container_of(host_pid))

    def close(self) -> None:
        for folder in self._folders.values():
            folder.close()
        self._folders.clear()

    def _scan_due(self, heard: proc_events.Changes | None) -> bool:
        """Whether /proc is to be listed now (besides when asked)."""
        age = time.monotonic() - self._scanned_at
        if heard is None:
            return age >= SCAN_SECONDS
        return heard.lost or not self._heard_since_scan or age >= FULL_SCAN_SECONDS

    def _scan(self, in_use: Collection[str]) -> None:
        """Every process looked at: each mount namespace's folder opened through one of its processes, and
        its processes placed in it; the folders no process holds closed, unless in ``in_use``."""
        self._scanned_at, self._rescan_asked = time.monotonic(), False
        by_namespace: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            mount = procfs.namespace_inode(pid, "mnt")
            if mount is None:
                continue  # gone, or a kernel thread
            by_namespace.setdefault(mount, []).append(pid)
        self.own.members, self.own.foreign = set(), {}
        kept: dict[tuple[int, int], SegmentFolder] = {}
        for mount, pids in by_namespace.items():
            folder = self._folder_of(mount, pids, kept)
            if folder is not None:
                for pid in pids:
                    _place(pid, folder)
        for key, folder in self._folders.items():
            if key not in kept and folder.path in in_use:
                kept[key] = folder  # its namespace is gone, its exited ranks are still reported
            elif key not in kept:
                folder.close()
        self._folders = kept

    def _look_again(self, pid: int) -> None:
        """A process the events named (it exec'd or exited) taken out of its folder, and placed where it is
        now when it is there (its pid may be reused already); its namespace's folder opened through it."""
        for folder in (self.own, *self._folders.values()):
            folder.members.discard(pid)
            folder.foreign.pop(pid, None)
        mount = procfs.namespace_inode(pid, "mnt")
        now_in = self._folder_of(mount, [pid], self._folders) if mount is not None else None
        if now_in is not None:
            _place(pid, now_in)

    def _folder_of(self, mount: int, pids: list[int],
                   kept: dict[tuple[int, int], SegmentFolder]) -> SegmentFolder | None:
        """The /dev/shm of a mount namespace, opened through the first of its processes ``pids`` that lets
        it, from ``kept`` (the folders found so far) or added to it (None: none could, or MAX_FOLDERS are).
        A listing's ``kept`` starts empty: a folder already open is reused, its processes listed anew."""
        if mount == _OWN_MOUNT_NAMESPACE:
            return self.own
        own_key = _folder_key(self.own.path)
        for pid in pids:
            try:
                fd = _open_shm(pid)
            except OSError:
                continue
            info = os.fstat(fd)
            key = (info.st_dev, info.st_ino)
            if key == own_key:
                os.close(fd)
                return self.own
            folder = kept.get(key) or self._folders.get(key)
            if folder is not None:
                os.close(fd)
                if key not in kept:  # first seen in this scan: its processes are listed anew
                    folder.members, folder.foreign = set(), {}
                kept[key] = folder
                return folder
            if len(kept) >= MAX_FOLDERS:
                os.close(fd)
                return None
            folder = SegmentFolder(f"/proc/self/fd/{fd}", f"/dev/shm of mount namespace {mount} (pid {pid})",
                                   own=False, fd=fd)
            kept[key] = folder
            return folder
        return None


def _place(pid: int, folder: SegmentFolder) -> None:
    """``pid`` among ``folder``'s processes: by its own pid in the agent's pid namespace, else by its innermost
    (``NSpid``; nowhere when it is gone)."""
    if procfs.namespace_inode(pid, "pid") == _OWN_PID_NAMESPACE:
        folder.members.add(pid)
        return
    inner = procfs.ns_pids(pid)
    if inner:
        folder.foreign[pid] = inner[-1]


def _open_shm(pid: int) -> int:
    """``/proc/<pid>/root/dev/shm`` opened without following any link inside the container."""
    root = os.open(f"/proc/{pid}/root", _DIRECTORY & ~os.O_NOFOLLOW)  # the magic link itself is the point
    try:
        dev = os.open("dev", _DIRECTORY, dir_fd=root)
    finally:
        os.close(root)
    try:
        shm = os.open("shm", _DIRECTORY, dir_fd=dev)
    finally:
        os.close(dev)
    if not stat.S_ISDIR(os.fstat(shm).st_mode):
        os.close(shm)
        raise NotADirectoryError(f"/proc/{pid}/root/dev/shm")
    return shm


def _folder_key(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _maps_file(pid: int, file: tuple[int, int]) -> bool:
    """Whether process ``pid`` has the file (device, inode) mapped (its own segment: the hook maps it)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return False
    device, inode = file
    wanted = f"{os.major(device):02x}:{os.minor(device):02x} {inode} ".encode()
    return any(wanted in line for line in maps.splitlines())
