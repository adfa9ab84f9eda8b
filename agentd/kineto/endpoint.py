"""The datagram socket libkineto polls: ``\\0dynolog\\0`` (abstract) or ``$KINETO_IPC_SOCKET_DIR/dynolog``.

One thread receives and answers each datagram at once (libkineto waits only
~90 ms for a reply; a late one is read by its *next* poll as if it were the
config). Sends never block: a client that vanished or whose buffer is full
loses that reply, the loop keeps serving. SO_PASSCRED gives the kernel's view
of each sender (pid in our namespace, uid).

A poll's type asks for event (PMU) configs, activity configs, or both: real
libkineto asks for both, and for events only while an activity trace runs.
dynolog answers the event part with the event config stored for the process, and
its RPC only ever stores activity configs, so that part is always empty; agentd
answers the same way (an events-only poll gets an empty config, and a pending
activity config waits for the next poll that asks for activities).

Besides the host-wide socket, a root agent serves each local user who asks
(``user_folder``) a socket in a folder of their own, ``/run/tuiprof/kineto/<uid>/``
(0700, the user's): a job started with ``KINETO_IPC_SOCKET_DIR`` set to it binds its
client socket there, where no other user can find or reach it (the abstract
``@dynoconfigclient<uuid>`` of the default mode takes any datagram from anyone). Such a
socket answers only its user's and root's processes. Every poll's pid ancestry is
checked against /proc (agentd.kineto.ancestry) before the registry sees it.

A root agent serving the abstract name also serves it inside other network
namespaces where a process asks for Kineto's daemon (containers, pods:
agentd.kineto.namespaces); those sockets are served like the host's.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import select
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass

from agentd.kineto import wire
from agentd.kineto.ancestry import real_ancestry
from agentd.kineto.holder import describe_holders
from agentd.kineto.namespaces import NamespaceSockets
from agentd.kineto.ratelimit import CauseLimitedLogger
from agentd.kineto.registry import Registry, RegistryFullError

log = logging.getLogger(__name__)

ABSTRACT_NAME = b"\0dynolog\0"  # the trailing NUL is part of the name
SOCKET_DIR_ENV = "KINETO_IPC_SOCKET_DIR"
_CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_RECV_BUFFER = 64 * 1024
USER_FOLDERS = "/run/tuiprof/kineto"  # a root agent's per-user folders: USER_FOLDERS/<uid>/dynolog
CLIENT_NAME_BYTES = len("dynoconfigclient") + 36  # libkineto's client socket name: the prefix and a UUID
_ADDRESS_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
BIND_RETRY_SECONDS = 5.0  # a host-wide name held by another process is tried again this often


class EndpointError(Exception):
    """The endpoint cannot bind (another daemon holds the name, bad socket dir)."""


class UserFolderError(Exception):
    """A user's Kineto folder cannot be prepared (the message says why)."""


@dataclass(frozen=True)
class EndpointStats:
    received: int
    answered: int
    rejected: dict[str, int]
    namespaces: int  # other network namespaces served (containers)


def socket_address(socket_dir: str | None) -> bytes | str:
    """Where libkineto looks for the daemon, given the same KINETO_IPC_SOCKET_DIR it sees."""
    if not socket_dir:
        return ABSTRACT_NAME
    path = os.path.join(socket_dir, "dynolog")
    if len(path.encode()) > _ADDRESS_MAX:
        raise EndpointError(f"socket path {path!r} is longer than the 107 bytes AF_UNIX allows; "
                            f"use a shorter {SOCKET_DIR_ENV}")
    return path


def client_sockets_fit(folder: str) -> bool:
    """Whether libkineto's client sockets in ``folder`` (``dynoconfigclient<uuid>``) fit in an AF_UNIX path."""
    return len(folder.encode()) + 1 + CLIENT_NAME_BYTES <= _ADDRESS_MAX


class KinetoEndpoint:
    """Serves libkineto polls from its own thread until ``close()``.

    The host-wide socket (``address``) may be held by another process at start:
    ``unavailable`` then says by whom, and the serving thread tries the name again
    every BIND_RETRY_SECONDS. With ``containers`` (a root agent on the abstract name),
    ``serve_namespaces()`` also serves the name in other network namespaces."""

    def __init__(self, registry: Registry, socket_dir: str | None = None,
                 user_folders: str | None = None, containers: bool = False) -> None:
        self.registry = registry
        self.address = socket_address(socket_dir)
        self.user_folders = user_folders
        self.unavailable = ""
        self._limited = CauseLimitedLogger(log)
        self._received = 0
        self._answered = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # Each served socket and the one user it answers (None: anyone, the host-wide socket).
        self._sockets: dict[socket.socket, int | None] = {}
        self._user_sockets: dict[int, socket.socket] = {}
        self._retired: list[socket.socket] = []  # no longer served: the serving thread closes them
        self._next_bind = 0.0
        self._namespaces = NamespaceSockets(self._bind_abstract, self._limited) \
            if containers and isinstance(self.address, bytes) else None
        # close() and new sockets write here: the thread sleeps in select() until a datagram or this.
        self._wake_reader, self._wake_writer = socket.socketpair()
        self.retry_bind()
        if self.unavailable and (user_folders is None or isinstance(self.address, str)):
            self._wake_reader.close()
            self._wake_writer.close()
            raise EndpointError(self.unavailable)  # nothing else to serve, or a folder: not a squat to wait out
        if self.unavailable:
            log.warning("Kineto IPC socket unavailable; retrying every %g s", BIND_RETRY_SECONDS,
                        extra={"reason": self.unavailable})
        self._thread = threading.Thread(target=self._serve, name="kineto-ipc", daemon=True)
        self._thread.start()

    def retry_bind(self) -> bool:
        """Bind the host-wide socket if not yet bound and due (True: bound now or before); the
        constructor's thread, then only the serving thread, call it."""
        if not self.unavailable and self._sockets:
            return True
        now = time.monotonic()
        if now < self._next_bind:
            return False
        self._next_bind = now + BIND_RETRY_SECONDS
        try:
            sock = self._bind()
        except EndpointError as exc:
            self.unavailable = str(exc)  # the holder may have changed: name the current one
            return False
        if self.unavailable:
            log.warning("Kineto IPC socket bound after all", extra={"socket": self.description})
        self.unavailable = ""
        self._add(sock, None)
        return True

    def _add(self, sock: socket.socket, uid: int | None) -> None:
        with self._lock:
            if self._stop.is_set():  # closed meanwhile (a namespace's socket bound during close())
                sock.close()
                return
            self._sockets[sock] = uid
        self._wake_writer.send(b"\1")  # select() again, over the new set

    def _retire(self, sock: socket.socket) -> None:
        with self._lock:
            if self._stop.is_set():  # close() closes every served socket
                return
            del self._sockets[sock]
            self._retired.append(sock)
        self._wake_writer.send(b"\1")  # select() again, without it; the serving thread closes it

    def serve_namespaces(self) -> None:
        """Serve the abstract name in the network namespaces that want it now (a root agent's, every
        few seconds: agentd.kineto.namespaces); the kineto collector's tick calls it."""
        if self._namespaces is None or self._stop.is_set():
            return
        added, gone = self._namespaces.rescan()
        for sock in added:
            self._add(sock, None)
        for sock in gone:
            self._retire(sock)

    @staticmethod
    def _bind_abstract() -> socket.socket:
        """A non-blocking socket bound to ``@dynolog@`` in the calling thread's network namespace."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(ABSTRACT_NAME)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        return sock

    def _bind(self) -> socket.socket:
        if isinstance(self.address, bytes):
            try:
                return self._bind_abstract()
            except OSError as exc:
                hint = ""
                if exc.errno == errno.EADDRINUSE:
                    hint = f": {describe_holders(self.address)} (dynolog, another agentd, or a squatter)"
                raise EndpointError(f"cannot bind the Kineto IPC socket @dynolog@ (abstract): {exc.strerror}{hint}") \
                    from exc
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            if os.path.exists(self.address):
                os.unlink(self.address)
            sock.bind(self.address)
            os.chmod(self.address, 0o666)  # trainers of any user must reach it
        except OSError as exc:
            sock.close()
            raise EndpointError(f"cannot bind the Kineto IPC socket {self.address}: {exc.strerror}") from exc
        sock.setblocking(False)  # a send to a client that does not read must fail at once, never wait
        return sock

    def user_folder(self, uid: int) -> str:
        """The folder whose ``dynolog`` socket serves only ``uid`` (and root), prepared on first ask.

        Root never follows a path the user can change: the folder is taken back
        (fchown to root through an O_NOFOLLOW handle, in a root-owned parent) while
        the socket is bound and handed over, then given to the user."""
        if self.user_folders is None:
            raise UserFolderError("this agent serves no per-user Kineto folders (it is not root)")
        folder = os.path.join(self.user_folders, str(uid))
        if not client_sockets_fit(folder):
            raise UserFolderError(f"{folder} is too long for libkineto's client socket names "
                                  f"(AF_UNIX paths hold {_ADDRESS_MAX} bytes)")
        path = os.path.join(folder, "dynolog")
        with self._lock:
            served = self._user_sockets.get(uid)
        try:
            if served is not None and stat.S_ISSOCK(os.lstat(path).st_mode):
                return folder
        except FileNotFoundError:
            pass  # the user removed it: bind a new one
        try:
            sock = self._bind_user(folder, path, uid)
        except OSError as exc:
            raise UserFolderError(f"cannot prepare {folder}: {exc.strerror or exc}") from exc
        with self._lock:
            old = self._user_sockets.pop(uid, None)
            if old is not None:
                del self._sockets[old]
            self._user_sockets[uid] = sock
        if old is not None:
            old.close()
        self._add(sock, uid)
        log.info("Kineto IPC folder served", extra={"uid": uid, "socket": path})
        return folder

    def _bind_user(self, folder: str, path: str, uid: int) -> socket.socket:
        parent = self.user_folders
        assert parent is not None
        _root_folder(os.path.dirname(parent))
        _root_folder(parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = -1
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchown(fd, 0, 0)
            os.fchmod(fd, 0o700)  # now no one else can add, swap or remove names in it
            with contextlib.suppress(FileNotFoundError):
                os.unlink("dynolog", dir_fd=fd)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                sock.bind(path)
                os.chmod(path, 0o600, follow_symlinks=False)
                os.chown(path, uid, gid, follow_symlinks=False)
                sock.setblocking(False)
            except OSError:
                sock.close()
                raise
        finally:
            try:
                os.fchown(fd, uid, gid)  # the folder is the user's again (their job's client sockets go in it)
            finally:
                os.close(fd)
        return sock

    @property
    def description(self) -> str:
        return self.address if isinstance(self.address, str) else "@dynolog@"

    def stats(self) -> EndpointStats:
        return EndpointStats(self._received, self._answered, dict(self._limited.counts),
                             self._namespaces.served if self._namespaces is not None else 0)

    def _serve(self) -> None:
        ancillary = socket.CMSG_SPACE(_CREDENTIALS.size)
        while not self._stop.is_set():
            with self._lock:
                served = dict(self._sockets)
            try:
                # While another process holds the host-wide name, wake up to try it again.
                readable, _, _ = select.select([*served, self._wake_reader], [], [],
                                               BIND_RETRY_SECONDS if self.unavailable else None)
            except (OSError, ValueError):  # a user socket closed while waited on: take the new set
                continue
            if self.unavailable:
                self.retry_bind()
            if self._wake_reader in readable:
                self._wake_reader.recv(64)
            for sock in readable:
                if sock in served:
                    self._receive(sock, served[sock], ancillary)
            with self._lock:
                retired, self._retired = self._retired, []
            for sock in retired:
                sock.close()

    def _receive(self, sock: socket.socket, user: int | None, ancillary: int) -> None:
        try:
            data, ancdata, flags, sender = sock.recvmsg(_RECV_BUFFER, ancillary)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if not self._stop.is_set():
                self._limited.warning("recv-error", "receiving on the Kineto socket failed: %s", exc)
            return
        self._received += 1
        if flags & socket.MSG_TRUNC:
            self._limited.warning("oversized", "dropped a datagram larger than %d bytes from %r",
                                  _RECV_BUFFER, sender)
            return
        credentials = _sender_credentials(ancdata)
        if user is not None and (credentials is None or credentials[1] not in (user, 0)):
            self._limited.warning("foreign-sender", "ignored a datagram to uid %d's socket from uid %s",
                                  user, credentials[1] if credentials else "unknown")
            return
        self._handle(data, credentials, sender, sock)

    def _handle(self, data: bytes, credentials: tuple[int, int] | None, sender: bytes | str,
                sock: socket.socket) -> None:
        try:
            message = wire.parse(data)
        except wire.FrameError as exc:
            self._limited.warning(exc.cause, "ignored datagram from %r: %s", sender, exc)
            return
        if not sender:
            self._limited.warning("unnamed-sender", "cannot answer a client with an unnamed (unbound) socket")
            return
        host_pid, uid = credentials if credentials else (0, -1)
        if isinstance(message, wire.ContextMessage):
            # Registers a GPU context only; dynolog's count table is not used for tracing.
            reply = wire.context_reply(1)
        else:
            pids = self._believed(message.pids, host_pid)
            if not pids:
                return
            try:
                config = self.registry.poll(message.job_id, pids, host_pid, uid, message.wants_activities,
                                            pid_in_namespace=message.pids[0])
            except RegistryFullError as exc:
                self._limited.warning("registry-full", "pid %d not registered: %s", host_pid, exc)
                config = None
            reply = wire.poll_reply(config.text if config else "")
            if not self._send(sock, reply, sender) and config is not None:
                self.registry.undeliver(message.job_id, pids, host_pid, config)
            elif config is not None:
                log.info("handed a trace config to pid %d (job %d)", host_pid, message.job_id)
            return
        self._send(sock, reply, sender)

    def _believed(self, claimed: tuple[int, ...], host_pid: int) -> tuple[int, ...]:
        """The part of a poll's pid ancestry that /proc confirms, as host pids (empty: the poll is
        refused). ``claimed`` is in the sender's pid namespace (a container's pids)."""
        real = real_ancestry(host_pid) if host_pid > 0 else None
        if real is None:
            self._limited.warning("unverifiable-ancestry", "ignored a poll from a process the agent cannot see "
                                  "in /proc (kernel pid %d; it claims pids %s)", host_pid, list(claimed[:3]))
            return ()
        believed = real.believed(claimed)
        if len(believed) != len(claimed):
            self._limited.warning("forged-ancestry", "pid %d claims the ancestry %s, /proc says %s; %s",
                                  host_pid, list(claimed), list(real.seen),
                                  f"kept {list(claimed[:len(believed)])}" if believed else "poll ignored")
        return believed

    def _send(self, sock: socket.socket, reply: bytes, sender: bytes | str) -> bool:
        try:
            sock.sendto(reply, sender)
        except (ConnectionRefusedError, FileNotFoundError):
            self._limited.warning("client-gone", "client %r vanished before its reply", sender)
        except BlockingIOError:
            self._limited.warning("client-full", "client %r is not reading; reply dropped", sender)
        except OSError as exc:
            self._limited.warning("send-error", "reply to %r failed: %s", sender, exc)
        else:
            self._answered += 1
            return True
        return False

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake_writer.send(b"\0")
        self._thread.join(timeout=2)
        with self._lock:
            served = [*self._sockets, *self._retired]
            self._sockets.clear()
            self._user_sockets.clear()
            self._retired.clear()
        for sock in served:
            sock.close()
        self._wake_reader.close()
        self._wake_writer.close()
        if isinstance(self.address, str) and not self.unavailable:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address)


def _root_folder(path: str) -> None:
    """``path`` is a folder only root can change (created 0711 when missing), or UserFolderError."""
    try:
        os.mkdir(path, 0o711)
        os.chmod(path, 0o711, follow_symlinks=False)  # mkdir's mode went through the umask
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UserFolderError(f"{path} is not a folder that only root can change "
                              f"(owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)})")


def _sender_credentials(ancdata: list[tuple[int, int, bytes]]) -> tuple[int, int] | None:
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _CREDENTIALS.size:
            pid, uid, _gid = _CREDENTIALS.unpack_from(payload)
            return pid, uid
    return None
