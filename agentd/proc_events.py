"""The kernel's process events connector: which processes changed their credentials, exec'd or exited.

The ranks collector holds every rank it reports to the real uid its segment claims, and reads the
process's state. Reading ``/proc/<pid>/status`` for that every interval is most of what a resting rank
costs the kernel. The kernel can say instead when one of those facts may have changed: a process
subscribed to the connector's process group (``NETLINK_CONNECTOR``, ``CN_IDX_PROC``,
``PROC_CN_MCAST_LISTEN``; linux/cn_proc.h) is sent an event whenever any task's uids (``PROC_EVENT_UID``,
from ``commit_creds``, so also a set-user-ID exec) or gids (``PROC_EVENT_GID``) change, when it execs
(``PROC_EVENT_EXEC``) and when it exits (``PROC_EVENT_EXIT``). The event is queued on the listener's
socket before the system call that caused it returns, so once ``drain`` has read the socket, every such
change completed before it is known by the process's pid (its thread group id, as the initial pid
namespace numbers it). The exit event is sent for every thread (``struct exit_proc_event``: the thread's
pid, its thread group id, ...): a process is said to have exited (``Changes.exits``) when its main
thread did, the thread whose pid is the group's id (its other threads may outlive it a while, but
``/proc/<pid>/ns/mnt``, the main thread's, is gone with it).

The kernel drops events when the socket's queue is full; the next read then fails with ENOBUFS and
``drain`` says so (``Changes.lost``): the caller must then check every process it holds as if it had
heard of each. The kernel only answers a listener in the initial user and pid namespaces (an agent in a
container hears nothing): ``subscribe`` waits for the kernel's acknowledgement of this very request and
raises ``ProcessEventsUnavailable`` with the reason when none comes or it refuses.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import secrets
import select
import socket
import struct

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
NLMSG_DONE = 3

PROC_EVENT_NONE = 0x0  # the kernel's acknowledgement of a subscription request
PROC_EVENT_EXEC = 0x2
PROC_EVENT_UID = 0x4
PROC_EVENT_GID = 0x40
PROC_EVENT_EXIT = 0x80000000
# The events that may change what the ranks collector holds a process to (its ids, its program, its life).
WATCHED = PROC_EVENT_EXEC | PROC_EVENT_UID | PROC_EVENT_GID | PROC_EVENT_EXIT

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_CN_MSG = struct.Struct("=IIIIHH")  # id (index, value), sequence, acknowledgement, data length, flags
_EVENT_AT = _NLMSGHDR.size + _CN_MSG.size  # struct proc_event: what, cpu, timestamp, then the event's data
_EVENT_HEAD = struct.Struct("=IIQ")
_TASK_AT = _EVENT_AT + _EVENT_HEAD.size  # every watched event's data starts with the thread's (pid, tgid)
_TASK = struct.Struct("=ii")
_ACK = struct.Struct("=I")  # ack.err, where the event's data starts
_ACK_FIELD_AT = _NLMSGHDR.size + 12  # cn_msg.ack: the kernel answers with the request's ack + 1

# Room for a burst of events between two drains (each takes about 1 KiB of the socket's buffer).
RECEIVE_BUFFER_BYTES = 4 << 20
ACK_TIMEOUT_SECONDS = 1.0


class ProcessEventsUnavailable(OSError):
    """The kernel's process events cannot be heard here: the reason says why."""


@dataclasses.dataclass
class Changes:
    """What ``drain`` heard: the processes (thread group ids) a watched event named, those of them that
    exec'd, those whose main thread exited (the process, unless its other threads outlive it a while),
    and whether any events were lost."""

    pids: set[int]
    execs: set[int]
    exits: set[int]
    lost: bool


class ProcessEvents:
    """A subscription to the kernel's process events (``subscribe``); ``drain`` once per interval."""

    def __init__(self, sock: socket.socket) -> None:
        self._socket = sock

    @classmethod
    def subscribe(cls) -> ProcessEvents:
        """Listen to the kernel's process events; raises ProcessEventsUnavailable with the reason when the
        kernel does not answer (no connector, another pid or user namespace than the initial ones) or
        refuses (not allowed)."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                                 NETLINK_CONNECTOR)
        except OSError as exc:
            raise ProcessEventsUnavailable(exc.errno, f"no process events connector socket: {exc.strerror}") from exc
        try:
            _enlarge_receive_buffer(sock)
            sock.bind((0, CN_IDX_PROC))
            nonce = secrets.randbits(31)
            sock.send(_request(nonce, struct.pack("=I", PROC_CN_MCAST_LISTEN)))
            _await_ack(sock, nonce)
            # Kernels since 6.6 deliver only the events named in a second request's filter; older ones ignore
            # such a request (its length is not theirs) and keep sending every event, which drain sorts out.
            sock.send(_request(nonce, struct.pack("=II", PROC_CN_MCAST_LISTEN, WATCHED)))
        except OSError as exc:
            sock.close()
            if isinstance(exc, ProcessEventsUnavailable):
                raise
            raise ProcessEventsUnavailable(exc.errno, f"cannot listen to process events: {exc.strerror}") from exc
        return cls(sock)

    def drain(self) -> Changes:
        """Every event queued since the last drain: the processes named by a watched one, and whether the
        kernel dropped any since (the queue was full)."""
        changes = Changes(set(), set(), set(), False)
        while True:
            try:
                data = self._socket.recv(4096)
            except BlockingIOError:
                return changes
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                changes.lost = True  # the kernel dropped events: reading on gives the ones after
                continue
            if len(data) < _TASK_AT + _TASK.size:
                continue
            what = _EVENT_HEAD.unpack_from(data, _EVENT_AT)[0]
            if what & WATCHED:
                pid, tgid = _TASK.unpack_from(data, _TASK_AT)
                changes.pids.add(tgid)
                if what == PROC_EVENT_EXEC:
                    changes.execs.add(tgid)
                elif what == PROC_EVENT_EXIT and pid == tgid:
                    changes.exits.add(tgid)

    def fileno(self) -> int:
        return self._socket.fileno()

    def close(self) -> None:
        self._socket.close()


def _enlarge_receive_buffer(sock: socket.socket) -> None:
    """As large a queue as allowed: root may pass the system's limit (SO_RCVBUFFORCE), others get up to it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, 33, RECEIVE_BUFFER_BYTES)  # SO_RCVBUFFORCE
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)


def _request(nonce: int, payload: bytes) -> bytes:
    """A connector message to the process events' callback, ``nonce`` in its acknowledgement field."""
    message = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, nonce, len(payload), 0) + payload
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(message), NLMSG_DONE, 0, 0, 0) + message


def _await_ack(sock: socket.socket, nonce: int) -> None:
    """Wait for the kernel's answer to the request sent with ``nonce`` (others' answers and events are
    skipped); raises ProcessEventsUnavailable when it refused or never answered."""
    while True:
        ready, _, _ = select.select([sock], [], [], ACK_TIMEOUT_SECONDS)
        if not ready:
            raise ProcessEventsUnavailable(errno.ETIMEDOUT, (
                "the kernel did not answer the process events subscription (no proc connector, or the agent "
                "is not in the initial pid and user namespaces)"))
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            continue
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                continue
            raise
        if len(data) < _TASK_AT + _ACK.size or _EVENT_HEAD.unpack_from(data, _EVENT_AT)[0] != PROC_EVENT_NONE:
            continue
        if struct.unpack_from("=I", data, _ACK_FIELD_AT)[0] != nonce + 1:
            continue  # another listener's answer
        error = _ACK.unpack_from(data, _TASK_AT)[0]
        if error:
            raise ProcessEventsUnavailable(error, f"the kernel refused the process events subscription: "
                                                  f"{os.strerror(error)}")
        return
