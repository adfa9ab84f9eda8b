"""An agent inside the console's own process, for ``tuiprof`` with no host given.

In-process, on its own asyncio loop in a daemon thread, rather than a child
process: it starts in a fraction of a second (no second interpreter to import
grpc and psutil), it binds port 0 so the OS picks a free loopback port with no
race, and it cannot outlive the console. The cost is sharing the GIL with the
UI, which is small: collectors sample a few hundred microseconds per interval.
The console talks to it over gRPC like to any other agent, so nothing else in
the console needs to know it is embedded. It serves no /metrics endpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import pathlib
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

    @property
    def address(self) -> AgentAddress:
        return self.endpoints.address

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and sampling; safe to call twice."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)

    def __enter__(self) -> EmbeddedAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded_agent(
    interval_ms: int = 1000, trace_dir: pathlib.Path | None = None
) -> EmbeddedAgent:
    """Start an agent on 127.0.0.1 (free port, no token, no /metrics); raises AgentdError."""
    settings: dict[str, object] = {"host": "127.0.0.1", "port": 0, "metrics_port": None,
                                   "interval_ms": interval_ms}
    if trace_dir is not None:
        settings["trace_dir"] = trace_dir
    daemon = Daemon(AgentConfig(**settings))
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
    endpoints, loop, stop = started.result(timeout=START_TIMEOUT_SECONDS)
    return EmbeddedAgent(endpoints, loop, stop, thread)
