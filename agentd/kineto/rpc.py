"""dynolog's TCP RPC (port 1778), so an existing ``dyno gputrace`` works against agentd. Off by default.

Framing as dynolog: an int32 little-endian length, then that many bytes of JSON
with an ``"fn"`` key; one request per connection; replies are compact JSON with
sorted keys. Deliberate deviations, for safety: it listens only where agentd's
gRPC listens (loopback unless a token is configured) and, with a token, a
request must carry ``"token"``; the client's ``ACTIVITIES_LOG_FILE`` is
replaced by a file under agentd's trace dir (dynolog relays it verbatim, which
lets any caller make trainers write anywhere); other users' processes are
matched but not triggered unless agentd runs as root. A bad request gets no
reply, as with dynolog, and one log line per cause.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import pathlib
import socket
import struct
import time

from agentd.kineto.ratelimit import CauseLimitedLogger
from agentd.kineto.registry import BusyError, PendingConfig, Registry
from agentd.kineto import config as kineto_config
from agentd.procfs import uses_cuda

log = logging.getLogger(__name__)

DEFAULT_PORT = 1778
MAX_REQUEST_BYTES = 1 << 20
READ_TIMEOUT_SECONDS = 5.0
# Config keys that name files: dropped from client configs (agentd picks the path).
FILE_KEYS = ("ACTIVITIES_LOG_FILE", "EVENTS_LOG_FILE", "PROFILE_MEMORY", "PROFILE_MEMORY_DURATION_MSECS")


def _reply(value: dict) -> bytes:
    body = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return struct.pack("<i", len(body)) + body


def sanitized_config(text: str, log_file: str, cuda: bool) -> str:
    """The client's config without file-naming keys, writing to ``log_file``, with activity types set."""
    lines = []
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip()
        if key and key not in FILE_KEYS:
            lines.append(line.strip())
    if not any(line.startswith("ACTIVITY_TYPES=") for line in lines):
        lines.append("ACTIVITY_TYPES=" + ",".join(kineto_config.activity_types(cuda, with_stack=False)))
    return "\n".join([f"ACTIVITIES_LOG_FILE={log_file}", *lines]) + "\n"


class DynologRpc:
    """Answers getStatus, getVersion and setKinetOnDemandRequest on an already bound socket."""

    def __init__(self, sock: socket.socket, registry: Registry, trace_dir: pathlib.Path, token: str | None,
                 version: str) -> None:
        self.sock = sock
        self.registry = registry
        self.trace_dir = trace_dir
        self.token = token
        self.version = version
        self._limited = CauseLimitedLogger(log)
        self._server: asyncio.AbstractServer | None = None

    @classmethod
    def bind(cls, host: str, port: int, registry: Registry, trace_dir: pathlib.Path, token: str | None,
             version: str) -> "DynologRpc":
        """Bind now (so a taken port fails agentd's start at once); OSError as from bind."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host.strip("[]"), port), family=family, reuse_port=False)
        return cls(sock, registry, trace_dir, token, version)

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

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
            answer = self.answer(body)
            if answer is not None:
                writer.write(_reply(answer))
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError) as exc:
            self._limited.warning("rpc-truncated", "connection ended mid-request: %s", type(exc).__name__)
        finally:
            writer.close()

    def answer(self, body: bytes) -> dict | None:
        """The reply to one request body, or None (no reply, as dynolog) with the cause logged."""
        try:
            request = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._limited.warning("rpc-bad-json", "request is not JSON")
            return None
        if not isinstance(request, dict) or not isinstance(request.get("fn"), str):
            self._limited.warning("rpc-no-fn", "request has no \"fn\"")
            return None
        if self.token is not None and not hmac.compare_digest(str(request.get("token", "")), self.token):
            self._limited.warning("rpc-unauthorized", "request without the agent's token (fn %s)", request["fn"])
            return None
        fn = request["fn"]
        if fn == "getStatus":
            return {"status": 1}
        if fn == "getVersion":
            return {"version": self.version}
        if fn == "setKinetOnDemandRequest":
            return self._on_demand(request)
        self._limited.warning("rpc-unknown-fn", "unknown fn %r", fn[:64])
        return None

    def _on_demand(self, request: dict) -> dict:
        config, pids = request.get("config"), request.get("pids")
        if not isinstance(config, str) or not isinstance(pids, list):
            return {"status": "failed"}
        try:
            wanted = {int(p) for p in pids} - {0}
            job_id = str(int(request.get("job_id", 0)))
            limit = int(request.get("process_limit", 1000))
        except (TypeError, ValueError):
            return {"status": "failed"}
        directory = self.trace_dir / f"dyno-{time.strftime('%Y%m%d-%H%M%S')}"
        matched, triggered, busy = [], [], 0
        agent_uid = os.geteuid()
        for entry in self.registry.match(job_id, wanted):
            matched.append(entry.reported_pid)
            if len(triggered) >= limit or (agent_uid != 0 and entry.uid != agent_uid):
                continue
            directory.mkdir(parents=True, exist_ok=True)
            log_file = str(directory / f"pid{entry.host_pid}.pt.trace.json")
            try:
                self.registry.offer(entry, PendingConfig(sanitized_config(config, log_file, uses_cuda(entry.host_pid))))
            except BusyError:
                busy += 1
                continue
            triggered.append(entry.reported_pid)
        log.info("dyno on-demand request", extra={"matched": len(matched), "triggered": len(triggered), "busy": busy})
        return {"activityProfilersBusy": busy, "activityProfilersTriggered": triggered, "eventProfilersBusy": 0,
                "eventProfilersTriggered": [], "processesMatched": matched}
