"""Opening a gRPC channel to an agent: token and TLS, the same for every caller.

Every command and screen (console, status, trace, stacks, run) builds one
``ConnectionOptions`` from its command line and opens channels with
``options.open(address)``, so authentication works the same way everywhere.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from agentd.address import AgentAddress


class _BearerToken:
    """Adds ``authorization: Bearer <token>`` to every call.

    grpc.aio files an interceptor under the first call kind it implements only, so
    each call kind gets its own subclass below.
    """

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._metadata)
        return details._replace(metadata=metadata)


class _UnaryUnaryToken(_BearerToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._with_token(client_call_details), request)


class _UnaryStreamToken(_BearerToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._with_token(client_call_details), request)


def open_channel(
    address: AgentAddress, token: str | None = None, tls_ca: str | None = None
) -> grpc.aio.Channel:
    """An asyncio channel to one agent, carrying the token on every call."""
    interceptors = [_UnaryUnaryToken(token), _UnaryStreamToken(token)] if token else None
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    if tls_ca is not None:
        credentials = grpc.ssl_channel_credentials(pathlib.Path(tls_ca).read_bytes())
        return grpc.aio.secure_channel(address.target, credentials, options, interceptors=interceptors)
    return grpc.aio.insecure_channel(address.target, options, interceptors=interceptors)


class InProcessAgents:
    """Agents inside this process whose gRPC server starts with the first channel opened to them
    (the console's embedded agent: gRPC's threads cost CPU even idle, agentd/embedded.py)."""

    def __init__(self) -> None:
        self._serve: dict[AgentAddress, Callable[[], None]] = {}

    def add(self, address: AgentAddress, serve: Callable[[], None]) -> None:
        """``serve()`` makes ``address`` answer gRPC; it is called before the first channel opened
        to it, and raises ``grpc.aio.AioRpcError`` when it cannot (as that channel's calls would)."""
        self._serve[address] = serve

    def remove(self, address: AgentAddress) -> None:
        self._serve.pop(address, None)

    def serve(self, address: AgentAddress) -> None:
        """Make the agent at ``address`` serve, if it is one of these and does not yet (again after a failure)."""
        serve = self._serve.get(address)
        if serve is not None:
            serve()
            self.remove(address)


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """How to reach the agents: built once from the command line, shared by every host and call."""

    token: str | None = None
    tls_ca: str | None = None
    interval_ms: int = 0
    """Requested Watch period; 0 = the agent's own interval."""
    timeout: float = 5.0
    """Seconds to wait for an answer (GetInfo; the floor of the stall timeout on the stream)."""
    in_process: InProcessAgents = field(default_factory=InProcessAgents, compare=False)
    """Agents in this process that serve gRPC once a channel is opened to them."""

    def open(self, address: AgentAddress) -> grpc.aio.Channel:
        """A channel to ``address`` with this token and TLS (an agent in this process serves from now on)."""
        self.in_process.serve(address)
        return open_channel(address, self.token, self.tls_ca)
