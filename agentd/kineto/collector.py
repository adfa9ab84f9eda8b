"""The IPC endpoint as part of the agent's lifecycle: started with the agent, closed with it,
reported in GetInfo / snapshots as collector ``kineto`` (unavailable, with the reason, when
the socket cannot be bound — e.g. dynolog already holds it), and the registry's
silent clients dropped once per interval. The optional dynolog RPC closes with it too."""

from __future__ import annotations

import asyncio
import logging

from agentd.collectors.base import Collector
from agentd.kineto.endpoint import EndpointError, KinetoEndpoint
from agentd.kineto.registry import Registry
from agentd.kineto.rpc import DynologRpc
from agentd.proto import tuiprof_agent_pb2 as pb

log = logging.getLogger(__name__)


class KinetoCollector(Collector):
    name = "kineto"
    clocked_by_snapshots = True  # in-memory work only: no thread of its own to wake each second

    def __init__(self, interval_seconds: float, registry: Registry, socket_dir: str | None) -> None:
        super().__init__(interval_seconds)
        self.registry = registry
        self.endpoint: KinetoEndpoint | None = None
        self._rpc: DynologRpc | None = None
        self._rpc_loop: asyncio.AbstractEventLoop | None = None
        self._rpc_task: asyncio.Task[None] | None = None
        self._reason = ""
        try:
            self.endpoint = KinetoEndpoint(registry, socket_dir)
            log.info("Kineto IPC endpoint listening", extra={"socket": self.endpoint.description})
        except EndpointError as exc:
            self._reason = str(exc)
            log.warning("Kineto IPC endpoint unavailable", extra={"reason": self._reason})

    def serve_rpc(self, rpc: DynologRpc) -> None:
        """Serve dynolog's RPC on the running event loop; closed with this collector."""
        self._rpc_loop = asyncio.get_running_loop()
        self._rpc = rpc
        self._rpc_task = self._rpc_loop.create_task(rpc.serve())

    def status(self) -> pb.CollectorStatus:
        return pb.CollectorStatus(name=self.name, available=self.endpoint is not None,
                                  reason=self._reason, interval_seconds=self.interval_seconds)

    def collect(self) -> None:
        for gone in self.registry.expire():
            log.info("Kineto client stopped polling", extra={"pid": gone.host_pid, "job_id": gone.job_id})

    def fill(self, snapshot: pb.HostSnapshot) -> None:
        """Nothing per snapshot: registered processes are served through CaptureTrace."""

    def close(self) -> None:
        if self._rpc is not None and self._rpc_loop is not None and not self._rpc_loop.is_closed():
            self._rpc_loop.call_soon_threadsafe(self._rpc.close)
            self._rpc = None
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
