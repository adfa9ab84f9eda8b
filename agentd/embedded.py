"""An agent inside the console's own process, for ``tuiprof`` with no host given.

In-process, on its own asyncio loop in a daemon thread, rather than a child
process: it starts in a fraction of a second (no second interpreter to import
grpc and psutil), it binds port 0 so the OS picks a free loopback port with no
race, and it cannot outlive the console. The cost is sharing the GIL with the
UI: the collectors' CPU per interval, about 1.5 ms on a 2-core VM without GPUs
(bench/agentd_cpu.md), more with NVML and GPM on GPU hosts.
The console talks to it over gRPC like to any other agent, so nothing else in
the console needs to know it is embedded. It serves no /metrics endpoint.

The Kineto IPC socket (``\0dynolog\0``) is one name for the whole host: the
agent that binds it is the one every PyTorch process on the node asks for trace
configs. A console of a non-root user must not take it from the node's root
agent (started later, or restarted), so its embedded agent binds the socket in
a private directory instead, unless ``host_kineto_socket=True`` asks for the
host-wide name (e.g. on a workstation with no root agent).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
import pathlib
import shutil
import tempfile
import threading

from agentd.config import AgentConfig
from agentd.daemon import Daemon, Endpoints
from agentd.address import AgentAddress

# Seconds to wait for the agent to bind before giving up.
START_TIMEOUT_SECONDS = 30.0


@dataclasses.dataclass
class EmbeddedAgent:
    """A running in-process agent: where to connect, and how to stop it."""

    endpoints: Endpoints
    _loop: asyncio.AbstractEventLoop
    _stop: asyncio.Event
    _thread: threading.Thread
    _private_dir: pathlib.Path | None  # removed at stop

    @property
    def address(self) -> AgentAddress:
        return self.endpoints.address

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and sampling; safe to call twice."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded_agent(
    interval_ms: int = 1000, trace_dir: pathlib.Path | None = None, host_kineto_socket: bool = False
) -> EmbeddedAgent:
    """Start an agent on 127.0.0.1 (free port, no token, no /metrics); raises AgentdError.

    ``host_kineto_socket``: also serve the host-wide Kineto socket when not root
    (root's console always does; nobody else's may shadow root's agent).
    """
    private_dir = None
    if os.geteuid() != 0 and not host_kineto_socket:
        private_dir = pathlib.Path(tempfile.mkdtemp(prefix="tuiprof-kineto-"))  # mode 0700
    config = AgentConfig(host="127.0.0.1", port=0, metrics_port=None, interval_ms=interval_ms,
                         kineto_socket_dir=str(private_dir) if private_dir is not None else None)
    if trace_dir is not None:
        config = dataclasses.replace(config, trace_dir=trace_dir)
    daemon = Daemon(config)
    started: concurrent.futures.Future[tuple[Endpoints, asyncio.AbstractEventLoop, asyncio.Event]]
    started = concurrent.futures.Future()

    async def serve() -> None:
        stop = asyncio.Event()
        try:
            endpoints = await daemon.start()
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result((endpoints, asyncio.get_running_loop(), stop))
        await daemon.serve_until(stop)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="embedded-agentd", daemon=True)
    thread.start()
    try:
        endpoints, loop, stop = started.result(timeout=START_TIMEOUT_SECONDS)
    except BaseException:
        if private_dir is not None:
            shutil.rmtree(private_dir, ignore_errors=True)
        raise
    return EmbeddedAgent(endpoints, loop, stop, thread, private_dir)
