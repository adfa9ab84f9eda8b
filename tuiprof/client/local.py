"""This host's agent: embedded in the console process (``tuiprof`` with no host given), or
the agentd already listening here, asked for its trace dir only when it is trustworthy.

The console takes its embedded agent's info and snapshots in-process (``watch_embedded``)
and reports them as the same events a gRPC client would; everything else reaches the
embedded agent over gRPC at its address. For `tuiprof run`, also the Kineto folder and trace
dir of a console of the user's (``console_agent_folders``), when no agentd offers a folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import stat
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import grpc

from agentd import peer
from agentd.address import AgentAddress
from agentd.config import default_trace_dir
from agentd.kineto.console_folder import ConsoleFolderError, served_console_folder
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.text import user_label
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.host_client import STALL_INTERVALS, Emit
from tuiprof.errors import TuiprofError
from tuiprof.model.events import HostUnreachable, InfoReceived, SnapshotReceived

if TYPE_CHECKING:  # the agent is imported only when one is started
    from agentd.embedded import EmbeddedAgent


class LocalAgentError(TuiprofError):
    """The embedded agent could not start; the message says why."""

    exit_code = 2  # what the commands have always exited with when it cannot start, before any host is asked


@contextlib.asynccontextmanager
async def embedded_agent(interval_ms: int = 1000, trace_dir: pathlib.Path | None = None,
                         pmu_when_shown: bool = False, console_kineto_folder: bool = False
                         ) -> AsyncIterator[EmbeddedAgent]:
    """Start the embedded agent (in its own thread), yield it, stop it on exit.

    ``trace_dir``: where it writes traces (default: the agent's own default).
    ``pmu_when_shown``: it reads the host-wide PMU counters only after ``sample_pmu(True)``.
    ``console_kineto_folder``: it serves Kineto in the user's console folder (the console's agent),
    where `tuiprof run` points the user's jobs.
    """
    from agentd.embedded import start_embedded_agent
    from agentd.errors import AgentdError

    starting = asyncio.ensure_future(asyncio.to_thread(
        start_embedded_agent, interval_ms or 1000, trace_dir, pmu_when_shown=pmu_when_shown,
        console_kineto_folder=console_kineto_folder))
    try:
        agent = await asyncio.shield(starting)
    except AgentdError as exc:
        raise LocalAgentError(f"cannot start the embedded agent: {exc}") from exc
    except asyncio.CancelledError:
        # Cancelled while the agent starts (the console quit in its first second): its thread
        # finishes starting it regardless; stop it then, or it outlives the console's loop and
        # dies with a traceback at exit.
        with contextlib.suppress(AgentdError):  # it did not start: nothing to stop
            await asyncio.to_thread((await starting).stop)
        raise
    try:
        yield agent
    finally:
        await asyncio.to_thread(agent.stop)


def serve_grpc(agent: EmbeddedAgent) -> None:
    """Make the embedded agent serve gRPC at its address; failing, an error as a call to it would raise."""
    from agentd.errors import AgentdError

    try:
        agent.serve_grpc()
    except (AgentdError, TimeoutError) as exc:
        reason = str(exc) or "it did not start serving in time"
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   details=f"this host's embedded agent cannot serve gRPC: {reason}") from exc


@contextlib.asynccontextmanager
async def local_agent(interval_ms: int = 1000, trace_dir: pathlib.Path | None = None) -> AsyncIterator[AgentAddress]:
    """The embedded agent's address, for callers that talk to it over gRPC (served at once)."""
    async with embedded_agent(interval_ms, trace_dir) as agent:
        await asyncio.to_thread(serve_grpc, agent)
        yield agent.address


TAKE_AFTER_S = 0.02
"""The embedded agent's next snapshot is taken this long after it is due (its publishing
time varies by a few ms with what its collectors read)."""
LATE_RETRY_S = 0.05
"""A snapshot not there when due is looked for again this often, until the stall time."""


async def watch_embedded(agent: EmbeddedAgent, options: ConnectionOptions, emit: Emit,
                         clock: Callable[[], float] = time.time) -> None:
    """Report the embedded agent as a HostClient reports an agent it watches, until cancelled.

    The host is named by the agent's address, so traces and stacks reach it over gRPC.
    Every snapshot the agent publishes is reported (it samples at the console's interval,
    which `-`/`+` change while it runs), taken on this loop's timer when due: no wakeup from
    the agent's thread. None for the stall time makes the host unreachable until the next.
    """
    host = str(agent.address)
    emit(InfoReceived(host, clock(), await agent.info()))
    reported, last_news, stalled = 0, time.monotonic(), False
    while True:
        interval = agent.interval_seconds
        stall = max(options.timeout, STALL_INTERVALS * interval)
        latest, now = agent.latest(), time.monotonic()
        if latest is not None and latest.snapshot.sequence != reported:
            reported, last_news, stalled = latest.snapshot.sequence, now, False
            emit(SnapshotReceived(host, clock(), latest.snapshot))
            due = latest.at + interval + TAKE_AFTER_S
        elif now - last_news >= stall:
            if not stalled:
                emit(HostUnreachable(host, clock(), f"no snapshot from the embedded agent for {stall:g} s"))
            stalled = True
            due = now + interval
        else:
            due = now + min(LATE_RETRY_S, last_news + stall - now)
        await asyncio.sleep(max(0.0, due - time.monotonic()))


class UntrustedAgentError(TuiprofError):
    """What listens on this host's agent port, or the folder it names, could be another user's."""


@dataclasses.dataclass(frozen=True)
class LocalAgentFolders:
    """What the local agent offers a job: its trace dir and the caller's own Kineto IPC folder.

    Each is None when it cannot be used, with the reason in ``*_problem``
    ("" when the agent simply has none)."""

    trace_dir: str | None
    trace_dir_problem: str
    kineto_socket_dir: str | None
    kineto_problem: str


def local_agent_folders(port: int, options: ConnectionOptions) -> LocalAgentFolders | None:
    """The folders of the agentd listening on 127.0.0.1:``port``, resolved; None when nothing listens.

    Anyone may listen on a free port once the agent is down, and a trace dir set
    for a root job is where its traces get written, a Kineto folder where its
    trace requests come from. So the answer counts only from a listening socket
    owned (per the kernel) by root or by the caller, checked before and after
    asking (UntrustedAgentError otherwise), and a folder counts only when only
    root or the caller can change it (the Kineto folder: the caller's own, 0700).
    RPC errors (grpc.aio.AioRpcError) pass through.
    """
    address = AgentAddress("127.0.0.1", port)
    if _trusted_listener(address) is None:
        return None  # nothing listens: no agent on this host
    info = asyncio.run(_ask_folders(address, options))
    if _trusted_listener(address) is None:
        raise UntrustedAgentError(f"the agent on {address.target} stopped listening right after answering")
    trace_dir, trace_dir_problem = _checked_trace_dir(info.trace_dir, "agent's") if info.trace_dir else (None, "")
    kineto_dir, kineto_problem = None, info.kineto_socket_dir_reason or "the agent offers no Kineto folder"
    if info.kineto_socket_dir:
        try:
            kineto_dir, kineto_problem = _check_kineto_folder(info.kineto_socket_dir, "agent's"), ""
        except UntrustedAgentError as exc:
            kineto_problem = str(exc)
    return LocalAgentFolders(trace_dir, trace_dir_problem, kineto_dir, kineto_problem)


def console_agent_folders() -> LocalAgentFolders:
    """What a console of the caller's, running on this host, offers a job: the user's console Kineto folder
    (agentd.kineto.console_folder: made by the caller alone, and a live socket of theirs in it), checked
    as an agent's Kineto folder is, and the console's trace dir (the agent's default for the caller: the
    console sets none). ConsoleFolderError when there is none to use (NoConsoleError: no console of the
    caller's serves one)."""
    folder = served_console_folder(os.getuid(), os.environ)
    try:
        kineto_dir = _check_kineto_folder(str(folder), "console's")
    except UntrustedAgentError as exc:
        raise ConsoleFolderError(str(exc)) from exc
    trace_dir, trace_dir_problem = _checked_trace_dir(str(default_trace_dir()), "console's")
    return LocalAgentFolders(trace_dir, trace_dir_problem, kineto_dir, "")


async def _ask_folders(address: AgentAddress, options: ConnectionOptions) -> pb.AgentInfo:
    async with options.open(address) as channel:
        info: pb.AgentInfo = await pb_grpc.AgentStub(channel).GetInfo(pb.GetInfoRequest(kineto_socket_dir=True),
                                                                      timeout=options.timeout)
        return info


def _checked_trace_dir(folder: str, whose: str) -> tuple[str | None, str]:
    """(``folder`` resolved, "") when only root or the caller can change it, else (None, why)."""
    # Kineto compares the log file's path (which the agent resolves) with this prefix.
    path = os.path.realpath(folder)
    try:
        _check_folder(pathlib.Path(path), f"{whose} trace dir")
    except UntrustedAgentError as exc:
        return None, str(exc)
    return path, ""


def _check_kineto_folder(folder: str, whose: str) -> str:
    """``folder`` resolved, once it is the caller's own (mode 0700, in folders only root or the caller can
    change) and holds the agent's ``dynolog`` socket: then no one else can reach a job's socket in it."""
    path = pathlib.Path(os.path.realpath(folder))
    _check_folder(path, f"{whose} Kineto folder")
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UntrustedAgentError(f"the {whose} Kineto folder {path} is not yours alone (owner "
                                  f"{user_label(info.st_uid)}, mode {stat.filemode(info.st_mode)})")
    try:
        socket_mode = (path / "dynolog").lstat().st_mode
    except OSError as exc:
        raise UntrustedAgentError(f"the {whose} Kineto socket {path / 'dynolog'} cannot be read: "
                                  f"{exc.strerror}") from exc
    if not stat.S_ISSOCK(socket_mode):
        raise UntrustedAgentError(f"{path / 'dynolog'} is not a socket")
    return str(path)


def _trusted_listener(address: AgentAddress) -> int | None:
    """The uid owning the socket listening on ``address`` (root or the caller), None when none listens."""
    try:
        uid = peer.tcp_socket_uid((address.host, address.port), None)
    except peer.PeerLookupError as exc:
        raise UntrustedAgentError(f"cannot tell who listens on {address.target}: {exc}") from exc
    if uid is not None and uid not in (0, os.getuid()):
        raise UntrustedAgentError(f"{address.target} is served by a process of {user_label(uid)}, not by root "
                                  "or you: not an agent to take a trace dir from")
    return uid


def _check_folder(path: pathlib.Path, what: str) -> None:
    """``path`` and every folder above it are owned by root or the caller and writable by no one else
    (a sticky folder such as /tmp may be, above the last level: others cannot rename what is not theirs)."""
    trusted = (0, os.getuid())
    try:
        info = path.stat()
    except OSError as exc:
        raise UntrustedAgentError(f"the {what} {path} cannot be read: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise UntrustedAgentError(f"the {what} {path} is not a folder")
    for folder in (path, *path.parents):
        info = folder.stat()
        if info.st_uid not in trusted:
            raise UntrustedAgentError(f"the {what} {path} is not safe: {folder} belongs to "
                                      f"{user_label(info.st_uid)}")
        others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if others_write and not (folder != path and info.st_mode & stat.S_ISVTX):
            raise UntrustedAgentError(f"the {what} {path} is not safe: {folder} is writable by "
                                      f"other users (mode {stat.filemode(info.st_mode)})")
