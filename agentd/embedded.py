"""An agent inside the console's own process, for ``tuiprof`` with no host given.

In-process, on its own asyncio loop in a daemon thread, rather than a child
process: it starts in a fraction of a second (no second interpreter to import
grpc and psutil), it binds port 0 so the OS picks a free loopback port with no
race, and it cannot outlive the console. The cost is sharing the GIL with the
UI: the collectors' CPU per interval, about 1.5 ms on a 2-core VM without GPUs
(bench/agent/agentd_cpu.md), more with NVML and GPM on GPU hosts.

Its info and snapshots reach the console in-process (``EmbeddedAgent.info``,
``EmbeddedAgent.latest``): the same messages its gRPC GetInfo and Watch would give
this process's user (other users' exception text taken out as for that caller),
without serializing them, streaming them over loopback and parsing them again;
that loopback cost nearly as much CPU as the agent itself on the 2-core VM
(bench/agent/agentd_cpu.md, round 2). The console takes each snapshot on its own timer
rather than being handed it: waking another thread's event loop costs 100-220 µs of
CPU against 20-50 µs for a timer on the GPU VMs (bench/console/wakeup_cost.py). Everything
else (traces, stacks, files) goes over gRPC like to any other agent, so nothing else
in the console needs to know it is embedded. Its gRPC port is bound at start but
served only from the first ``serve_grpc()`` (the console's first trace, stacks or
file): idle, gRPC's threads wake about eight times a second (bench/console/console_nvitop.md,
run 10). It serves no /metrics endpoint.

What no screen shows is not read: with ``pmu_when_shown`` (the console's embedded agent)
the host-wide PMU counters rest until ``sample_pmu(True)`` (the console's PMU tab is
open), since reading them costs about as much as a GPU's NVML calls on a many-CPU VM
(agentd.collectors.pmu). Headless commands (``record``) read everything.

The Kineto IPC socket (``\0dynolog\0``) is one name for the whole host: the
agent that binds it is the one every PyTorch process on the node asks for trace
configs. A console of a non-root user must not take it from the node's root
agent (started later, or restarted), so its embedded agent binds the socket in
a folder of the user's instead, unless ``host_kineto_socket=True`` asks for the
host-wide name (e.g. on a workstation with no root agent). The console's is the
user's console folder (``console_kineto_folder=True``, agentd.kineto.console_folder),
where `tuiprof run` points the user's jobs when no root agent offers them a folder;
the first console of the user takes it, a second one (or any other command's agent)
serves a private folder that no job finds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import pathlib
import shutil
import tempfile
import threading
from typing import NamedTuple

from agentd.address import AgentAddress
from agentd.agent import Agent
from agentd.auth import Caller
from agentd.collectors.pmu import PmuCollector
from agentd.config import AgentConfig
from agentd.daemon import Daemon, Endpoints
from agentd.kineto.console_folder import DYNOLOG, ConsoleFolderError, prepare_console_folder, serves
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.server import snapshot_for

log = logging.getLogger(__name__)

# Seconds to wait for the agent to bind before giving up.
START_TIMEOUT_SECONDS = 30.0
# Why a console's snapshots have no host-wide PMU readings while no screen shows them.
PMU_RESTING = "read only while the console's PMU tab is open: the first rates come two intervals after opening it"


class Published(NamedTuple):
    """A snapshot the agent published, and when (``time.monotonic()``)."""

    snapshot: pb.HostSnapshot
    at: float


@dataclasses.dataclass
class EmbeddedAgent:
    """A running in-process agent: where to connect, its snapshots, and how to stop it."""

    endpoints: Endpoints
    _daemon: Daemon
    _loop: asyncio.AbstractEventLoop
    _stop: asyncio.Event
    _thread: threading.Thread
    _private_dir: pathlib.Path | None  # removed at stop

    @property
    def address(self) -> AgentAddress:
        return self.endpoints.address

    @property
    def _agent(self) -> Agent:
        assert self._daemon.agent is not None  # set by a successful start
        return self._daemon.agent

    async def info(self) -> pb.AgentInfo:
        """What GetInfo answers, asked on the agent's loop as the RPC would be."""
        async def ask() -> pb.AgentInfo:
            return self._daemon.info()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(ask(), self._loop))

    def latest(self) -> Published | None:
        """The newest snapshot, as this process's user may see it (read-only: shared with the
        agent), and when it was published; None before the first. Safe from any thread: the
        agent replaces its latest snapshot whole, never changes it."""
        agent = self._agent
        snapshot, published_at = agent.latest, agent.latest_monotonic
        if snapshot is None or published_at is None:
            return None
        # Who the gRPC Watch would see calling from this process (the loopback peer's uid).
        return Published(snapshot_for(snapshot, Caller.local(os.geteuid())), published_at)

    def serve_grpc(self) -> None:
        """Serve gRPC at ``address`` from now on (nothing listens there before); raises AgentdError."""
        asyncio.run_coroutine_threadsafe(self._daemon.serve_grpc(), self._loop).result(START_TIMEOUT_SECONDS)

    @property
    def interval_seconds(self) -> float:
        """How often it samples and publishes now."""
        return self._agent.interval_seconds

    def set_interval(self, seconds: float) -> None:
        """Sample and publish every ``seconds`` from its next tick on: a restart would make it a new
        host (a new port), so the console's `-`/`+` change it in place."""
        self._agent.set_interval(seconds)

    def sample_pmu(self, shown: bool) -> None:
        """Read the host-wide PMU counters while ``shown``, rest them otherwise."""
        _sample_pmu(self._agent, shown)

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


def _sample_pmu(agent: Agent, shown: bool) -> None:
    for runner in agent.runners:
        if isinstance(runner.collector, PmuCollector) and shown:
            runner.collector.wake()
        elif isinstance(runner.collector, PmuCollector):
            runner.collector.rest(PMU_RESTING)


def _console_kineto_folder() -> pathlib.Path | None:
    """The user's console Kineto folder when this console may serve it, else None (the log says why)."""
    try:
        folder = prepare_console_folder(os.geteuid(), os.environ)
        if not serves(folder / DYNOLOG):  # none, or a file left by a console that ended: taken over
            return folder
    except ConsoleFolderError as exc:
        log.warning("Kineto served in a private folder: your console folder cannot be used, so `tuiprof run` "
                    "jobs will not find this console", extra={"reason": str(exc)})
        return None
    log.info("Kineto served in a private folder: another console of yours serves your console folder, and "
             "`tuiprof run` jobs poll that one", extra={"folder": str(folder)})
    return None


def start_embedded_agent(
    interval_ms: int = 1000, trace_dir: pathlib.Path | None = None, host_kineto_socket: bool = False,
    pmu_when_shown: bool = False, console_kineto_folder: bool = False,
) -> EmbeddedAgent:
    """Start an agent on 127.0.0.1 (free port, no token, no /metrics, gRPC from ``serve_grpc``);
    raises AgentdError.

    ``host_kineto_socket``: also serve the host-wide Kineto socket when not root
    (root's console always does; nobody else's may shadow root's agent).
    ``pmu_when_shown``: the host-wide PMU counters rest until ``sample_pmu(True)``.
    ``console_kineto_folder``: when not root, serve Kineto in the user's console folder, where
    `tuiprof run` points their jobs, unless it cannot be made safely or another console of theirs
    serves it (then a private folder, as without it; the log says why). Its socket is removed at
    stop, the folder stays: the jobs' client sockets live in it, and the next console serves them.
    """
    private_dir: pathlib.Path | None = None  # made here, removed at stop
    socket_dir: pathlib.Path | None = None
    if os.geteuid() != 0 and not host_kineto_socket:
        socket_dir = _console_kineto_folder() if console_kineto_folder else None
        if socket_dir is None:
            private_dir = socket_dir = pathlib.Path(tempfile.mkdtemp(prefix="tuiprof-kineto-"))  # mode 0700
    config = AgentConfig(host="127.0.0.1", port=0, metrics_port=None, interval_ms=interval_ms,
                         kineto_socket_dir=str(socket_dir) if socket_dir is not None else None)
    if trace_dir is not None:
        config = dataclasses.replace(config, trace_dir=trace_dir)
    daemon = Daemon(config, on_start=lambda agent: _sample_pmu(agent, False) if pmu_when_shown else None,
                    grpc_on_demand=True)
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
    return EmbeddedAgent(endpoints, daemon, loop, stop, thread, private_dir)
