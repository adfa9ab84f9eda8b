"""Who may talk to agentd: the loopback rule, the shared token, the gRPC check of it, the caller.

Three kinds of caller (README, "Security"):

- the token holder: a call with ``authorization: Bearer <token>`` when a token is
  configured; an administrator, like root;
- a local user: a call without a token whose socket the kernel says belongs to a
  uid on this host (``agentd.peer``); root (uid 0) is an administrator;
- anyone else: a call with a wrong token is refused UNAUTHENTICATED by the
  interceptor before any handler runs; a call without a token from another
  host is refused UNAUTHENTICATED by ``CallerIdentifier`` before the RPC does
  anything.

Without a token the agent listens on loopback only. A token is sent in clear
text unless TLS is on, so a token agent listening beyond loopback without TLS
refuses to start unless told ``--allow-plaintext-token``.
"""

from __future__ import annotations

import dataclasses
import hmac
import contextvars
import ipaddress
import logging
import pathlib
import socket
import stat
import string
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from agentd.errors import SecurityError
from agentd.peer import PeerLookupError, grpc_peer_uid
from agentd.token import TOKEN_ENV, TokenFileError, read_token

log = logging.getLogger(__name__)

_TOKEN_CHARACTERS = frozenset(string.ascii_letters + string.digits + string.punctuation)
# Shorter tokens are accepted with a warning: they can be guessed by trying.
MIN_TOKEN_LENGTH = 16


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
    if token is not None:
        _warn_weak_token(token, token_file)
    return token


def _warn_weak_token(token: str, token_file: pathlib.Path | None) -> None:
    """Log what makes a usable token risky: group members can read it, or it is short."""
    if token_file is not None:
        mode = token_file.stat().st_mode
        if mode & stat.S_IRGRP:
            log.warning("token file is readable by its group: every member can control this agent; "
                        f"run `chmod 600 {token_file}`",
                        extra={"token_file": str(token_file), "mode": stat.filemode(mode)})
    if len(token) < MIN_TOKEN_LENGTH:
        log.warning(f"the token has fewer than {MIN_TOKEN_LENGTH} characters and can be guessed; "
                    "make one with `openssl rand -hex 32`", extra={"length": len(token)})


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


def check_exposure(host: str, token: str | None, tls: bool, allow_plaintext_token: bool) -> None:
    """Refuse to listen beyond loopback without a token, or with a token sent in clear text."""
    if is_loopback(host):
        return
    if token is None:
        raise SecurityError(
            f"refusing to listen on {host} without a token: anyone on the network could "
            f"control this agent; pass --token-file FILE (or set ${TOKEN_ENV}), "
            "or listen on a loopback address such as 127.0.0.1"
        )
    if not tls and not allow_plaintext_token:
        raise SecurityError(
            f"refusing to listen on {host} with a token but without TLS: every client would send "
            "the token in clear text to anyone on the network path; pass --tls-cert FILE --tls-key FILE, "
            "or --allow-plaintext-token on a network you trust"
        )


@dataclasses.dataclass(frozen=True)
class Caller:
    """Who is making a gRPC call, as far as the agent can prove it.

    ``admin``: presented the token, or the kernel says the calling socket is
    root's. ``uid``: the kernel-confirmed owner of a local caller's socket
    (None: not local, or not found). A caller sees a rank's private data
    (exception text, stacks, traces, files) when it is an admin or owns the rank.
    """

    uid: int | None
    admin: bool
    reason: str = ""  # why the caller is not identified, when uid is None and not admin

    @classmethod
    def token_holder(cls) -> Caller:
        return cls(uid=None, admin=True)

    @classmethod
    def local(cls, uid: int) -> Caller:
        return cls(uid=uid, admin=uid == 0)

    @classmethod
    def unidentified(cls, reason: str) -> Caller:
        return cls(uid=None, admin=False, reason=reason)

    def owns(self, owner_uid: int | None) -> bool:
        """Whether this caller may see private data of a process owned by ``owner_uid``."""
        return self.admin or (self.uid is not None and owner_uid is not None and self.uid == owner_uid)

    def __str__(self) -> str:
        if self.admin:
            return "root" if self.uid == 0 else "the token holder"
        return f"uid {self.uid}" if self.uid is not None else "an unidentified caller"


class CallerIdentifier:
    """Turns a call's context into its ``Caller``, or refuses it.

    A call that carries an ``authorization`` header got past the token
    interceptor, so it holds the token. Any other call is identified by the uid
    the kernel reports for the calling socket; one from another host has no
    such socket and is refused (with a token configured: UNAUTHENTICATED, as
    before), or, on a loopback-only agent where that cannot happen unless the
    lookup itself fails, served as an unidentified caller who sees no private data.
    """

    def __init__(self, token_required: bool, port: int) -> None:
        self._token_required = token_required
        self._port = port

    async def identify(self, context: grpc.aio.ServicerContext) -> Caller:
        if self._token_required and any(key == "authorization" for key, _ in context.invocation_metadata() or ()):
            return Caller.token_holder()
        peer = context.peer()
        try:
            uid = grpc_peer_uid(peer, self._port)
        except PeerLookupError as exc:
            log.warning("cannot identify a caller", extra={"peer": peer, "reason": str(exc)})
            uid, reason = None, str(exc)
        else:
            reason = f"no socket on this host is the calling end of {peer}"
        if uid is not None:
            return Caller.local(uid)
        if self._token_required:
            log.warning("refused call without a token from another host", extra={"peer": peer})
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)
        return Caller.unidentified(reason)


_CURRENT_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("agentd_caller")


def set_current_caller(caller: Caller) -> None:
    """Record ``caller`` for the rest of this call (each gRPC call runs in its own task)."""
    _CURRENT_CALLER.set(caller)


def current_caller() -> Caller:
    """The caller of the gRPC call being served (for services delegated to, e.g. traces).

    Outside a call (a bug) the answer is an unidentified caller, who sees nothing private.
    """
    return _CURRENT_CALLER.get(Caller.unidentified("not inside a gRPC call"))


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a call whose ``authorization`` metadata is anything but ``Bearer <token>``.

    The comparison takes the same time however much of the token matches.
    A refused call gets a handler of the same shape that aborts at once, so the
    real handler is never invoked. A call with no ``authorization`` at all goes
    on to ``CallerIdentifier``, which serves it only from a local user (the
    interceptor cannot see the peer address).
    """

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or self._acceptable(handler_call_details):
            return handler
        log.warning("refused call without a valid token",
                    extra={"method": handler_call_details.method})
        return _refusing_handler(handler)

    def _acceptable(self, details: grpc.HandlerCallDetails) -> bool:
        presented = [
            value for key, value in (details.invocation_metadata or ())
            if key == "authorization"
        ]
        if not presented:
            return True  # no token: a local user's call, or refused by CallerIdentifier
        if len(presented) != 1:
            return False
        value = presented[0]
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
        return hmac.compare_digest(raw, self._expected)


_REFUSAL = "missing or wrong token: send `authorization: Bearer <token>` (tuiprof --token-file FILE)"


async def _refuse_unary(request: object, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)


async def _refuse_stream(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
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
