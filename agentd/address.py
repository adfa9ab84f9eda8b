"""Where an agent listens: the address type and default ports both sides share.

Owned by the agent (it binds them); the console parses the same ``host:port``
text with the same defaults, so a bare host name means the same port everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_AGENT_PORT = 1779
DEFAULT_METRICS_PORT = 9779
LOOPBACK_HOSTS = ("127.0.0.1", "::1")
"""Both loopback addresses: ``localhost`` names either, so an agent listening on one only leaves
the other free for any local user to listen on, and receive what clients send to ``localhost``."""


def listen_hosts(host: str) -> tuple[str, ...]:
    """The addresses the agent listens on for ``--host``: a loopback host (127.0.0.1, ::1,
    localhost) means both loopback addresses, any other host itself."""
    return LOOPBACK_HOSTS if host.strip("[]") in (*LOOPBACK_HOSTS, "localhost") else (host,)


@dataclass(frozen=True)
class AgentAddress:
    host: str
    port: int = DEFAULT_AGENT_PORT

    @classmethod
    def parse(cls, text: str, default_port: int = DEFAULT_AGENT_PORT) -> AgentAddress:
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
