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
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import threading
from dataclasses import dataclass

from agentd.kineto import wire
from agentd.kineto.ratelimit import CauseLimitedLogger
from agentd.kineto.registry import Registry, RegistryFullError

log = logging.getLogger(__name__)

ABSTRACT_NAME = b"\0dynolog\0"  # the trailing NUL is part of the name
SOCKET_DIR_ENV = "KINETO_IPC_SOCKET_DIR"
_CREDENTIALS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_RECV_BUFFER = 64 * 1024


class EndpointError(Exception):
    """The endpoint cannot bind (another daemon holds the name, bad socket dir)."""


@dataclass(frozen=True)
class EndpointStats:
    received: int
    answered: int
    rejected: dict[str, int]


def socket_address(socket_dir: str | None) -> bytes | str:
    """Where libkineto looks for the daemon, given the same KINETO_IPC_SOCKET_DIR it sees."""
    if not socket_dir:
        return ABSTRACT_NAME
    path = os.path.join(socket_dir, "dynolog")
    if len(path.encode()) > 107:
        raise EndpointError(f"socket path {path!r} is longer than the 107 bytes AF_UNIX allows; "
                            f"use a shorter {SOCKET_DIR_ENV}")
    return path


class KinetoEndpoint:
    """Serves libkineto polls from its own thread until ``close()``."""

    def __init__(self, registry: Registry, socket_dir: str | None = None) -> None:
        self.registry = registry
        self.address = socket_address(socket_dir)
        self._limited = CauseLimitedLogger(log)
        self._received = 0
        self._answered = 0
        self._stop = threading.Event()
        self._sock = self._bind()
        # close() writes here: the thread sleeps in select() until a datagram or this, never polls.
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="kineto-ipc", daemon=True)
        self._thread.start()

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            if isinstance(self.address, str):
                if os.path.exists(self.address):
                    os.unlink(self.address)
                sock.bind(self.address)
                os.chmod(self.address, 0o666)  # trainers of any user must reach it
            else:
                sock.bind(self.address)
        except OSError as exc:
            sock.close()
            where = self.address if isinstance(self.address, str) else "@dynolog@ (abstract)"
            hint = " (is dynolog or another agentd running?)" if exc.errno == 98 else ""
            raise EndpointError(f"cannot bind the Kineto IPC socket {where}: {exc.strerror}{hint}") from exc
        sock.setblocking(False)  # a send to a client that does not read must fail at once, never wait
        return sock

    @property
    def description(self) -> str:
        return self.address if isinstance(self.address, str) else "@dynolog@"

    def stats(self) -> EndpointStats:
        return EndpointStats(self._received, self._answered, dict(self._limited.counts))

    def _serve(self) -> None:
        ancillary = socket.CMSG_SPACE(_CREDENTIALS.size)
        while not self._stop.is_set():
            try:
                readable, _, _ = select.select([self._sock, self._wake_reader], [], [])
                if self._sock not in readable:
                    continue  # woken by close()
                data, ancdata, flags, sender = self._sock.recvmsg(_RECV_BUFFER, ancillary)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                self._limited.warning("recv-error", "receiving on the Kineto socket failed: %s", exc)
                continue
            self._received += 1
            if flags & socket.MSG_TRUNC:
                self._limited.warning("oversized", "dropped a datagram larger than %d bytes from %r",
                                      _RECV_BUFFER, sender)
                continue
            self._handle(data, _sender_credentials(ancdata), sender)

    def _handle(self, data: bytes, credentials: tuple[int, int] | None, sender: bytes | str) -> None:
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
            host_pid = host_pid or message.pids[0]
            try:
                config = self.registry.poll(message.job_id, message.pids, host_pid, uid, message.wants_activities)
            except RegistryFullError as exc:
                self._limited.warning("registry-full", "pid %d not registered: %s", host_pid, exc)
                config = None
            reply = wire.poll_reply(config.text if config else "")
            if not self._send(reply, sender) and config is not None:
                self.registry.undeliver(message.job_id, message.pids, host_pid, config)
            elif config is not None:
                log.info("handed a trace config to pid %d (job %d)", host_pid, message.job_id)
            return
        self._send(reply, sender)

    def _send(self, reply: bytes, sender: bytes | str) -> bool:
        try:
            self._sock.sendto(reply, sender)
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
        self._sock.close()
        self._wake_reader.close()
        self._wake_writer.close()
        if isinstance(self.address, str):
            try:
                os.unlink(self.address)
            except FileNotFoundError:
                pass


def _sender_credentials(ancdata: list[tuple[int, int, bytes]]) -> tuple[int, int] | None:
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _CREDENTIALS.size:
            pid, uid, _gid = _CREDENTIALS.unpack_from(payload)
            return pid, uid
    return None
