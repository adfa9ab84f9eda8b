"""dynolog's TCP RPC (port 1778), so the stock ``dyno`` CLI works against agentd. Off by default.

Framing as dynolog: an int32 little-endian length, then that many bytes of JSON
with an ``"fn"`` key; one request per connection; replies are compact JSON with
sorted keys. It listens on both loopbacks, 127.0.0.1 and ::1 (``dyno``'s default
``--hostname localhost`` resolves to ::1 first on Debian) and never elsewhere,
whatever the gRPC side does: the caller is the local user the kernel says owns
the connecting socket (``agentd.peer``), who may trigger only their own
processes (root any). Every option ``dyno gputrace`` sends is honoured; a key
agentd does not pass on or a bad value refuses the whole request with a ``"refused"``
reason that ``dyno`` prints. The log file may be any absolute path (see
``_checked_log_file`` for what is refused and why): agentd only names it in the config,
the trainer writes it with its own rights, so the caller's identity is what is checked —
the kernel's owner of the calling socket must own the trainer, or be root — and, for a
path outside the trainer's folder of the trace dir, that the trainer acts with exactly its
owner's rights (``owner_rights``), then and when it takes the config. The agent itself
creates nothing there, copies nothing there, and serves nothing from there.
``dcgmProfPause``/``dcgmProfResume`` pause and resume
agentd's own GPM sampling (``GpmPause``: the GPU collector) so that Nsight Compute
can have the counters, answering ``true`` as dynolog does when it paused DCGM's
profiling; ``false`` where there is nothing to pause (no GPU with GPM), as dynolog
without DCGM. Stricter than dynolog, which lets anyone pause: root may, another
local user only while a process of theirs runs on a GPU of the host (the one they
mean to profile); anyone else gets ``false`` with a ``"refused"`` reason. Requests are bounded (size, nesting, list lengths; no NaN or
Infinity). A bad request gets no reply, as with dynolog — or ``{"status": "failed"}``
for a malformed on-demand request — and one rate-limited log line per cause,
never a traceback.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import pathlib
import posixpath
import re
import secrets
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentd.auth import Caller
from agentd.kineto import config as kineto_config
from agentd.kineto.namespaces import CONTAINER_TRACE_FOLDER, ContainerTraceError, sees_folder
from agentd.kineto.ratelimit import CauseLimitedLogger
from agentd.kineto.registry import BusyError, PendingConfig, Registrant, Registry
from agentd.peer import PeerLookupError, tcp_socket_uid
from agentd.procfs import Credentials, credentials, ineligible_reason, real_uid, uses_cuda
from agentd.text import printable

log = logging.getLogger(__name__)

LOOPBACKS = ("127.0.0.1", "::1")
MAX_REQUEST_BYTES = 64 * 1024
MAX_NESTING = 8
MAX_PIDS = 4096
MAX_PID = 1 << 22
MAX_JOB_ID = (1 << 63) - 1
MAX_CONFIG_LINES = 64
MAX_REASONS_SHOWN = 3  # per reply: why processes were left out
MAX_PAUSE_SECONDS = 24 * 3600
# How long the agent waits for a containerised trainer's trace to copy it out (a dyno request has no deadline).
CONTAINER_TRACE_SECONDS = 3600.0
READ_TIMEOUT_SECONDS = 5.0
LOG_FILE_KEY = "ACTIVITIES_LOG_FILE"
# The keys a client's config may set (every one ``dyno gputrace`` sends, and the
# other plain trace knobs). Anything else (EVENTS_LOG_FILE, ...) refuses the request.
ALLOWED_KEYS = frozenset({
    "ACTIVITY_TYPES", "ACTIVITIES_DURATION_MSECS", "ACTIVITIES_DURATION_SECS", "ACTIVITIES_ITERATIONS",
    "ACTIVITIES_WARMUP_PERIOD_SECS", "ACTIVITIES_WARMUP_ITERATIONS", "PROFILE_START_TIME",
    "PROFILE_START_ITERATION", "PROFILE_START_ITERATION_ROUNDUP", "PROFILE_REPORT_INPUT_SHAPES",
    "PROFILE_PROFILE_MEMORY", "PROFILE_MEMORY", "PROFILE_MEMORY_DURATION_MSECS", "PROFILE_WITH_STACK",
    "PROFILE_WITH_FLOPS", "PROFILE_WITH_MODULES", "REQUEST_TRACE_ID", "REQUEST_GROUP_TRACE_ID",
})
# Options that need libkineto's Python tracer: without python_function among the
# activity types the trace has neither Python frames nor module events.
PYTHON_TRACER_KEYS = ("PROFILE_WITH_STACK", "PROFILE_WITH_MODULES")
_TRUE = frozenset({"1", "t", "true", "y", "yes"})  # libkineto's true spellings (any case)
_VALUE = re.compile(r"[A-Za-z0-9._,:+-]{0,256}")
MAX_LOG_FILE_CHARS = 1024
FAILED: dict[str, Any] = {"status": "failed"}

# The folder a uid's traces go into (created on demand), from the trace area.
UserFolder = Callable[[int], pathlib.Path]


class BadRequest(ValueError):
    """A request refused: ``cause`` keys the rate-limited log line, ``reply`` is what the client gets (None: nothing)."""

    def __init__(self, cause: str, message: str, reply: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.reply = reply


def _result(matched: list[int], triggered: list[int], busy: int) -> dict[str, Any]:
    """An on-demand reply with dynolog's five keys."""
    return {"activityProfilersBusy": busy, "activityProfilersTriggered": triggered, "eventProfilersBusy": 0,
            "eventProfilersTriggered": [], "processesMatched": matched}


class Refused(BadRequest):
    """An on-demand request agentd will not carry out: ``dyno`` prints the reply, ``"refused"`` says why,
    and the empty ``processesMatched`` keeps ``dyno`` from failing on a missing key."""

    def __init__(self, message: str) -> None:
        super().__init__("rpc-refused", message, {**_result([], [], 0), "refused": message})


def _reply(value: dict[str, Any]) -> bytes:
    body = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return struct.pack("<i", len(body)) + body


@dataclass(frozen=True)
class ClientConfig:
    """A client's on-demand config, checked: its ``KEY=value`` lines but the log file, and the log file."""

    lines: list[str]
    log_file: str | None

    def text(self, log_file: str, cuda: bool, trace_id: str) -> str:
        """The config for one process writing to ``log_file``: activity types set (with Python functions
        when stacks or modules are asked for) and a ``REQUEST_TRACE_ID`` appended, as dynolog does."""
        lines = [f"{LOG_FILE_KEY}={log_file}", *self.lines]
        if not self._has("ACTIVITY_TYPES"):
            types = kineto_config.activity_types(cuda, with_stack=any(self._true(k) for k in PYTHON_TRACER_KEYS))
            lines.append("ACTIVITY_TYPES=" + ",".join(types))
        if not self._has("REQUEST_TRACE_ID"):
            lines.append(f"REQUEST_TRACE_ID={trace_id}")
        for line in lines:
            kineto_config.check_line(line)
        return "\n".join(lines) + "\n"

    def _has(self, key: str) -> bool:
        return any(line.startswith(key + "=") for line in self.lines)

    def _true(self, key: str) -> bool:
        return any(line.lower() in {f"{key.lower()}={t}" for t in _TRUE} for line in self.lines)


def client_config(text: str, now_ms: int) -> ClientConfig:
    """The client's config checked line by line; Refused naming the first line agentd will not pass on.
    Lines end at ``\n`` only, as libkineto reads them: any other control character stays in its line."""
    raw_lines = [line for line in text.split("\n") if line.split("#", 1)[0].strip()]
    if len(raw_lines) > MAX_CONFIG_LINES:
        raise Refused(f"config has {len(raw_lines)} lines; at most {MAX_CONFIG_LINES}")
    lines: list[str] = []
    log_file = None
    for raw in raw_lines:
        key, sep, value = (piece.strip() for piece in raw.split("#", 1)[0].partition("="))
        if key == LOG_FILE_KEY:
            log_file = _checked_log_file(value)
            continue
        if key not in ALLOWED_KEYS:
            raise Refused(f"agentd does not pass {printable(key[:64])} on to trainers; accepted keys: "
                          f"{LOG_FILE_KEY}, {', '.join(sorted(ALLOWED_KEYS))}")
        if not sep or not _VALUE.fullmatch(value):
            raise Refused(f"config line for {key} must be {key}=<letters, digits, . _ , : + ->")
        if key == "PROFILE_START_TIME" and value.isdigit() and 0 < int(value) < now_ms:
            raise Refused(f"profile start time {value} is {(now_ms - int(value)) / 1000:.1f} s in the past; "
                          f"give 0 (start after the next poll) or a time at least 10 s ahead")
        lines.append(f"{key}={value}")
    return ClientConfig(lines, log_file)


def _checked_log_file(value: str) -> str:
    """``value`` as a log file path a trainer may be told; Refused otherwise.

    None of these refusals is what keeps users apart (the trainer writes with its own rights); each
    keeps the file from landing somewhere other than where ``dyno`` says: a control character
    would end the config line (or hide in a name shown later), a relative path would be resolved
    against the trainer's working directory, '=' would break Kineto's ``KEY=value`` line, and
    Kineto since June 2026 replaces a path holding '..' anywhere by its own default in /tmp. The
    path must also be written plainly (no '.' or empty component), so that whether it lies in the
    user's folder of the trace dir is a plain prefix test."""
    shown = repr(value[:200])
    if not value.isprintable():
        raise Refused(f"log file {shown} holds a control character; give a path of printable characters")
    if not value.startswith("/"):
        raise Refused(f"log file {shown} is relative: give an absolute path (the trainer does not run in "
                      "dyno's working directory)")
    if "=" in value or len(value) > MAX_LOG_FILE_CHARS:
        raise Refused(f"log file {shown} must hold no '=' (Kineto reads KEY=value lines) and at most "
                      f"{MAX_LOG_FILE_CHARS} characters")
    if ".." in value or posixpath.normpath(value) != value or value.startswith("//"):
        raise Refused(f"log file {shown} must be written plainly: no '..', no '.' component, no '//', no "
                      "trailing '/'")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def _nesting(text: str) -> int:
    """How deep arrays and objects nest in the JSON ``text`` (brackets inside strings do not count)."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return 0  # cannot be deeper: the common case, without a scan
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def decode(body: bytes) -> dict[str, Any]:
    """One request body as a JSON object with a string ``"fn"``; BadRequest otherwise."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("rpc-bad-json", "request is not UTF-8") from None
    if _nesting(text) > MAX_NESTING:
        raise BadRequest("rpc-too-deep", f"request nests arrays or objects deeper than {MAX_NESTING}")
    try:
        request = json.loads(text, parse_constant=_no_constant)
    except ValueError:  # also NaN/Infinity and numbers past Python's digit limit
        raise BadRequest("rpc-bad-json", "request is not JSON with finite numbers") from None
    if not isinstance(request, dict) or not isinstance(request.get("fn"), str):
        raise BadRequest("rpc-no-fn", 'request has no "fn"')
    return request


def _int_field(request: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = request.get(key, default)
    if type(value) is not int or not low <= value <= high:
        raise BadRequest("rpc-bad-request", f"{key} must be an integer {low}-{high}", FAILED)
    return value


def _inside(path: str, folder: pathlib.Path) -> bool:
    """Whether ``path`` (absolute, written plainly: ``_checked_log_file``) lies below ``folder``."""
    return path.startswith(str(folder).rstrip("/") + "/")


@dataclass(frozen=True)
class LogTarget:
    """One process to trace and the file it is told to write."""

    entry: Registrant
    log_file: str
    # False: a path of the caller's choosing, written by the trainer in its own file system, never by the agent.
    in_trace_folder: bool = True
    acting_as: Credentials | None = None  # the rights the trainer must still have when it takes the config


class TrainerRightsError(Exception):
    """A trainer that does not act with exactly its owner's rights (the message says how)."""


def owner_rights(entry: Registrant) -> Credentials | None:
    """The credentials ``entry`` writes a file of the caller's choosing with, which must be its owner's and
    no more (None: a root trainer, which has every right already); TrainerRightsError otherwise.

    This is what makes "the trainer writes it with its own rights" a bound: a process the owner started
    from a set-user-ID or set-group-ID program, or one that gained capabilities through an exec (the kernel
    then makes it non-dumpable), has rights its owner lacks, and the owner must not be able to aim them."""
    if entry.uid == 0:
        return None
    held = credentials(entry.host_pid, entry.uid)
    changed = "it exited" if held is None else ineligible_reason(entry.host_pid, held)
    if changed:
        raise TrainerRightsError(f"{changed}; a log file outside the trace dir is written with the trainer's "
                                 "rights, which must be exactly its owner's")
    return held


def bind_loopbacks(port: int) -> list[socket.socket]:
    """Listening sockets on 127.0.0.1 and ::1 at the same ``port`` (0: one free port for both);
    ::1 is left out, with a log line, on a host without IPv6 loopback. OSError as from bind."""
    v4 = socket.create_server((LOOPBACKS[0], port), family=socket.AF_INET)
    try:
        v6 = socket.create_server((LOOPBACKS[1], v4.getsockname()[1]), family=socket.AF_INET6)
    except OSError as exc:
        if exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            v4.close()
            raise
        log.warning("dynolog RPC on 127.0.0.1 only: no IPv6 loopback", extra={"reason": exc.strerror})
        return [v4]
    return [v4, v6]


class GpmPause(Protocol):
    """What dcgm-pause/resume act on (agentd.collectors.gpu.GpuCollector); each says whether it did."""

    def pause_gpm(self, seconds: int) -> bool: ...

    def resume_gpm(self) -> bool: ...

    def gpu_pids(self) -> set[int]: ...

    def has_gpm(self) -> bool: ...


class ContainerCopies(Protocol):
    """Copies a containerised trainer's trace out to the trace dir once written
    (agentd.traces.container_traces.ContainerTraces); ContainerTraceError when it cannot."""

    def expect(self, registrant: Registrant, inside: str, destination: str, deadline: float) -> object: ...


class DynologRpc:
    """Answers dyno's calls (status, version, gputrace, dcgm-pause/resume) on already bound sockets.

    A trainer in a container (another mount namespace) writes its trace into its own /tmp, and
    ``container_copies`` puts it where the request said, as it would be for a trainer on the host."""

    def __init__(self, socks: list[socket.socket], registry: Registry, user_folder: UserFolder,
                 version: str, gpm: GpmPause | None = None, container_copies: ContainerCopies | None = None) -> None:
        self.socks = socks
        self.registry = registry
        self.user_folder = user_folder
        self.container_copies = container_copies
        self.version = version
        self.gpm = gpm  # None: no GPU collector runs, nothing to pause
        self._limited = CauseLimitedLogger(log)
        self._servers: list[asyncio.AbstractServer] = []

    @classmethod
    def bind(cls, port: int, registry: Registry, user_folder: UserFolder, version: str,
             gpm: GpmPause | None = None, container_copies: ContainerCopies | None = None) -> DynologRpc:
        """Bind both loopbacks now (so a taken port fails agentd's start at once); OSError as from bind."""
        return cls(bind_loopbacks(port), registry, user_folder, version, gpm, container_copies)

    @property
    def port(self) -> int:
        return int(self.socks[0].getsockname()[1])

    async def serve(self) -> None:
        for sock in self.socks:
            self._servers.append(await asyncio.start_server(self._handle, sock=sock))
        log.info("dynolog RPC listening", extra={"port": self.port,
                                                 "addresses": ",".join(s.getsockname()[0] for s in self.socks)})

    def close(self) -> None:
        for server in self._servers:
            server.close()
        for sock in self.socks:
            sock.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            length = struct.unpack("<i", await asyncio.wait_for(reader.readexactly(4), READ_TIMEOUT_SECONDS))[0]
            if not 0 < length <= MAX_REQUEST_BYTES:
                self._limited.warning("rpc-bad-length", "request length %d outside 1-%d", length, MAX_REQUEST_BYTES)
                return
            body = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_SECONDS)
            peer_uid = await asyncio.to_thread(self._peer_uid, writer)
            answer = self.answer(body, peer_uid)
            if answer is not None:
                writer.write(_reply(answer))
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError) as exc:
            self._limited.warning("rpc-truncated", "connection ended mid-request: %s", type(exc).__name__)
        finally:
            writer.close()

    def _peer_uid(self, writer: asyncio.StreamWriter) -> int | None:
        """The local user behind the connection (the kernel's owner of the client's socket); None: unknown."""
        peer, local = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        try:
            return tcp_socket_uid((peer[0], peer[1]), (local[0], local[1]))
        except PeerLookupError as exc:
            self._limited.warning("rpc-peer-unknown", "cannot tell who is calling: %s", exc)
            return None

    def answer(self, body: bytes, peer_uid: int | None) -> dict[str, Any] | None:
        """The reply to one request body from a caller whose socket ``peer_uid`` owns (None: not known),
        or None (no reply, as dynolog); a refused request logs one line for its cause."""
        try:
            request = decode(body)
            if peer_uid is None:
                raise BadRequest("rpc-unknown-caller", "cannot tell which local user is calling; refused")
            return self._dispatch(request, Caller.local(peer_uid))
        except BadRequest as exc:
            self._limited.warning(exc.cause, "%s", exc, fields={"peer_uid": peer_uid})
            return exc.reply

    def _dispatch(self, request: dict[str, Any], caller: Caller) -> dict[str, Any]:
        fn = request["fn"]
        if fn == "getStatus":
            return {"status": 1}
        if fn == "getVersion":
            return {"version": self.version}
        if fn == "setKinetOnDemandRequest":
            return self._on_demand(request, caller)
        if fn in ("dcgmProfPause", "dcgmProfResume"):
            return self._dcgm(fn, request, caller)
        raise BadRequest("rpc-unknown-fn", f"unknown fn {fn[:64]!r}")

    def _dcgm(self, fn: str, request: dict[str, Any], caller: Caller) -> dict[str, Any]:
        """Pause (for ``duration_s``) or resume GPM sampling, for a caller who may (see the module
        docstring); every pause and resume is logged with its caller."""
        if fn == "dcgmProfPause" and "duration_s" not in request:
            return FAILED  # as dynolog
        seconds = _int_field(request, "duration_s", 0, 0, MAX_PAUSE_SECONDS) if fn == "dcgmProfPause" else 0
        if self.gpm is None or not self.gpm.has_gpm():
            log.info("dyno %s answered false: no GPU with GPM sampling to pause", fn, extra={"caller": str(caller)})
            return {"status": False}
        if not self._may_pause(caller, self.gpm):
            raise BadRequest("rpc-pause-refused", f"{caller} runs no process on this host's GPUs: only root or "
                                                  "the owner of a GPU process may pause GPM sampling",
                             {"status": False, "refused": f"you ({caller}) run no process on this host's GPUs; "
                                                          "only root or the owner of a GPU process may pause or "
                                                          "resume GPM sampling"})
        done = self.gpm.pause_gpm(seconds) if fn == "dcgmProfPause" else self.gpm.resume_gpm()
        log.info("dyno %s done", fn, extra={"caller": str(caller), "seconds": seconds})
        return {"status": done}

    @staticmethod
    def _may_pause(caller: Caller, gpm: GpmPause) -> bool:
        return caller.admin or any(caller.owns(real_uid(pid)) for pid in gpm.gpu_pids())

    def _on_demand(self, request: dict[str, Any], caller: Caller) -> dict[str, Any]:
        config, pids = request.get("config"), request.get("pids")
        if not isinstance(config, str) or not isinstance(pids, list) or len(pids) > MAX_PIDS:
            raise BadRequest("rpc-bad-request", f'setKinetOnDemandRequest needs "config" (text) and "pids" '
                                                f"(a list of at most {MAX_PIDS})", FAILED)
        if not all(type(p) is int and 0 <= p < MAX_PID for p in pids):
            raise BadRequest("rpc-bad-request", f"pids must be integers 0-{MAX_PID - 1}", FAILED)
        job_id = _int_field(request, "job_id", 0, 0, MAX_JOB_ID)
        limit = _int_field(request, "process_limit", 1000, 1, MAX_PIDS)
        checked = client_config(config, int(time.time() * 1000))
        entries = [e for e in self.registry.match(str(job_id), set(pids) - {0}) if caller.owns(e.uid)]
        # Another user's processes are neither traced nor shown to this caller.
        targets, left_out = self._targets(checked, [e for e in entries if self._traceable(e)])
        triggered: list[int] = []
        busy = 0
        for target in targets:
            if len(triggered) >= limit:
                break
            entry, log_file = target.entry, target.log_file
            in_container = target.in_trace_folder and self.container_copies is not None \
                and not sees_folder(entry.host_pid, posixpath.dirname(log_file))
            written_as = f"{CONTAINER_TRACE_FOLDER}/{posixpath.basename(log_file)}" if in_container else log_file
            try:
                pending = PendingConfig(checked.text(written_as, uses_cuda(entry.host_pid), str(secrets.randbits(63))),
                                        acting_as=target.acting_as)
                self.registry.offer(entry, pending)
            except kineto_config.ConfigValueError as exc:
                self._limited.warning("rpc-trace-dir", "the trace dir cannot be named in a config: %s", exc)
                continue
            except BusyError:
                busy += 1
                continue
            if in_container and not self._copy_out(entry, pending, written_as, log_file):
                continue
            triggered.append(entry.host_pid)
        log.info("dyno on-demand request", extra={"matched": len(entries), "triggered": len(triggered),
                                                  "busy": busy, "caller": str(caller)})
        reply = _result([e.host_pid for e in entries], triggered, busy)
        if left_out:
            reply["refused"] = "; ".join(left_out[:MAX_REASONS_SHOWN]) + (
                f"; and {len(left_out) - MAX_REASONS_SHOWN} more" if len(left_out) > MAX_REASONS_SHOWN else "")
        return reply

    def _copy_out(self, entry: Registrant, pending: PendingConfig, written_as: str, log_file: str) -> bool:
        """Have the trace the containerised ``entry`` writes as ``written_as`` copied to ``log_file`` (Kineto's
        ``_<pid>`` with the host pid, as for a trainer on the host); False, the config taken back, when not."""
        assert self.container_copies is not None
        try:
            self.container_copies.expect(entry, kineto_config.kineto_file_name(written_as, entry.pid_in_namespace),
                                         kineto_config.kineto_file_name(log_file, entry.host_pid),
                                         time.time() + CONTAINER_TRACE_SECONDS)
        except ContainerTraceError as exc:
            self.registry.withdraw(entry, pending)
            self._limited.warning("rpc-container-trace", "pid %d not traced: %s", entry.host_pid, exc)
            return False
        return True

    def _traceable(self, entry: Registrant) -> bool:
        """Whether agentd may hand this process a config: its own user's (or any, as root), still alive as that user."""
        agent_uid = os.geteuid()
        return (agent_uid == 0 or entry.uid == agent_uid) and real_uid(entry.host_pid) == entry.uid

    def _targets(self, checked: ClientConfig, entries: list[Registrant]) -> tuple[list[LogTarget], list[str]]:
        """Each entry with the file it writes (the client's log file, or a name agentd picks in the traced
        user's folder of the trace dir), and why the others are left out."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        targets, left_out = [], []
        for entry in entries:
            try:
                folder = self.user_folder(entry.uid)
            except OSError as exc:
                self._limited.warning("rpc-trace-dir", "cannot create the folder for uid %d: %s", entry.uid,
                                      exc.strerror)
                continue
            if checked.log_file is None:
                targets.append(LogTarget(entry, str(folder / f"dyno-{stamp}-pid{entry.host_pid}.pt.trace.json")))
            elif _inside(checked.log_file, folder):
                targets.append(LogTarget(entry, checked.log_file))
            else:
                try:
                    rights = owner_rights(entry)
                except TrainerRightsError as exc:
                    left_out.append(f"pid {entry.host_pid} not traced: {exc}")
                    continue
                targets.append(LogTarget(entry, checked.log_file, in_trace_folder=False, acting_as=rights))
        return targets, left_out
