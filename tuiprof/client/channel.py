"""Opening a gRPC channel to an agent: address parsing, token and TLS.

Every client (console, status, trace, stacks) goes through ``open_channel`` so
that authentication works the same way everywhere.
"""

from __future__ import annotations

import pathlib

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
