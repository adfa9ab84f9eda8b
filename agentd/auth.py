"""Who may talk to agentd: the loopback rule, the shared token, and the gRPC check of it.

Without a token the agent listens on loopback only, so only local users reach it.
With a token it may listen anywhere, and every gRPC call must present
``authorization: Bearer <token>``; a call without it is answered UNAUTHENTICATED
by the interceptor before any handler runs.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import pathlib
import socket
import string
from collections.abc import Awaitable, Callable

import grpc

from agentd.errors import SecurityError
from agentd.token import TOKEN_ENV, TokenFileError, read_token

log = logging.getLogger(__name__)

_TOKEN_CHARACTERS = frozenset(string.ascii_letters + string.digits + string.punctuation)


def load_token(token_file: pathlib.Path | None) -> str | None:
    """The shared token from ``token_file`` (mode-checked) or ``$TUIPROF_TOKEN``; None when neither."""
    try:
        token = read_token(token_file)
    except TokenFileError as exc:
        raise SecurityError(str(exc)) from None
    if token is not None and not set(token) <= _TOKEN_CHARACTERS:
        origin = token_file if token_file is not None else f"${TOKEN_ENV}"
        raise SecurityError(
            f"the token from {origin} has spaces or non-ASCII characters; "
            "use printable ASCII, e.g. `openssl rand -hex 32`"
        )
    return token


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback address (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_exposure(host: str, token: str | None) -> None:
    """Refuse to listen beyond loopback without a token."""
    if token is None and not is_loopback(host):
        raise SecurityError(
            f"refusing to listen on {host} without a token: anyone on the network could "
            f"control this agent; pass --token-file FILE (or set ${TOKEN_ENV}), "
            "or listen on a loopback address such as 127.0.0.1"
        )


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through only when its ``authorization`` metadata is ``Bearer <token>``.

    The comparison takes the same time however much of the token matches.
    A refused call gets a handler of the same shape that aborts at once, so the
    real handler is never invoked.
    """

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or self._authorized(handler_call_details):
            return handler
        log.warning("refused call without a valid token",
                    extra={"method": handler_call_details.method})
        return _refusing_handler(handler)

    def _authorized(self, details: grpc.HandlerCallDetails) -> bool:
        presented = [
            value for key, value in (details.invocation_metadata or ())
            if key == "authorization"
        ]
        if len(presented) != 1:
            return False
        value = presented[0]
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
        return hmac.compare_digest(raw, self._expected)


_REFUSAL = "missing or wrong token: send `authorization: Bearer <token>` (tuiprof --token-file FILE)"


async def _refuse_unary(request: object, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)


async def _refuse_stream(request: object, context: grpc.aio.ServicerContext):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)
    yield  # pragma: no cover - makes this an async generator; abort raises first


def _refusing_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler with ``handler``'s streaming shape that only refuses.

    It has no deserializer: an unauthenticated request is never parsed.
    """
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_refuse_stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_refuse_unary)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_refuse_stream)
    return grpc.unary_unary_rpc_method_handler(_refuse_unary)
