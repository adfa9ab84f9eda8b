"""Taking every host's stacks of one job: the workflow ``tuiprof stacks`` and the stacks screen share.

First every host's newest snapshot (which ranks live where, of which job),
then the stacks of the chosen job's ranks, hosts in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from agentd.address import AgentAddress
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from agentd.stacks.merge import merge
from agentd.stacks.wire import samples_from_ranks, tree_to_proto
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.errors import describe_rpc_error
from tuiprof.errors import BadInputError
from tuiprof.model.stacks import HostStacks, single_job


class PidRefusedError(BadInputError):
    """An agent refused the processes asked for by pid: not processes under ``tuiprof run``, or not the caller's."""

    def __init__(self, host: str, details: str) -> None:
        super().__init__(f"{host}: {details}")


async def gather_stacks(
    targets: list[AgentAddress], options: ConnectionOptions, take_now: bool, native: bool, timeout: float,
    job: str | None = None, pids: list[int] | None = None,
) -> list[HostStacks]:
    """Every host's newest snapshot, then every host's stacks of one job (or of ``pids``), hosts in parallel.

    The snapshots come first so that no process is dumped before it is known
    which job is meant; a slow host costs at most ``timeout`` per phase.
    Raises ``JobChoiceError`` when neither ``job`` nor ``pids`` is given and the
    hosts run several jobs, ``PidRefusedError`` when an agent refuses ``pids``.
    """
    hosts = [HostStacks(str(a)) for a in targets]
    async with contextlib.AsyncExitStack() as stack:
        stubs = [pb_grpc.AgentStub(await stack.enter_async_context(options.open(a))) for a in targets]
        await asyncio.gather(*(_snapshot(stub, host, timeout) for stub, host in zip(stubs, hosts, strict=True)))
        if job is None and not pids:
            job = single_job(hosts)
        await asyncio.gather(*(_stacks(stub, host, take_now, native, timeout, job, pids)
                               for stub, host in zip(stubs, hosts, strict=True) if host.error is None))
    return hosts


async def _snapshot(stub: pb_grpc.AgentStub, host: HostStacks, timeout: float) -> None:
    """The agent's newest snapshot: its ranks, their in-flight collectives, its hang verdict."""
    call = stub.Watch(pb.WatchRequest(), timeout=timeout)
    try:
        async for snapshot in call:
            host.snapshot = snapshot
            return
    except grpc.aio.AioRpcError as exc:
        host.error = describe_rpc_error(exc, timeout)
    finally:
        call.cancel()


async def _stacks(
    stub: pb_grpc.AgentStub, host: HostStacks, take_now: bool, native: bool, timeout: float, job: str | None,
    asked: list[int] | None,
) -> None:
    pids = asked or [r.pid for r in host.live_ranks() if job is None or r.job_id == job]
    if not pids:
        return  # no rank (of this job) here: nothing to dump
    try:
        host.reply = await stub.GetStacks(
            pb.GetStacksRequest(take_now=take_now, native=native, pids=pids if take_now else []),
            timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        if asked and exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            raise PidRefusedError(host.host, exc.details() or "") from exc
        host.error = describe_rpc_error(exc, timeout)
        return
    if not take_now:
        _keep_only(host.reply, set(pids))


def _keep_only(reply: pb.StacksReply, pids: set[int]) -> None:
    """An incident's stacks reduced to ``pids``, re-merged from its raw per-rank stacks."""
    if {r.pid for r in reply.ranks} <= pids:
        return
    kept = [r for r in reply.ranks if r.pid in pids]
    del reply.ranks[:]
    reply.ranks.extend(kept)
    reply.merged.CopyFrom(tree_to_proto(merge(samples_from_ranks(kept))))
