"""Opening a gRPC channel to an agent: address parsing, token and TLS.

Every client (console, status, trace, stacks) goes through ``open_channel`` so
that authentication works the same way everywhere.
"""

from __future__ import annotations

import os
import pathlib
import stat
from dataclasses import dataclass

import grpc

DEFAULT_AGENT_PORT = 1779
TOKEN_ENV = "TUIPROF_TOKEN"


class TokenFileError(Exception):
    """A token file that cannot be used (missing, unreadable, or world-readable)."""


@dataclass(frozen=True)
class AgentAddress:
    host: str
    port: int = DEFAULT_AGENT_PORT

    @classmethod
    def parse(cls, text: str, default_port: int = DEFAULT_AGENT_PORT) -> "AgentAddress":
        """Parse ``host``, ``host:port`` or ``[v6addr]:port``."""
        text = text.strip()
        if not text:
            raise ValueError("empty host name")
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            port_text = rest.removeprefix(":")
        elif text.count(":") == 1:
            host, port_text = text.split(":")
        else:
            host, port_text = text, ""
        if not port_text:
            return cls(host, default_port)
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"bad port {port_text!r} in {text!r}: expected 1-65535")
        return cls(host, int(port_text))

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.host if self.port == DEFAULT_AGENT_PORT else self.target


def read_token(token_file: str | os.PathLike[str] | None) -> str | None:
    """The shared token from ``token_file`` or ``$TUIPROF_TOKEN``; None when neither is set.

    A token file readable by other users is refused: anyone who can read it can
    control the agents.
    """
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    path = pathlib.Path(token_file)
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror}") from exc
    if mode & stat.S_IROTH:
        raise TokenFileError(
            f"token file {path} is readable by every user (mode {stat.filemode(mode)}); "
            f"run `chmod 600 {path}`"
        )
    if not text:
        raise TokenFileError(f"token file {path} is empty")
    return text


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
