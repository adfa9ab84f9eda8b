"""The gRPC ``Agent`` service: GetInfo and Watch here; traces and stacks by delegation.

Delegation seam (for the trace and hang areas): ``AgentServicer`` takes a
``traces`` object implementing ``TraceService`` and a ``stacks`` object
implementing ``StacksService``. ``agentd.daemon.build_services`` constructs them;
wiring one in is a one-line edit there. While one is None its RPCs answer
UNIMPLEMENTED with a message saying so. The servicer does no authentication:
the token interceptor (``agentd.auth``) refuses bad calls before they get here.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import AsyncIterator
from importlib import metadata
from typing import Protocol

import grpc
import psutil

from agentd.agent import Agent
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


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


class StacksService(Protocol):
    """What the hang area provides: the local ranks' stacks."""

    async def get_stacks(
        self, request: pb.GetStacksRequest, context: grpc.aio.ServicerContext
    ) -> pb.StacksReply: ...


def static_info(agent: Agent, trace_dir: str) -> pb.AgentInfo:
    """The parts of GetInfo that do not change while the agent runs."""
    try:
        version = metadata.version("tuiprof")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed as a package)"
    return pb.AgentInfo(
        hostname=agent.hostname,
        agent_version=version,
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
        traces: TraceService | None = None,
        stacks: StacksService | None = None,
    ) -> None:
        self._agent = agent
        self._static = static
        self._traces = traces
        self._stacks = stacks

    async def GetInfo(self, request: pb.GetInfoRequest, context: grpc.aio.ServicerContext) -> pb.AgentInfo:
        return agent_info(self._agent, self._static)

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.HostSnapshot]:
        """Stream snapshots at most every ``interval_ms`` (0: every one), newest first.

        The watcher's slot holds one snapshot, so a client that reads slowly
        (or not at all) skips snapshots instead of queueing them.
        """
        period_ns = request.interval_ms * 1_000_000
        slot = self._agent.subscribe()
        peer = context.peer()
        log.info("watch started", extra={"peer": peer, "interval_ms": request.interval_ms,
                                         "watchers": self._agent.watcher_count})
        last_sent_ns: int | None = None
        try:
            while True:
                snapshot = await slot.take()
                if last_sent_ns is not None and snapshot.timestamp_unix_ns - last_sent_ns < period_ns:
                    continue
                last_sent_ns = snapshot.timestamp_unix_ns
                yield snapshot
        finally:
            self._agent.unsubscribe(slot)
            log.info("watch ended", extra={"peer": peer, "watchers": self._agent.watcher_count})

    async def CaptureTrace(self, request, context):
        traces = await self._require(self._traces, "trace capture", "trace", context)
        return await traces.capture_trace(request, context)

    async def GetCaptureStatus(self, request, context):
        traces = await self._require(self._traces, "trace capture", "trace", context)
        return await traces.get_capture_status(request, context)

    async def FetchFile(self, request, context):
        traces = await self._require(self._traces, "file fetch", "trace", context)
        async for chunk in traces.fetch_file(request, context):
            yield chunk

    async def GetStacks(self, request, context):
        stacks = await self._require(self._stacks, "stack dumps", "hang", context)
        return await stacks.get_stacks(request, context)

    @staticmethod
    async def _require(service, feature: str, area: str, context: grpc.aio.ServicerContext):
        """``service``, or abort the call UNIMPLEMENTED when it is not wired in."""
        if service is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{feature}: not available in this agentd (no {area} service wired in yet)",
            )
        return service
