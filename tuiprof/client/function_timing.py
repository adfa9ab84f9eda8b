"""Starting and stopping the timing of Python functions in a running rank (the ranks tab's `f` key),
through the agent's SetFunctionTiming: the caller's own ranks, or any with root or the token."""

from __future__ import annotations

import re

import grpc

from agentd.address import AgentAddress
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.errors import describe_rpc_error
from tuiprof.errors import BadInputError, TuiprofError

# The rank applies a request within a second, the agent answers once it has (at most 5 s), and the
# request waits for the agent's next reading of its ranks (an interval) first.
SWITCH_TIMEOUT_S = 15.0


class FunctionTimingError(TuiprofError):
    """The agent did not take the request (refused, no such rank, unreachable); the message says why."""


def parse_switch(text: str) -> tuple[list[str], list[str]]:
    """Names separated by commas or spaces: those to start, and those to stop (written ``-name``)."""
    names = [name for name in re.split(r"[,\s]+", text) if name]
    if not names or any(name == "-" for name in names):
        raise BadInputError("name functions to time as module@function or module:Class.function, and "
                            "-name to stop one")
    return [n for n in names if not n.startswith("-")], [n[1:] for n in names if n.startswith("-")]


async def switch_function_timing(address: AgentAddress, options: ConnectionOptions, pid: int, start: list[str],
                                 stop: list[str], timeout: float = SWITCH_TIMEOUT_S) -> pb.FunctionTimingOutcome:
    """Ask ``address``'s agent to stop, then start timing the names in rank ``pid``; its answer."""
    async with options.open(address) as channel:
        try:
            outcome: pb.FunctionTimingOutcome = await pb_grpc.AgentStub(channel).SetFunctionTiming(
                pb.SetFunctionTimingRequest(pid=pid, start=start, stop=stop), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise FunctionTimingError(f"{address}: {describe_rpc_error(exc, timeout)}") from exc
    return outcome


def outcome_text(outcome: pb.FunctionTimingOutcome, start: list[str], stop: list[str]) -> str:
    """One or more lines for people: what was asked, and what the rank made of it."""
    asked = ", ".join([*(f"start {name}" for name in start), *(f"stop {name}" for name in stop)])
    if not outcome.acknowledged:
        return f"{asked}: not applied yet: {outcome.reason}"
    if not outcome.problems:
        return f"{asked}: done"
    return "\n".join([f"{asked}: applied, except:", *outcome.problems])
