"""libkineto's abstract socket inside other network namespaces (containers, pods), for a root agent.

An abstract unix socket name such as ``@dynolog@`` exists per network namespace: a
``KINETO_USE_DAEMON=1`` trainer in a pod with a network namespace of its own looks
for the daemon there and never reaches the host's. So a root agent binds
``@dynolog@`` inside each such namespace as well, and serves those sockets on the
endpoint's one thread like the host's.

Which namespaces: every few seconds (``SCAN_SECONDS``, from the kineto collector's
tick: no thread of its own wakes for it) the agent lists /proc and groups processes
by the inode of ``/proc/<pid>/ns/net``; a namespace other than the agent's is served
once a process in it has ``KINETO_USE_DAEMON`` in its environment without
``KINETO_IPC_SOCKET_DIR`` (then libkineto uses a folder, not the abstract name), and
closed once no process is left in it. A namespace whose processes never ask for
Kineto is left alone, so a dynolog running in a pod keeps its name there.

How: a short-lived thread ``setns``-es into the namespace through the candidate's
``/proc/<pid>/ns/net`` (checked to be the same inode the scan saw), creates and
binds the socket, and exits: a socket stays in the namespace it was made in, and no
thread of the agent is left in a foreign namespace.

Why this is safe: the socket in a namespace is reachable only by processes in that
namespace. A poll is believed exactly as on the host's socket: the sender's pid and
uid come from the kernel (SO_PASSCRED, translated into the agent's pid and user
namespaces: host pids and uids) and its claimed ancestry only as far as /proc
confirms it in the sender's own pid namespace (``agentd.kineto.ancestry``), so a
process of one container can register neither a pid of another container nor a
host pid. The work a namespace can cause is bounded: at most ``MAX_NAMESPACES``
sockets (``MAX_NAMESPACES_PER_UID`` for the namespaces one non-root user's processes
bring in), each process's environment read once and at most ``MAX_ENVIRON_BYTES`` of
it, and a namespace whose bind failed (the name already held there) tried again only
after ``RETRY_SECONDS``; past a bound, one log line per cause and window.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentd.kineto.ratelimit import CauseLimitedLogger
from agentd.procfs import real_uid

log = logging.getLogger(__name__)

SCAN_SECONDS = 5.0
MAX_NAMESPACES = 64
MAX_NAMESPACES_PER_UID = 8  # root's processes count against MAX_NAMESPACES only
RETRY_SECONDS = 60.0
MAX_ENVIRON_BYTES = 1 << 20
DAEMON_VARIABLE = b"KINETO_USE_DAEMON="
SOCKET_DIR_VARIABLE = b"KINETO_IPC_SOCKET_DIR="
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

# Where a trainer in another mount namespace (a container) writes its trace, in its own file system: the
# folder every Kineto version writes on-demand traces into. The agent copies the file out
# (agentd.traces.container_traces).
CONTAINER_TRACE_FOLDER = "/tmp"

# Creates a datagram socket bound to libkineto's abstract name in the calling thread's network namespace.
BindAbstract = Callable[[], socket.socket]


class ContainerTraceError(Exception):
    """A container's trace cannot be copied out (the message says why)."""


@dataclass
class _Served:
    sock: socket.socket
    uid: int  # the owner of the process that brought the namespace in (its share of MAX_NAMESPACES_PER_UID)


def network_namespace(pid: int | str) -> int | None:
    """The inode of ``pid``'s network namespace ("self": the agent's); None when gone or not allowed."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def wants_abstract_daemon(pid: int) -> bool:
    """Whether ``pid``'s environment asks libkineto to poll the daemon on its abstract name."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        environ = b"\0" + os.read(fd, MAX_ENVIRON_BYTES)
    except OSError:
        return False
    finally:
        os.close(fd)
    return b"\0" + DAEMON_VARIABLE in environ and b"\0" + SOCKET_DIR_VARIABLE not in environ


def _processes_by_namespace(own: int) -> dict[int, set[int]]:
    """Every process outside the agent's network namespace, by the inode of its namespace."""
    found: dict[int, set[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            inode = network_namespace(name)
            if inode is not None and inode != own:
                found.setdefault(inode, set()).add(int(name))
    return found


def _bind_inside(inode: int, pid: int, bind: BindAbstract) -> socket.socket:
    """``bind()`` run in the network namespace ``inode`` that ``pid`` is in; call on a thread that then exits."""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_ino != inode:
            raise OSError(errno.ESRCH, "the process left the namespace (or its pid was reused)")
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns: {os.strerror(code)}")
    finally:
        os.close(fd)
    return bind()


def bind_in_namespaces(wanted: list[tuple[int, int]], bind: BindAbstract) -> list[socket.socket | OSError]:
    """For each (namespace inode, a pid in it), a socket ``bind()`` made there, or why not.

    One thread does them all and exits, so the caller's thread never leaves its namespace."""
    results: list[socket.socket | OSError] = []

    def bind_each() -> None:
        for inode, pid in wanted:
            try:
                results.append(_bind_inside(inode, pid, bind))
            except OSError as exc:
                results.append(exc)

    worker = threading.Thread(target=bind_each, name="kineto-netns-bind", daemon=True)
    worker.start()
    worker.join()
    return results


class NamespaceSockets:
    """The sockets served in other network namespaces; ``rescan`` says which to add and which to drop.

    Called from one thread (the kineto collector's tick)."""

    def __init__(self, bind: BindAbstract, limited: CauseLimitedLogger) -> None:
        self._bind = bind
        self._limited = limited
        own = network_namespace("self")
        if own is None:
            raise OSError(errno.ENOENT, "cannot read the agent's own /proc/self/ns/net")
        self._own = own
        self._served: dict[int, _Served] = {}
        self._next_scan = 0.0
        self._retry_at: dict[int, float] = {}  # namespaces whose bind failed, and when to try again
        self._not_candidates: set[tuple[int, int]] = set()  # (pid, namespace) whose environment was read

    @property
    def served(self) -> int:
        return len(self._served)

    def rescan(self) -> tuple[list[socket.socket], list[socket.socket]]:
        """(sockets newly bound, sockets of namespaces no process is left in), once SCAN_SECONDS passed."""
        now = time.monotonic()
        if now < self._next_scan:
            return [], []
        self._next_scan = now + SCAN_SECONDS
        present = _processes_by_namespace(self._own)
        emptied = [inode for inode in self._served if inode not in present]
        for inode in emptied:
            log.info("Kineto IPC socket of another network namespace closed: no process is left in it",
                     extra={"netns": inode})
        gone = [self._served.pop(inode).sock for inode in emptied]
        self._retry_at = {inode: at for inode, at in self._retry_at.items() if inode in present and at > now}
        self._not_candidates = {(pid, inode) for pid, inode in self._not_candidates if pid in present.get(inode, ())}
        wanted = self._wanted(present)
        added = []
        results = bind_in_namespaces([(i, p) for i, p, _ in wanted], self._bind)
        for (inode, pid, uid), result in zip(wanted, results, strict=True):
            if isinstance(result, OSError):
                self._retry_at[inode] = now + RETRY_SECONDS
                self._limited.warning("netns-bind", "cannot serve Kineto's @dynolog@ in the network namespace of "
                                      "pid %d (net:[%d]): %s; trying again in %g s", pid, inode,
                                      result.strerror or result, RETRY_SECONDS)
                continue
            self._served[inode] = _Served(result, uid)
            added.append(result)
            log.info("Kineto IPC socket served in another network namespace",
                     extra={"pid": pid, "uid": uid, "netns": inode})
        return added, gone

    def _wanted(self, present: dict[int, set[int]]) -> list[tuple[int, int, int]]:
        """(namespace, candidate pid, its uid) for each namespace to bind in now, within the bounds."""
        per_uid: dict[int, int] = {}
        for served in self._served.values():
            per_uid[served.uid] = per_uid.get(served.uid, 0) + 1
        wanted: list[tuple[int, int, int]] = []
        for inode, pids in present.items():
            if inode in self._served or inode in self._retry_at:
                continue
            candidate = self._candidate(inode, pids)
            uid = real_uid(candidate) if candidate is not None else None
            if candidate is None or uid is None:
                continue
            if len(self._served) + len(wanted) >= MAX_NAMESPACES:
                self._limited.warning("netns-full", "Kineto's @dynolog@ is served in %d other network namespaces "
                                      "already, the most the agent serves; pid %d (uid %d) is not served",
                                      MAX_NAMESPACES, candidate, uid)
                break
            if uid != 0 and per_uid.get(uid, 0) >= MAX_NAMESPACES_PER_UID:
                self._limited.warning("netns-user-full", "uid %d's processes have Kineto served in %d network "
                                      "namespaces already, the most one user gets; pid %d is not served",
                                      uid, MAX_NAMESPACES_PER_UID, candidate)
                continue
            per_uid[uid] = per_uid.get(uid, 0) + 1
            wanted.append((inode, candidate, uid))
        return wanted

    def _candidate(self, inode: int, pids: set[int]) -> int | None:
        """A process of namespace ``inode`` that polls the abstract name, reading each environment once."""
        for pid in sorted(pids):
            if (pid, inode) in self._not_candidates:
                continue
            if wants_abstract_daemon(pid):
                return pid
            # A pid reused within one scan by another process of the same namespace goes unread; the
            # namespace is still served as soon as any other process of it asks.
            self._not_candidates.add((pid, inode))
        return None


def sees_folder(pid: int, folder: str) -> bool:
    """Whether ``pid`` finds the agent's ``folder`` (absolute, without links) at that same path: it shares the
    agent's file system, or its container has the folder mounted there. False for a container that does not
    (the path is missing there, passes through a link, or is another folder); True when it cannot be told
    (the process is gone: its config is not delivered anyway)."""
    try:
        agents = os.stat(folder)
        current = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        for name in folder.strip("/").split("/"):
            following = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            os.close(current)
            current = following
        theirs = os.fstat(current)
    except OSError:
        return False
    finally:
        os.close(current)
    return (theirs.st_dev, theirs.st_ino) == (agents.st_dev, agents.st_ino)
