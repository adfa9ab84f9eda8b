"""Opening a gRPC channel to an agent: token and TLS, the same for every caller.

Every command and screen (console, status, trace, stacks, run) builds one
``ConnectionOptions`` from its command line and opens channels with
``options.open(address)``, so authentication works the same way everywhere.

Where the token may go is decided here too, before every call (``token_destination_problem``):
to a loopback address only when the kernel says root or the caller holds the
listening socket there (any local user may listen on a free loopback port, e.g.
on ``[::1]`` while the agent holds 127.0.0.1 only, and ``localhost`` may name
either); beyond loopback only over TLS, unless ``--allow-plaintext-token``.
"""

from __future__ import annotations

import ipaddress
import os
import pathlib
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from agentd import peer
from agentd.address import AgentAddress
from tuiprof.errors import BadInputError


class _BearerToken:
    """Adds ``authorization: Bearer <token>`` to every call, once ``check()`` let it (it raises otherwise).

    grpc.aio files an interceptor under the first call kind it implements only, so
    each call kind gets its own subclass below.
    """

    def __init__(self, token: str, check: Callable[[], None]) -> None:
        self._metadata = ("authorization", f"Bearer {token}")
        self._check = check

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        self._check()
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._metadata)
        return details._replace(metadata=metadata)


_Call = TypeVar("_Call")
Continuation = Callable[[grpc.aio.ClientCallDetails, Message], Awaitable[_Call]]
"""How an interceptor hands a call on to the channel (grpc's signature)."""


class _UnaryUnaryToken(_BearerToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Continuation[grpc.aio.UnaryUnaryCall],
                                    client_call_details: grpc.aio.ClientCallDetails,
                                    request: Message) -> grpc.aio.UnaryUnaryCall:
        return await continuation(self._with_token(client_call_details), request)


class _UnaryStreamToken(_BearerToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Continuation[grpc.aio.UnaryStreamCall],
                                     client_call_details: grpc.aio.ClientCallDetails,
                                     request: Message) -> grpc.aio.UnaryStreamCall:
        return await continuation(self._with_token(client_call_details), request)


def open_channel(
    address: AgentAddress, token: str | None = None, tls_ca: str | None = None,
    check: Callable[[], None] = lambda: None,
) -> grpc.aio.Channel:
    """An asyncio channel to one agent, carrying the token on every call once ``check()`` returned
    (it raises, e.g. TokenRefusedError, to fail the call instead)."""
    interceptors = [_UnaryUnaryToken(token, check), _UnaryStreamToken(token, check)] if token else None
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    if tls_ca is not None:
        credentials = grpc.ssl_channel_credentials(pathlib.Path(tls_ca).read_bytes())
        return grpc.aio.secure_channel(address.target, credentials, options, interceptors=interceptors)
    return grpc.aio.insecure_channel(address.target, options, interceptors=interceptors)


class TokenRefusedError(grpc.aio.AioRpcError, BadInputError):
    """The token is not sent to this address; raised where a call would fail, so callers report it
    as they report a failed call (FAILED_PRECONDITION, the reason as details). Before any call (the
    hosts on the command line) it is bad input: the reason is the whole message."""

    def __init__(self, reason: str) -> None:
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, grpc.aio.Metadata(), grpc.aio.Metadata(), reason)

    def __str__(self) -> str:
        return self.details() or ""


def token_destination_problem(address: AgentAddress, tls: bool, allow_plaintext_token: bool) -> str | None:
    """Why a token must not be sent to ``address``, or None when it may.

    Every address the name resolves to counts, as gRPC may try any of them: a loopback
    one must be listened on by root or the caller (or by no one: then nothing receives
    the token); any other one needs TLS or ``allow_plaintext_token``.
    """
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        return f"not sending the token to {address.target}: cannot resolve {address.host!r} ({reason})"
    ips = dict.fromkeys(ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in infos)
    for ip in ips:
        if not ip.is_loopback:
            if tls or allow_plaintext_token:
                continue
            return (f"not sending the token to {address.target} in clear text ({ip} is not loopback); "
                    "give --tls-ca FILE for an agent serving TLS, or --allow-plaintext-token to send it anyway")
        try:
            listener = peer.tcp_listener((str(ip), address.port))
        except peer.PeerLookupError as exc:
            return f"not sending the token to {address.target}: {exc}"
        if listener is not None and listener.uid not in (0, os.getuid()):
            return (f"not sending the token to {address.target}: port {address.port} on {ip} is held by "
                    f"{listener}, not by root or you; stop that process or start agentd there")
    return None


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
    allow_plaintext_token: bool = False
    """Send the token to non-loopback agents without TLS (``--allow-plaintext-token``)."""
    interval_ms: int = 0
    """Requested Watch period; 0 = the agent's own interval."""
    timeout: float = 5.0
    """Seconds to wait for an answer (GetInfo; the floor of the stall timeout on the stream)."""
    in_process: InProcessAgents = field(default_factory=InProcessAgents, compare=False)
    """Agents in this process that serve gRPC once a channel is opened to them."""

    def open(self, address: AgentAddress) -> grpc.aio.Channel:
        """A channel to ``address`` with this token and TLS (an agent in this process serves from now on).

        Each call fails with TokenRefusedError when the token must not go there at that moment
        (``token_destination_problem``): checked per call, as an agent restarting under a long-lived
        channel leaves its port free for anyone to take before the channel reconnects.
        """
        self.in_process.serve(address)
        return open_channel(address, self.token, self.tls_ca, lambda: self.check_token_destination(address))

    def check_token_destination(self, address: AgentAddress) -> None:
        """Raise TokenRefusedError when this token must not be sent to ``address`` now."""
        if self.token is None:
            return
        problem = token_destination_problem(address, self.tls_ca is not None, self.allow_plaintext_token)
        if problem is not None:
            raise TokenRefusedError(problem)
