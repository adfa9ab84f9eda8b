"""One async client per agent: GetInfo, then the Watch stream, reconnecting with backoff.

Each client reports what happens as ``tuiprof.model.events`` through a callback;
clients share nothing, so one slow or dead host never delays the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from tuiprof.client.backoff import Backoff
from agentd.address import AgentAddress
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.errors import describe_rpc_error
from tuiprof.model.events import HostEvent, HostUnreachable, InfoReceived, SnapshotReceived

log = logging.getLogger(__name__)

Emit = Callable[[HostEvent], object]
"""Receives every host event (what it returns is ignored)."""


class RetryNow:
    """Cuts short the backoff wait of every client sharing it (the console's "reconnect now" key)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def trigger(self) -> None:
        """Wake every client waiting to reconnect; later waits run their full delay again."""
        self._event.set()
        self._event = asyncio.Event()

    async def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until triggered; True when triggered."""
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except TimeoutError:
            return False
        return True


class HostClient:
    """Watches one agent until cancelled."""

    def __init__(
        self,
        address: AgentAddress,
        options: ConnectionOptions,
        emit: Emit,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
        retry: RetryNow | None = None,
    ) -> None:
        self.address = address
        self.host = str(address)
        self.options = options
        self._emit = emit
        self._backoff = backoff or Backoff()
        self._clock = clock
        self._retry = retry or RetryNow()
        self._stall = stall_timeout(options, 1.0)

    async def run(self) -> None:
        """Connect, stream, and on any failure report it and retry after a backoff delay."""
        while True:
            try:
                await self._session()
                error = "the agent closed the stream"
            except grpc.aio.AioRpcError as exc:
                error = describe_rpc_error(exc, self.options.timeout, self.options.token is not None)
            except TimeoutError:
                error = f"no snapshot for {self._stall:g} s"
            self._emit(HostUnreachable(self.host, self._clock(), error))
            delay = self._backoff.next()
            log.info("host unreachable", extra={"host": self.host, "error": error, "retry_s": delay})
            if await self._retry.sleep(delay):
                self._backoff.reset()  # asked to retry now: start the backoff over

    async def once(self, until: Callable[[pb.HostSnapshot], bool], deadline: float) -> None:
        """One attempt, no retry: GetInfo, then snapshots until ``until`` holds.

        Gives up after ``deadline`` seconds; a host that answered by then is not
        reported unreachable (its last snapshot stands), one that did not is.
        """
        answered = False

        def note(event: HostEvent) -> None:
            nonlocal answered
            answered = True
            self._emit(event)

        try:
            async with asyncio.timeout(deadline):
                await self._session(note, until)
        except grpc.aio.AioRpcError as exc:
            self._emit(HostUnreachable(self.host, self._clock(), describe_rpc_error(exc, deadline, self.options.token is not None)))
        except TimeoutError:
            if not answered:
                self._emit(HostUnreachable(self.host, self._clock(), f"no answer within {deadline:g} s"))

    async def _session(
        self, emit: Emit | None = None, until: Callable[[pb.HostSnapshot], bool] | None = None
    ) -> None:
        emit = emit or self._emit
        async with self.options.open(self.address) as channel:
            stub = pb_grpc.AgentStub(channel)
            info = await stub.GetInfo(pb.GetInfoRequest(), timeout=self.options.timeout)
            emit(InfoReceived(self.host, self._clock(), info))
            self._backoff.reset()
            self._stall = stall = stall_timeout(self.options, info.interval_seconds or 1.0)
            stream = stub.Watch(pb.WatchRequest(interval_ms=self.options.interval_ms))
            try:
                while True:
                    message = await asyncio.wait_for(stream.read(), stall)
                    if message is grpc.aio.EOF:
                        return
                    emit(SnapshotReceived(self.host, self._clock(), message))
                    if until is not None and until(message):
                        return
            finally:
                stream.cancel()


STALL_INTERVALS = 3
"""A watched host that sent no snapshot for this many intervals (and the call timeout) is unreachable."""


def stall_timeout(options: ConnectionOptions, agent_interval: float) -> float:
    """Seconds without a snapshot after which a watched host is reported unreachable."""
    interval = options.interval_ms / 1000 or agent_interval
    return max(options.timeout, STALL_INTERVALS * interval)


async def watch_all(
    addresses: list[AgentAddress], options: ConnectionOptions, emit: Emit, retry: RetryNow | None = None
) -> None:
    """Run one client per address until cancelled (then all are cancelled); ``retry`` wakes them."""
    async with asyncio.TaskGroup() as group:
        for address in addresses:
            group.create_task(HostClient(address, options, emit, retry=retry).run(), name=f"watch {address}")
