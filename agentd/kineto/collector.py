"""The IPC endpoint as part of the agent's lifecycle: started with the agent, closed with it,
reported in GetInfo / snapshots as collector ``kineto`` (unavailable, with the reason, when
the socket cannot be bound — e.g. dynolog, or a squatter, already holds it: then
who holds it, while the bind is tried again every few seconds), and the registry's
silent clients dropped once per interval. A root agent's tick also looks, every few
seconds, for containers' network namespaces to serve (agentd.kineto.namespaces). The
optional dynolog RPC closes with it too."""

from __future__ import annotations

import asyncio
import logging

from agentd.collectors.base import Collector
from agentd.kineto.endpoint import EndpointError, KinetoEndpoint, UserFolderError
from agentd.kineto.registry import Registry
from agentd.kineto.rpc import DynologRpc
from agentd.proto import tuiprof_agent_pb2 as pb

log = logging.getLogger(__name__)


class KinetoCollector(Collector):
    name = "kineto"
    clocked_by_snapshots = True  # in-memory work only: no thread of its own to wake each second

    def __init__(self, interval_seconds: float, registry: Registry, socket_dir: str | None,
                 user_folders: str | None = None, containers: bool = False) -> None:
        super().__init__(interval_seconds)
        self.registry = registry
        self.endpoint: KinetoEndpoint | None = None
        self._rpc: DynologRpc | None = None
        self._rpc_loop: asyncio.AbstractEventLoop | None = None
        self._rpc_task: asyncio.Task[None] | None = None
        self._reason = ""
        try:
            self.endpoint = KinetoEndpoint(registry, socket_dir, user_folders, containers)
            if not self.endpoint.unavailable:
                log.info("Kineto IPC endpoint listening", extra={"socket": self.endpoint.description})
        except EndpointError as exc:
            self._reason = str(exc)
            log.warning("Kineto IPC endpoint unavailable", extra={"reason": self._reason})

    def serve_rpc(self, rpc: DynologRpc) -> None:
        """Serve dynolog's RPC on the running event loop; closed with this collector."""
        self._rpc_loop = asyncio.get_running_loop()
        self._rpc = rpc
        self._rpc_task = self._rpc_loop.create_task(rpc.serve())

    def user_folder(self, uid: int) -> str:
        """``uid``'s own Kineto IPC folder (UserFolderError: none served)."""
        if self.endpoint is None:
            raise UserFolderError(f"the agent's Kineto endpoint is not running: {self._reason}")
        return self.endpoint.user_folder(uid)

    def status(self) -> pb.CollectorStatus:
        reason = self._reason
        if self.endpoint is not None and self.endpoint.unavailable:
            # Available (per-user folders are served, and the registry must keep expiring), but loud.
            reason = f"{self.endpoint.unavailable}; retrying; per-user folders still served"
        return pb.CollectorStatus(name=self.name, available=self.endpoint is not None,
                                  reason=reason, interval_seconds=self.interval_seconds)

    def collect(self) -> None:
        if self.endpoint is not None:
            self.endpoint.serve_namespaces()
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
