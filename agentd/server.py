"""The gRPC ``Agent`` service: GetInfo and Watch here; traces, stacks and function timing by delegation.

Delegation seam (for the trace, hang and function timing areas): ``AgentServicer`` takes a
``traces`` object implementing ``TraceService``, a ``stacks`` object
implementing ``StacksService`` and a ``functions`` one implementing ``FunctionTimingSwitch``. ``agentd.daemon.build_services`` constructs them;
wiring one in is a one-line edit there. While one is None its RPCs answer
UNIMPLEMENTED with a message saying so. The token interceptor (``agentd.auth``)
refuses calls with a wrong token before they get here; every RPC starts by
identifying its caller, which refuses calls from other hosts without the token.

Per call the servicer works out the ``Caller`` (``agentd.auth.CallerIdentifier``):
the stacks and function timing services get it as an argument; the trace service reads it with
``agentd.auth.current_caller()``. Watch sends every caller the metrics of
every rank (as node_exporter would) but a rank's exception text only to its
owner, root or the token holder.
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
from collections.abc import AsyncIterator
from typing import Protocol, TypeVar

import grpc
import psutil

from agentd import procfs
from agentd.agent import Agent
from agentd.auth import Caller, CallerIdentifier, set_current_caller
from agentd.hang.detector import hide_exceptions
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.version import installed_version

log = logging.getLogger(__name__)
S = TypeVar("S")  # a service the agent may have wired in


class TraceService(Protocol):
    """What the trace area provides: capture, its status, and files from the trace dir."""

    async def capture_trace(
        self, request: pb.CaptureTraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.CaptureTraceReply: ...

    async def get_capture_status(
        self, request: pb.CaptureStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.CaptureTraceReply: ...

    def fetch_file(
        self, request: pb.FetchFileRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FileChunk]: ...

    def kineto_user_folder(self, caller: Caller) -> tuple[str, str]: ...


class StacksService(Protocol):
    """What the hang area provides: the local ranks' stacks."""

    async def get_stacks(
        self, request: pb.GetStacksRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.StacksReply: ...


def snapshot_for(snapshot: pb.HostSnapshot, caller: Caller, hidepid: str = "") -> pb.HostSnapshot:
    """``snapshot`` as ``caller`` may see it: other users' exception text taken out, and, where /proc
    hides other users' processes (``hidepid``, the agent's /proc mount option), their GPU processes'
    name, user and command line too.

    The shared snapshot is returned as is when nothing in it is private to
    someone else (the usual case); otherwise a redacted copy.
    """
    if caller.admin:
        return snapshot
    foreign = [r.exception for r in snapshot.ranks if r.exception and not caller.owns(_owner(r))]
    hidden = hidepid and any(not caller.owns(_process_owner(p)) for gpu in snapshot.gpus for p in gpu.processes)
    if not foreign and not hidden:
        return snapshot
    redacted = pb.HostSnapshot()
    redacted.CopyFrom(snapshot)
    for rank in redacted.ranks:
        if rank.exception and not caller.owns(_owner(rank)):
            rank.exception = ""
            rank.unavailable["exception"] = (
                f"private: shown only to the rank's owner, root or the token holder (you are {caller})")
    redacted.hang.CopyFrom(hide_exceptions(redacted.hang, foreign))
    if hidden:
        _hide_processes(redacted, caller, hidepid)
    return redacted


def _hide_processes(snapshot: pb.HostSnapshot, caller: Caller, hidepid: str) -> None:
    why = (f"private: /proc is mounted hidepid={hidepid} on this host, so another user's process is shown only "
           f"to its owner, root or the token holder (you are {caller})")
    for gpu in snapshot.gpus:
        for process in gpu.processes:
            if caller.owns(_process_owner(process)):
                continue
            process.name = ""
            for field in ("user", "command", "cpu_percent", "resident_memory_bytes", "start_time_unix_seconds"):
                process.ClearField(field)
                gpu.unavailable[f"processes[{process.pid}].{field}"] = why


def _process_owner(process: pb.GpuProcess) -> int | None:
    return process.uid if process.HasField("uid") else None


def _owner(rank: pb.RankStats) -> int | None:
    return rank.uid if rank.HasField("uid") else None


class FunctionTimingSwitch(Protocol):
    """What the function timing area provides: starting and stopping it in a running rank."""

    async def set_function_timing(
        self, request: pb.SetFunctionTimingRequest, context: grpc.aio.ServicerContext, caller: Caller
    ) -> pb.FunctionTimingOutcome: ...


def static_info(agent: Agent, trace_dir: str) -> pb.AgentInfo:
    """The parts of GetInfo that do not change while the agent runs."""
    return pb.AgentInfo(
        hostname=agent.hostname,
        agent_version=installed_version(),
        python_version=platform.python_version(),
        kernel_release=os.uname().release,
        cpu_count=os.cpu_count() or 0,
        memory_total_bytes=psutil.virtual_memory().total,
        boot_time_unix_ns=int(psutil.boot_time() * 1e9),
        interval_seconds=agent.interval_seconds,
        trace_dir=trace_dir,
    )


def agent_info(agent: Agent, static: pb.AgentInfo) -> pb.AgentInfo:
    """GetInfo's answer now: the static facts plus what the collectors report."""
    info = pb.AgentInfo()
    info.CopyFrom(static)
    agent.describe(info)
    return info


class AgentServicer(pb_grpc.AgentServicer):
    def __init__(
        self,
        agent: Agent,
        static: pb.AgentInfo,
        callers: CallerIdentifier,
        traces: TraceService | None = None,
        stacks: StacksService | None = None,
        functions: FunctionTimingSwitch | None = None,
    ) -> None:
        self._agent = agent
        self._callers = callers
        self._static = static
        self._traces = traces
        self._stacks = stacks
        self._functions = functions
        self._hidepid = procfs.proc_hides_processes()  # the node admin's choice, read once at start

    async def GetInfo(self, request: pb.GetInfoRequest, context: grpc.aio.ServicerContext) -> pb.AgentInfo:
        caller = await self._callers.identify(context)  # refuses a call from another host without the token
        info = agent_info(self._agent, self._static)
        if request.kineto_socket_dir:
            if self._traces is None:
                info.kineto_socket_dir_reason = "this agent serves no traces"
            else:
                info.kineto_socket_dir, info.kineto_socket_dir_reason = await asyncio.to_thread(
                    self._traces.kineto_user_folder, caller)
        return info

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.HostSnapshot]:
        """Stream snapshots at most every ``interval_ms`` (0: every one), newest first.

        The watcher's slot holds one snapshot, so a client that reads slowly
        (or not at all) skips snapshots instead of queueing them.
        """
        period_ns = request.interval_ms * 1_000_000
        caller = await self._callers.identify(context)
        slot = self._agent.subscribe()
        peer = context.peer()
        log.info("watch started", extra={"peer": peer, "caller": str(caller), "interval_ms": request.interval_ms,
                                         "watchers": self._agent.watcher_count})
        last_sent_ns: int | None = None
        try:
            while True:
                snapshot = await slot.take()
                if last_sent_ns is not None and snapshot.timestamp_unix_ns - last_sent_ns < period_ns:
                    continue
                last_sent_ns = snapshot.timestamp_unix_ns
                yield snapshot_for(snapshot, caller, self._hidepid)
        finally:
            self._agent.unsubscribe(slot)
            log.info("watch ended", extra={"peer": peer, "watchers": self._agent.watcher_count})

    async def CaptureTrace(self, request: pb.CaptureTraceRequest,
                           context: grpc.aio.ServicerContext) -> pb.CaptureTraceReply:
        set_current_caller(await self._callers.identify(context))
        traces = await self._require(self._traces, "trace capture", "trace", context)
        return await traces.capture_trace(request, context)

    async def GetCaptureStatus(self, request: pb.CaptureStatusRequest,
                               context: grpc.aio.ServicerContext) -> pb.CaptureTraceReply:
        set_current_caller(await self._callers.identify(context))
        traces = await self._require(self._traces, "trace capture", "trace", context)
        return await traces.get_capture_status(request, context)

    async def FetchFile(self, request: pb.FetchFileRequest,
                        context: grpc.aio.ServicerContext) -> AsyncIterator[pb.FileChunk]:
        set_current_caller(await self._callers.identify(context))
        traces = await self._require(self._traces, "file fetch", "trace", context)
        async for chunk in traces.fetch_file(request, context):
            yield chunk

    async def GetStacks(self, request: pb.GetStacksRequest, context: grpc.aio.ServicerContext) -> pb.StacksReply:
        caller = await self._callers.identify(context)
        stacks = await self._require(self._stacks, "stack dumps", "hang", context)
        return await stacks.get_stacks(request, context, caller)

    async def SetFunctionTiming(self, request: pb.SetFunctionTimingRequest,
                                context: grpc.aio.ServicerContext) -> pb.FunctionTimingOutcome:
        caller = await self._callers.identify(context)
        functions = await self._require(self._functions, "function timing", "ranks collector", context)
        return await functions.set_function_timing(request, context, caller)

    @staticmethod
    async def _require(service: S | None, feature: str, area: str, context: grpc.aio.ServicerContext) -> S:
        """``service``, or abort the call UNIMPLEMENTED when it is not wired in."""
        if service is not None:
            return service
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"{feature}: not available in this agentd (no {area} service wired in yet)",
        )
        raise AssertionError("grpc's abort always raises")
