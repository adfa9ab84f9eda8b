"""Errors agentd reports to the person starting it: one line, what was wrong and what to do.

``agentd.cli`` prints ``agentd: <message>`` for any ``AgentdError`` and exits
with its ``exit_code``; nothing else reaches the terminal as a traceback.
"""

from __future__ import annotations

import errno
import socket

from agentd import peer


class AgentdError(Exception):
    """A problem the operator can fix; ``str()`` is the whole explanation."""

    exit_code = 1


class UsageError(AgentdError):
    """A bad command line (unknown flag, malformed value)."""

    exit_code = 2


class ConfigError(AgentdError):
    """A config file that cannot be read or holds a bad key or value."""

    exit_code = 2


class SecurityError(AgentdError):
    """A setting that would expose the agent, or a token that cannot be used."""

    exit_code = 3


class TlsError(AgentdError):
    """A TLS certificate or key that cannot be loaded."""

    exit_code = 3


class BindError(AgentdError):
    """A port that cannot be listened on (in use, no permission, bad address)."""

    exit_code = 4

    @classmethod
    def for_port(cls, what: str, host: str, port: int, exc: OSError, flag: str) -> BindError:
        """The error for a failed bind of ``what`` (gRPC, metrics) with its usual cause."""
        if exc.errno == errno.EADDRINUSE:
            return cls(f"{what} port {port} on {host} is already in use by {_port_holder(host, port)}; "
                       f"stop that process or choose another port with {flag}")
        if exc.errno == errno.EACCES:
            return cls(f"no permission to listen on {what} port {port}; "
                       f"use a port above 1023 with {flag}")
        if exc.errno == errno.EADDRNOTAVAIL:
            return cls(f"cannot listen on {host}: no local interface has that address; check --host")
        return cls(f"cannot listen on {host}:{port} for {what}: {exc.strerror or exc}; check --host")


def _port_holder(host: str, port: int) -> str:
    """Who listens on ``host:port``, per the kernel: a user may take an agent's port while it restarts."""
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
        listener = peer.tcp_listener((str(address), port))
    except (OSError, peer.PeerLookupError) as exc:
        return f"a process this agent cannot name ({exc})"
    if listener is None:
        return "a socket that is not listening (see `ss -tanpe`)"
    return str(listener)
