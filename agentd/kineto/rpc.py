"""dynolog's TCP RPC (port 1778), so an existing ``dyno gputrace`` works against agentd. Off by default.

Framing as dynolog: an int32 little-endian length, then that many bytes of JSON
with an ``"fn"`` key; one request per connection; replies are compact JSON with
sorted keys. Deliberate deviations, for safety: it listens only where agentd's
gRPC listens (loopback unless a token is configured) and, with a token, a
request must carry ``"token"``; without one, the caller is the local user the
kernel says owns the connecting socket (``agentd.peer``), who may trigger only
their own processes (root and the token holder any). The client's config keeps
only known keys with plain values (``ALLOWED_KEYS``); ``ACTIVITIES_LOG_FILE``
names a file in the traced user's folder of agentd's trace dir (dynolog relays
it verbatim, which lets any caller make trainers write anywhere). Requests are
bounded (size, nesting, list lengths; no NaN or Infinity). A bad request gets
no reply, as with dynolog — or ``{"status": "failed"}`` for a malformed
on-demand request — and one rate-limited log line per cause, never a traceback.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import pathlib
import re
import socket
import struct
import time
import os
from collections.abc import Callable
from typing import Any

from agentd.kineto.ratelimit import CauseLimitedLogger
from agentd.auth import Caller
from agentd.kineto.registry import BusyError, PendingConfig, Registry
from agentd.kineto import config as kineto_config
from agentd.peer import PeerLookupError, tcp_socket_uid
from agentd.procfs import real_uid, uses_cuda

log = logging.getLogger(__name__)

DEFAULT_PORT = 1778
MAX_REQUEST_BYTES = 64 * 1024
MAX_NESTING = 8
MAX_PIDS = 4096
MAX_PID = 1 << 22
MAX_JOB_ID = (1 << 63) - 1
MAX_CONFIG_LINES = 64
READ_TIMEOUT_SECONDS = 5.0
# The keys a client's config may set; anything else (files: ACTIVITIES_LOG_FILE,
# EVENTS_LOG_FILE, PROFILE_MEMORY, ...) is dropped: agentd picks the path.
ALLOWED_KEYS = frozenset({
    "ACTIVITY_TYPES", "ACTIVITIES_DURATION_MSECS", "ACTIVITIES_DURATION_SECS", "ACTIVITIES_ITERATIONS",
    "ACTIVITIES_WARMUP_PERIOD_SECS", "ACTIVITIES_WARMUP_ITERATIONS", "PROFILE_START_TIME",
    "PROFILE_START_ITERATION", "PROFILE_START_ITERATION_ROUNDUP", "PROFILE_REPORT_INPUT_SHAPES",
    "PROFILE_PROFILE_MEMORY", "PROFILE_WITH_STACK", "PROFILE_WITH_FLOPS", "PROFILE_WITH_MODULES",
    "REQUEST_TRACE_ID", "REQUEST_GROUP_TRACE_ID",
})
_KEY = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_VALUE = re.compile(r"[A-Za-z0-9._,:+-]{0,256}")
FAILED: dict[str, Any] = {"status": "failed"}

# The folder a uid's traces go into (created on demand), from the trace area.
UserFolder = Callable[[int], pathlib.Path]


class BadRequest(ValueError):
    """A request refused: ``cause`` keys the rate-limited log line, ``reply`` is what the client gets (None: nothing)."""

    def __init__(self, cause: str, message: str, reply: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.reply = reply


def _reply(value: dict[str, Any]) -> bytes:
    body = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return struct.pack("<i", len(body)) + body


def client_config_lines(text: str) -> list[str]:
    """The client's ``KEY=value`` lines whose keys are allowed, each checked to be one plain line;
    BadRequest naming the first line that is not."""
    lines = []
    raw_lines = text.splitlines()
    if len(raw_lines) > MAX_CONFIG_LINES:
        raise BadRequest("rpc-bad-config", f"config has {len(raw_lines)} lines; at most {MAX_CONFIG_LINES}", FAILED)
    for raw in raw_lines:
        key, sep, value = (piece.strip() for piece in raw.partition("="))
        if not key or key not in ALLOWED_KEYS:
            continue
        if not sep or not _VALUE.fullmatch(value):
            raise BadRequest("rpc-bad-config", f"config line for {key} must be {key}=<letters, digits, . _ , : + ->",
                             FAILED)
        lines.append(f"{key}={value}")
    return lines


def sanitized_config(lines: list[str], log_file: str, cuda: bool) -> str:
    """The allowed client lines, writing to ``log_file``, with activity types set."""
    if not any(line.startswith("ACTIVITY_TYPES=") for line in lines):
        lines = [*lines, "ACTIVITY_TYPES=" + ",".join(kineto_config.activity_types(cuda, with_stack=False))]
    lines = [f"ACTIVITIES_LOG_FILE={log_file}", *lines]
    for line in lines:
        kineto_config.check_line(line)
    return "\n".join(lines) + "\n"


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


class DynologRpc:
    """Answers getStatus, getVersion and setKinetOnDemandRequest on an already bound socket."""

    def __init__(self, sock: socket.socket, registry: Registry, user_folder: UserFolder, token: str | None,
                 version: str) -> None:
        self.sock = sock
        self.registry = registry
        self.user_folder = user_folder
        self.token = token
        self.version = version
        self._limited = CauseLimitedLogger(log)
        self._server: asyncio.AbstractServer | None = None

    @classmethod
    def bind(cls, host: str, port: int, registry: Registry, user_folder: UserFolder, token: str | None,
             version: str) -> "DynologRpc":
        """Bind now (so a taken port fails agentd's start at once); OSError as from bind."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host.strip("[]"), port), family=family, reuse_port=False)
        return cls(sock, registry, user_folder, token, version)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    async def serve(self) -> None:
        self._server = await asyncio.start_server(self._handle, sock=self.sock)
        log.info("dynolog RPC listening", extra={"port": self.port, "token_required": self.token is not None})

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        else:
            self.sock.close()

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
            return self._dispatch(request, self._caller(request, peer_uid))
        except BadRequest as exc:
            self._limited.warning(exc.cause, "%s", exc, fields={"peer_uid": peer_uid})
            return exc.reply

    def _caller(self, request: dict[str, Any], peer_uid: int | None) -> Caller:
        """Who the request acts for: the token holder (with the agent's token), else the peer's user."""
        if self.token is not None:
            token = request.get("token")
            if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self.token.encode()):
                raise BadRequest("rpc-unauthorized", f"request without the agent's token (fn {request['fn'][:64]!r})")
            return Caller.token_holder()
        if peer_uid is None:
            raise BadRequest("rpc-unknown-caller", "cannot tell which local user is calling; refused "
                                                   "(a remote caller needs the agent's token)")
        return Caller.local(peer_uid)

    def _dispatch(self, request: dict[str, Any], caller: Caller) -> dict[str, Any]:
        fn = request["fn"]
        if fn == "getStatus":
            return {"status": 1}
        if fn == "getVersion":
            return {"version": self.version}
        if fn == "setKinetOnDemandRequest":
            return self._on_demand(request, caller)
        raise BadRequest("rpc-unknown-fn", f"unknown fn {fn[:64]!r}")

    def _on_demand(self, request: dict[str, Any], caller: Caller) -> dict[str, Any]:
        config, pids = request.get("config"), request.get("pids")
        if not isinstance(config, str) or not isinstance(pids, list) or len(pids) > MAX_PIDS:
            raise BadRequest("rpc-bad-request", f'setKinetOnDemandRequest needs "config" (text) and "pids" '
                                                f"(a list of at most {MAX_PIDS})", FAILED)
        if not all(type(p) is int and 0 <= p < MAX_PID for p in pids):
            raise BadRequest("rpc-bad-request", f"pids must be integers 0-{MAX_PID - 1}", FAILED)
        job_id = _int_field(request, "job_id", 0, 0, MAX_JOB_ID)
        limit = _int_field(request, "process_limit", 1000, 1, MAX_PIDS)
        lines = client_config_lines(config)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        matched: list[int] = []
        triggered: list[int] = []
        busy = 0
        agent_uid = os.geteuid()
        for entry in self.registry.match(str(job_id), set(pids) - {0}):
            if not caller.owns(entry.uid):
                continue  # another user's process: not shown to this caller either
            matched.append(entry.reported_pid)
            if len(triggered) >= limit or (agent_uid != 0 and entry.uid != agent_uid):
                continue
            if real_uid(entry.host_pid) != entry.uid:
                continue  # gone, or no longer the user it polled as
            try:
                folder = self.user_folder(entry.uid)
            except OSError as exc:
                self._limited.warning("rpc-trace-dir", "cannot create the folder for uid %d: %s", entry.uid,
                                      exc.strerror)
                continue
            log_file = str(folder / f"dyno-{stamp}-pid{entry.host_pid}.pt.trace.json")
            try:
                self.registry.offer(entry, PendingConfig(sanitized_config(lines, log_file, uses_cuda(entry.host_pid))))
            except kineto_config.ConfigValueError as exc:
                self._limited.warning("rpc-trace-dir", "the trace dir cannot be named in a config: %s", exc)
                continue
            except BusyError:
                busy += 1
                continue
            triggered.append(entry.reported_pid)
        log.info("dyno on-demand request", extra={"matched": len(matched), "triggered": len(triggered), "busy": busy,
                                                  "caller": str(caller)})
        return {"activityProfilersBusy": busy, "activityProfilersTriggered": triggered, "eventProfilersBusy": 0,
                "eventProfilersTriggered": [], "processesMatched": matched}
