"""Asking the local NCCL RAS service about a suspect job (the I/O half; ``nccl_ras`` parses).

The conversation, as NCCL's ``ncclras`` holds it (src/ras/client.cc; protocol 2 from NCCL
2.24): the client says ``CLIENT PROTOCOL 2``, the server ``SERVER PROTOCOL 2``; ``TIMEOUT
<s>`` (answered ``OK``) bounds how long RAS waits on each peer while gathering; ``SET FORMAT
json`` is answered ``OK`` from NCCL 2.28.7 and ``ERROR: Unknown command`` before it (then the
text form is read); ``STATUS`` is answered with the report, and the server closes.

Who listens is checked before a byte is sent: the agent is root and the port is anyone's to
take when no NCCL job holds it. The answer is believed only from a listener held by one of the
suspect job's rank processes (the ranks collector verified them) and owned by the job's owner;
any other listener is named in the reason and not spoken to. Every read is bounded in size and
time (``READ_DEADLINE_S`` in all), and a reading is taken at most once per ``REREAD_S`` per job,
on a thread of its own: the snapshot never waits for it.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from agentd import peer
from agentd.hang import nccl_ras

RAS_GATHER_TIMEOUT_S = 2   # TIMEOUT: how long RAS waits on each of its peers
READ_DEADLINE_S = 9.0      # the whole conversation: RAS's own limit is TIMEOUT + 5 s
MAX_LINE_BYTES = 1024      # a handshake answer
REREAD_S = 30.0            # a job still suspect is asked again after this long


class RasUnavailable(Exception):
    """RAS gave no answer to believe; the message says why, for the verdict."""


class Connection(Protocol):
    """What the conversation needs of a socket (a recording wrapper stands in for one in bench/)."""

    def sendall(self, data: bytes, /) -> None: ...
    def recv(self, size: int, /) -> bytes: ...
    def settimeout(self, value: float | None, /) -> None: ...


def ras_address(environ: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """Where RAS listens: ``NCCL_RAS_ADDR`` (``host:port``, as NCCL reads it) or 127.0.0.1:28028."""
    text = environ.get("NCCL_RAS_ADDR", "")
    if not text:
        return nccl_ras.DEFAULT_HOST, nccl_ras.DEFAULT_PORT
    host, _, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RasUnavailable(f"NCCL_RAS_ADDR={text!r} is not host:port")
    return ("127.0.0.1" if host == "localhost" else host), int(port)


def converse(conn: Connection, deadline: float, clock: Callable[[], float] = time.monotonic) -> tuple[str, bytes]:
    """The status conversation on a connected socket: (``"json"`` or ``"text"``, the raw answer)."""
    reader = _BoundedReader(conn, deadline, clock)
    conn.sendall(f"CLIENT PROTOCOL {nccl_ras.PROTOCOL}\n".encode())
    greeting = reader.line()
    if not greeting.startswith(b"SERVER PROTOCOL "):
        raise RasUnavailable(f"the listener is not NCCL RAS: it greeted with {_shown(greeting)}")
    conn.sendall(f"TIMEOUT {RAS_GATHER_TIMEOUT_S}\n".encode())
    if reader.line() != b"OK\n":
        raise RasUnavailable("RAS refused TIMEOUT")
    conn.sendall(b"SET FORMAT json\n")
    answer_format = "json" if reader.line() == b"OK\n" else "text"  # before 2.28.7: "ERROR: Unknown command"
    conn.sendall(b"STATUS\n")
    return answer_format, reader.rest()


def parse(answer_format: str, answer: bytes) -> nccl_ras.RasReport:
    try:
        if answer_format == "json":
            return nccl_ras.parse_json(answer)
        return nccl_ras.parse_text(answer)
    except nccl_ras.RasAnswerError as exc:
        raise RasUnavailable(f"its {answer_format} answer did not parse: {exc}") from None


class _BoundedReader:
    """Reads from the connection, never past ``MAX_ANSWER_BYTES`` or the deadline."""

    def __init__(self, conn: Connection, deadline: float, clock: Callable[[], float]) -> None:
        self._conn, self._deadline, self._clock = conn, deadline, clock
        self._buffer = b""

    def line(self) -> bytes:
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE_BYTES:
                raise RasUnavailable(f"a handshake line over {MAX_LINE_BYTES} bytes: not NCCL RAS")
            if not self._receive():
                raise RasUnavailable(f"the listener closed the connection after {_shown(self._buffer)}")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"

    def rest(self) -> bytes:
        while self._receive():
            if len(self._buffer) > nccl_ras.MAX_ANSWER_BYTES:
                raise RasUnavailable(f"its answer ran over {nccl_ras.MAX_ANSWER_BYTES >> 20} MiB: not read further")
        return self._buffer

    def _receive(self) -> bool:
        left = self._deadline - self._clock()
        if left <= 0:
            raise RasUnavailable(f"no complete answer within {READ_DEADLINE_S:g} s")
        self._conn.settimeout(left)
        try:
            chunk = self._conn.recv(65536)
        except TimeoutError:
            raise RasUnavailable(f"no complete answer within {READ_DEADLINE_S:g} s") from None
        self._buffer += chunk
        return bool(chunk)


def _shown(data: bytes) -> str:
    return repr(data[:60].decode("ascii", "replace")) if data else "nothing"


@dataclasses.dataclass(frozen=True)
class RasReading:
    """One reading for a job: the report, or why there is none (``unavailable``)."""

    report: nccl_ras.RasReport | None
    unavailable: str
    listener: str              # who held the port, as people read it ("" when nobody did)


def read_ras(address: tuple[str, int], job_uid: int | None, job_pids: Iterable[int],
             clock: Callable[[], float] = time.monotonic) -> RasReading:
    """Ask RAS at ``address`` about the job whose rank processes on this host are ``job_pids``."""
    pids = set(job_pids)
    listener = ""
    try:
        holder = _holder(address)
        listener = str(holder)
        if job_uid is not None and holder.uid != job_uid:
            raise RasUnavailable(f"{address[0]}:{address[1]} is held by {holder}, not by this job's owner: "
                                 "not asked, not believed")
        if not pids.intersection(holder.pids):
            raise RasUnavailable(f"{address[0]}:{address[1]} is held by {holder}, not by a NCCL rank of this job: "
                                 "not asked, not believed")
        deadline = clock() + READ_DEADLINE_S
        with socket.create_connection(address, timeout=READ_DEADLINE_S) as conn:
            answer_format, answer = converse(conn, deadline, clock)
        return RasReading(parse(answer_format, answer), "", listener)
    except RasUnavailable as exc:
        return RasReading(None, str(exc), listener)
    except ConnectionRefusedError:
        return RasReading(None, f"nothing listens on {address[0]}:{address[1]} (no NCCL >= 2.24 job on this "
                                "host, or NCCL_RAS_ENABLE=0)", listener)
    except OSError as exc:
        return RasReading(None, f"{address[0]}:{address[1]}: {exc.strerror or exc}", listener)


def _holder(address: tuple[str, int]) -> peer.Listener:
    try:
        holder = peer.tcp_listener(address)
    except peer.PeerLookupError as exc:
        raise RasUnavailable(f"who listens on {address[0]}:{address[1]} is unknown ({exc}): not asked") from None
    if holder is None:
        raise ConnectionRefusedError
    return holder


@dataclasses.dataclass(frozen=True)
class JobKey:
    job_id: str
    uid: int | None


class RasWatch:
    """The latest RAS reading of each suspect job, taken on a thread, at most once per ``REREAD_S``."""

    def __init__(self, read: Callable[[JobKey, frozenset[int]], RasReading],
                 clock: Callable[[], float] = time.monotonic, reread_s: float = REREAD_S) -> None:
        self._read, self._clock, self._reread_s = read, clock, reread_s
        self._readings: dict[JobKey, RasReading] = {}
        self._asked_at: dict[JobKey, float] = {}
        self._lock = threading.Lock()

    def reading(self, job: JobKey, pids: frozenset[int]) -> RasReading | None:
        """The job's latest reading (None before the first one is in); starts a new one when due."""
        now = self._clock()
        with self._lock:
            due = now - self._asked_at.get(job, -self._reread_s) >= self._reread_s
            if due:
                self._asked_at[job] = now
            latest = self._readings.get(job)
        if due:
            threading.Thread(target=self._take, args=(job, pids), name="nccl-ras", daemon=True).start()
        return latest

    def keep_only(self, jobs: set[JobKey]) -> None:
        """Forget the jobs no longer suspect, so that a new suspicion reads RAS afresh."""
        with self._lock:
            self._readings = {k: v for k, v in self._readings.items() if k in jobs}
            self._asked_at = {k: v for k, v in self._asked_at.items() if k in jobs}

    def _take(self, job: JobKey, pids: frozenset[int]) -> None:
        reading = self._read(job, pids)
        with self._lock:
            if job in self._asked_at:  # still suspect
                self._readings[job] = reading


def read_local(job: JobKey, pids: frozenset[int]) -> RasReading:
    """The agent's reading: RAS where this agent's ``NCCL_RAS_ADDR`` says, else 127.0.0.1:28028."""
    try:
        address = ras_address()
    except RasUnavailable as exc:
        return RasReading(None, str(exc), "")
    return read_ras(address, job.uid, pids)
