"""SetFunctionTiming: start or stop timing Python functions in a running rank, with no restart.

The caller rule is every per-process action's (``Caller.owns``): a local caller only their own ranks
(the uid the kernel gives for the calling socket against the rank's confirmed owner), root and the
token holder any. The request goes to the ranks collector, which writes it beside the rank's segment
at its next reading (``collectors.rank_function_requests``); the call then waits for the rank's answer
(its publisher applies requests once a second) for at most ``ANSWER_WAIT_S`` and returns it, or the
request's serial unanswered with the reason. The answer also stays in the rank's
``RankStats.function_request`` for every console to see.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, NoReturn, cast

import grpc

from agentd.agent import Agent
from agentd.auth import Caller
from agentd.collectors.rank_function_requests import (MAX_NAME, MAX_NAMES, FunctionRequest,
                                                      RequestNotWrittenError)
from agentd.collectors.rank_functions import NOT_ANSWERED
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.runner import UnloadableCollector

if TYPE_CHECKING:  # the registry imports collectors itself, reporting those that cannot be
    from agentd.collectors.ranks import RanksCollector

ANSWER_WAIT_S = 5.0  # the rank applies requests once a second, the agent reads its answer once an interval


class FunctionTimingService:
    """Hands callers' requests to the ranks collector and waits for the rank's answer."""

    def __init__(self, ranks: RanksCollector) -> None:
        self._ranks = ranks

    @classmethod
    def attach(cls, agent: Agent) -> FunctionTimingService | None:
        """The service over ``agent``'s ranks collector; None when the agent runs none."""
        found = [runner.collector for runner in agent.runners
                 if runner.name == "ranks" and not isinstance(runner.collector, UnloadableCollector)]
        return cls(cast("RanksCollector", found[0])) if found else None

    async def set_function_timing(self, request: pb.SetFunctionTimingRequest, context: grpc.aio.ServicerContext,
                                  caller: Caller) -> pb.FunctionTimingOutcome:
        names = [*request.start, *request.stop]
        if not names:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "name at least one function to start or stop")
        if len(request.start) > MAX_NAMES or len(request.stop) > MAX_NAMES or any(len(n) > MAX_NAME for n in names):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"at most {MAX_NAMES} names to start and {MAX_NAMES} to stop, each at most {MAX_NAME} "
                         "characters")
        owner = self._ranks.live_rank_owner(request.pid)
        if owner is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND,
                         f"pid {request.pid} is not a live rank on this host: only processes started with "
                         "`tuiprof run` (with a tuiprof segment) time functions")
        if not caller.owns(owner):
            await _abort(context, grpc.StatusCode.PERMISSION_DENIED,
                         f"pid {request.pid} is not yours ({caller}): a rank's function timing is switched only "
                         "by its owner, root, or with the token")
        sent = FunctionRequest(request.pid, list(request.start), list(request.stop))
        self._ranks.function_requests.submit(sent)
        try:
            await asyncio.wait_for(asyncio.wrap_future(sent.written), ANSWER_WAIT_S)
        except RequestNotWrittenError as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except TimeoutError:
            await _abort(context, grpc.StatusCode.UNAVAILABLE,
                         f"the ranks collector did not take the request within {ANSWER_WAIT_S:.0f} s; try again")
        try:
            return await asyncio.wait_for(asyncio.wrap_future(sent.answered), ANSWER_WAIT_S)
        except TimeoutError:
            return pb.FunctionTimingOutcome(serial=sent.serial, reason=NOT_ANSWERED)


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """``context.abort``, which always raises (grpc's type stubs do not say so)."""
    await context.abort(code, details)
    raise AssertionError("ServicerContext.abort returned")
