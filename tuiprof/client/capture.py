"""A cluster-wide capture: one start time for every agent, progress per host, files fetched when asked.

Shared by ``tuiprof trace`` and the console's traces screen: both call
``capture_cluster`` with their connection options and a progress callback
(the progress types are ``tuiprof.model.capture``). Each agent summarises its
ranks' files itself and its last reply carries the summaries
(``TraceTarget.summary``), so the files can stay on the nodes; given an
``output`` folder every file is fetched into it as it is written, and
``fetch_files`` fetches any subset later. Fetches stream in parallel,
``FETCH_CONCURRENCY`` files at a time, each chunk written to disk as it
arrives. Each host is independent: one that cannot be reached, or whose ranks
fail, does not stop the others; its error is kept for the summary and exit
status. A Kineto capture that matches no process on a host is asked for again,
with the same start time, for up to libkineto's poll period
(``REGISTRATION_WAIT_SECONDS``): a job started a moment ago registers with the
agent on its first poll. The host's phase is ``waiting`` meanwhile; after that,
the agent's reply (why nothing matched) stands.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from agentd.address import AgentAddress
from agentd.kineto.config import DEFAULT_POLL_SECONDS
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto import tuiprof_agent_pb2_grpc as pb_grpc
from tuiprof.client.channel import ConnectionOptions
from tuiprof.client.errors import describe_rpc_error
from tuiprof.model import convert
from tuiprof.model.capture import ClusterCapture, FetchedFile, HostProgress
from tuiprof.model.messages import TraceTarget, TraceTargetState

KINDS = {"kineto": pb.CaptureTraceRequest.KINETO, "timeline": pb.CaptureTraceRequest.TIMELINE}
SUMMARY_STEPS = {"all": pb.CaptureTraceRequest.ALL_STEPS, "complete": pb.CaptureTraceRequest.COMPLETE_STEPS}
# Files streamed at once by fetch_files: each holds about one 1 MiB chunk (plus gRPC's window) in memory.
FETCH_CONCURRENCY = 16
# libkineto polls every 5 s by default and then warms up; every host gets the same
# start time this far ahead so all of them can take it.
DEFAULT_START_DELAY_MS = 8000
STATUS_PERIOD_SECONDS = 0.5
# Once every file is written the agent only summarises (a second or so): asked more often then.
SUMMARY_PERIOD_SECONDS = 0.1
RPC_TIMEOUT_SECONDS = 10.0
# How long a host where nothing matched is asked again: a process registers on its first poll.
REGISTRATION_WAIT_SECONDS = DEFAULT_POLL_SECONDS


@dataclass(frozen=True)
class CaptureSpec:
    """What to capture, identical for every host."""

    kind: str = "kineto"
    duration_ms: int | None = None
    iterations: int | None = None
    last_events: int | None = None
    pids: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    job_id: str = ""
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    steps: str = "all"  # what the agents' summaries count (``--steps``)
    like_hta: bool = False  # and whether they count as HTA does (``--like-hta``)
    start_delay_ms: int = DEFAULT_START_DELAY_MS
    # Give up on files not written this long after the start (traced span included).
    timeout_s: float = 120.0

    def request(self, start_time_unix_ms: int) -> pb.CaptureTraceRequest:
        request = pb.CaptureTraceRequest(
            kind=KINDS[self.kind], start_time_unix_ms=start_time_unix_ms, pids=self.pids,
            ranks=self.ranks, job_id=self.job_id,
            options=pb.TraceOptions(record_shapes=self.record_shapes, profile_memory=self.profile_memory,
                                    with_stack=self.with_stack, with_flops=self.with_flops,
                                    with_modules=self.with_modules),
            summary_steps=SUMMARY_STEPS[self.steps], summary_like_hta=self.like_hta,
        )
        if self.iterations is not None:
            request.iterations = self.iterations
        elif self.last_events is not None:
            request.last_events = self.last_events
        else:
            assert self.duration_ms is not None
            request.duration_ms = self.duration_ms
        return request


ProgressCallback = Callable[[HostProgress], None]


async def capture_cluster(addresses: list[AgentAddress], spec: CaptureSpec, output: pathlib.Path | None,
                          options: ConnectionOptions,
                          on_progress: ProgressCallback = lambda progress: None) -> ClusterCapture:
    """Start the same capture on every agent and follow it until each agent has summarised its files;
    with ``output``, also fetch each finished file into ``output/<host>/``."""
    start_ms = int(time.time() * 1000) + spec.start_delay_ms if spec.iterations is None else 0
    hosts = [HostProgress(str(a)) for a in addresses]
    await asyncio.gather(*(_capture_host(a, h, spec, start_ms, output, options, on_progress)
                           for a, h in zip(addresses, hosts, strict=True)))
    return ClusterCapture(start_ms, hosts)


async def _capture_host(address: AgentAddress, progress: HostProgress, spec: CaptureSpec, start_ms: int,
                        output: pathlib.Path | None, options: ConnectionOptions,
                        on_progress: ProgressCallback) -> None:
    give_up = time.monotonic() + spec.start_delay_ms / 1000 + spec.timeout_s
    try:
        async with options.open(address) as channel:
            stub = pb_grpc.AgentStub(channel)
            reply = await _start_when_registered(stub, spec, start_ms, progress, on_progress)
            progress.capture_id, progress.message, progress.phase = reply.capture_id, reply.message, "capturing"
            fetched: set[str] = set()
            seen: list[pb.TraceTarget] = []
            while True:
                if reply.targets != seen:  # most polls repeat the last reply: converted once, not every 0.1 s
                    progress.targets = [convert.from_proto(TraceTarget, t) for t in reply.targets]
                    seen = list(reply.targets)
                if output is not None:
                    for target in progress.targets:
                        if target.state == TraceTargetState.WRITTEN and target.file not in fetched:
                            fetched.add(target.file)
                            progress.files.append(await _fetch(stub, progress.host, target, output))
                on_progress(progress)
                if reply.done:
                    break
                if time.monotonic() > give_up:
                    progress.error = f"gave up after {spec.timeout_s:g} s waiting for trace files"
                    break
                files_in = bool(progress.targets) and progress.finished_targets == len(progress.targets)
                await asyncio.sleep(SUMMARY_PERIOD_SECONDS if files_in else STATUS_PERIOD_SECONDS)
                reply = await stub.GetCaptureStatus(pb.CaptureStatusRequest(capture_id=progress.capture_id),
                                                    timeout=RPC_TIMEOUT_SECONDS)
    except grpc.aio.AioRpcError as exc:
        progress.error = describe_rpc_error(exc, RPC_TIMEOUT_SECONDS)
    except OSError as exc:
        progress.error = f"cannot write fetched file: {exc}"
    progress.phase = "failed" if progress.error else "done"
    on_progress(progress)


async def _start_when_registered(stub: pb_grpc.AgentStub, spec: CaptureSpec, start_ms: int, progress: HostProgress,
                                 on_progress: ProgressCallback) -> pb.CaptureTraceReply:
    """Start the capture; while a Kineto capture matches no process (its reply has no targets), in phase
    ``waiting``, ask again until ``REGISTRATION_WAIT_SECONDS`` have passed. The last reply, whatever it says."""
    request = spec.request(start_ms)
    registered_by = time.monotonic() + REGISTRATION_WAIT_SECONDS
    reply: pb.CaptureTraceReply = await stub.CaptureTrace(request, timeout=RPC_TIMEOUT_SECONDS)
    while spec.kind == "kineto" and not reply.targets and time.monotonic() < registered_by:
        if progress.phase != "waiting":
            progress.phase = "waiting"
            on_progress(progress)
        await asyncio.sleep(STATUS_PERIOD_SECONDS)
        reply = await stub.CaptureTrace(request, timeout=RPC_TIMEOUT_SECONDS)
    return reply


async def _fetch(stub: pb_grpc.AgentStub, host: str, target: TraceTarget, output: pathlib.Path) -> FetchedFile:
    """Stream one file to ``output/<host>/<name>`` (``.part`` until complete)."""
    directory = output / _safe_name(host)
    directory.mkdir(parents=True, exist_ok=True)
    local = directory / pathlib.PurePosixPath(target.file).name
    partial = local.with_name(local.name + ".part")
    try:
        with open(partial, "wb") as out:
            async for chunk in stub.FetchFile(pb.FetchFileRequest(path=target.file), timeout=RPC_TIMEOUT_SECONDS * 6):
                out.write(chunk.data)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, local)
    return FetchedFile(host, target.pid, target.rank_number, target.file, local)


async def fetch_files(addresses: Iterable[AgentAddress], capture: ClusterCapture,
                      wanted: Callable[[HostProgress, TraceTarget], bool], output: pathlib.Path,
                      options: ConnectionOptions, concurrency: int = FETCH_CONCURRENCY) -> list[str]:
    """Fetch every written file ``wanted`` picks (and not fetched yet) into ``output/<host>/``, at most
    ``concurrency`` at a time; each lands in its host's ``files``. Returns one line per file that failed."""
    by_host = {str(address): address for address in addresses}
    gate = asyncio.Semaphore(concurrency)
    jobs = []
    for host in capture.hosts:
        have = {f.remote for f in host.files}
        picked = [t for t in host.targets if t.state == TraceTargetState.WRITTEN and t.file not in have and wanted(host, t)]
        if picked:
            jobs.append(_fetch_host(by_host[host.host], host, picked, output, options, gate))
    return [error for errors in await asyncio.gather(*jobs) for error in errors]


async def _fetch_host(address: AgentAddress, host: HostProgress, targets: list[TraceTarget], output: pathlib.Path,
                      options: ConnectionOptions, gate: asyncio.Semaphore) -> list[str]:
    errors: list[str] = []
    async with options.open(address) as channel:
        stub = pb_grpc.AgentStub(channel)

        async def one(target: TraceTarget) -> None:
            async with gate:
                try:
                    host.files.append(await _fetch(stub, host.host, target, output))
                except grpc.aio.AioRpcError as exc:
                    errors.append(f"{host.host}:{target.file}: {describe_rpc_error(exc, RPC_TIMEOUT_SECONDS * 6)}")
                except OSError as exc:
                    errors.append(f"{host.host}:{target.file}: cannot write the fetched file: {exc}")

        await asyncio.gather(*(one(target) for target in targets))
    return errors


def _safe_name(host: str) -> str:
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in host)
