"""This host's agent, embedded in the console process (``tuiprof`` with no host given)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from agentd.address import AgentAddress


class LocalAgentError(RuntimeError):
    """The embedded agent could not start; the message says why."""


@contextlib.asynccontextmanager
async def local_agent(interval_ms: int = 1000) -> AsyncIterator[AgentAddress]:
    """Start the embedded agent (in its own thread), yield its address, stop it on exit."""
    from agentd.embedded import start_embedded_agent
    from agentd.errors import AgentdError

    try:
        agent = await asyncio.to_thread(start_embedded_agent, interval_ms or 1000)
    except AgentdError as exc:
        raise LocalAgentError(f"cannot start the embedded agent: {exc}") from exc
    try:
        yield agent.address
    finally:
        await asyncio.to_thread(agent.stop)
