"""CaptureTrace / GetCaptureStatus / FetchFile: the trace area's side of agentd's gRPC service.

A Kineto capture matches the processes polling the IPC endpoint (filters: pids,
job id, ranks), queues one config per process naming a file under the trace
dir, and reports each target's progress on every status call. A timeline
capture dumps the hook library's event ring of each rank (``agentd.traces.timeline``).
Files are offered by FetchFile only once finished.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from importlib import metadata
from typing import TYPE_CHECKING

import grpc

from agentd.auth import load_token
from agentd.errors import BindError
from agentd.kineto.collector import KinetoCollector
from agentd.kineto.endpoint import SOCKET_DIR_ENV
from agentd.kineto.registry import BusyError, PendingConfig, Registrant, Registry
from agentd.kineto.rpc import DynologRpc
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.runner import CollectorRunner
from agentd.kineto import config as kineto_config
from agentd.traces import timeline
from agentd.traces.capture import (
    BUSY, FAILED, FINAL_STATES, ITERATIONS_TIMEOUT_SECONDS, REFUSED, WAITING, WRITE_GRACE_SECONDS, Capture,
    Target,
)
from agentd.traces.paths import TracePathError, finished_file, inside
from agentd.traces.iterations import SLACK_SECONDS, StepRates, common_start_iteration
from agentd.procfs import process_facts

if TYPE_CHECKING:
    from agentd.agent import Agent
    from agentd.config import AgentConfig

log = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
KEEP_CAPTURES = 64
# Without a start time from the client: the slowest poll interval seen (libkineto's
# default is 5 s) plus the controller's pickup delay plus the warmup.
DEFAULT_POLL_SECONDS = 5.0
PICKUP_SECONDS = 2.0
MAX_DURATION_MS = 10 * 60 * 1000
MAX_ITERATIONS = 10_000


class CaptureRequestError(ValueError):
    """A CaptureTrace request that cannot be served as asked (INVALID_ARGUMENT)."""


def lead_seconds(registrants: list[Registrant]) -> float:
    """How far ahead a start time must be for every one of ``registrants`` to take it."""
    poll = max((r.poll_interval or DEFAULT_POLL_SECONDS for r in registrants), default=DEFAULT_POLL_SECONDS)
    return poll + PICKUP_SECONDS + kineto_config.WARMUP_SECONDS


class CaptureService:
    def __init__(self, trace_dir: pathlib.Path, hostname: str, registry: Registry) -> None:
        self.trace_dir = trace_dir
        self.hostname = hostname
        self.registry = registry
        self._ranks: dict[int, pb.RankStats] = {}
        self._step_rates = StepRates()
        self._captures: OrderedDict[str, Capture] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def attach(cls, config: "AgentConfig", agent: "Agent") -> "CaptureService":
        """The service for ``agent``: its IPC endpoint runs (and closes) with the agent's collectors."""
        registry = Registry()
        collector = KinetoCollector(config.interval_seconds, registry, os.environ.get(SOCKET_DIR_ENV))
        if config.dynolog_rpc_port is not None:
            collector.serve_rpc(_bind_rpc(config, registry))
        agent.runners.append(CollectorRunner(collector))
        service = cls(config.trace_dir, agent.hostname, registry)
        agent.post_processors.append(service.observe)
        return service

    def observe(self, snapshot: pb.HostSnapshot) -> None:
        """Keep the ranks collector's view (pid → rank, job) for matching and reporting."""
        self._ranks = {r.pid: r for r in snapshot.ranks}
        self._step_rates.observe(snapshot.ranks, time.monotonic())

    # ---------------------------------------------------------------- gRPC

    async def capture_trace(self, request: pb.CaptureTraceRequest,
                            context: grpc.aio.ServicerContext) -> pb.CaptureTraceReply:
        try:
            capture = self.start(request)
        except (CaptureRequestError, TracePathError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except OSError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"cannot prepare the capture under the trace dir {self.trace_dir}: {exc}")
        return capture.to_proto(self.hostname)

    async def get_capture_status(self, request: pb.CaptureStatusRequest,
                                 context: grpc.aio.ServicerContext) -> pb.CaptureTraceReply:
        capture = self._captures.get(request.capture_id)
        if capture is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"no capture {request.capture_id!r} on this agent (it keeps the last "
                                f"{KEEP_CAPTURES}; the agent may have restarted)")
        capture.refresh(self.registry)
        return capture.to_proto(self.hostname)

    async def fetch_file(self, request: pb.FetchFileRequest,
                         context: grpc.aio.ServicerContext) -> AsyncIterator[pb.FileChunk]:
        try:
            path = finished_file(self.trace_dir, request.path)
        except TracePathError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except FileNotFoundError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        with open(path, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            if request.offset > total:
                await context.abort(grpc.StatusCode.OUT_OF_RANGE,
                                    f"offset {request.offset} is past the end of {request.path} ({total} bytes)")
            offset = request.offset
            f.seek(offset)
            while offset < total:
                data = await asyncio.to_thread(f.read, min(CHUNK_BYTES, total - offset))
                if not data:
                    break
                yield pb.FileChunk(data=data, offset=offset, total_size=total)
                offset += len(data)

    # ---------------------------------------------------------------- captures

    def start(self, request: pb.CaptureTraceRequest) -> Capture:
        """Validate ``request``, match processes and start the capture (raises CaptureRequestError)."""
        span = request.WhichOneof("span")
        _check_span(request, span)
        capture_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        directory = inside(self.trace_dir, request.output_subdir, "output_subdir") / capture_id
        relative = directory.relative_to(self.trace_dir.resolve())
        if request.kind == pb.CaptureTraceRequest.TIMELINE:
            capture = timeline.start(request, span, capture_id, self.trace_dir.resolve(), relative, self.hostname)
            if capture.targets:
                task = asyncio.get_running_loop().create_task(timeline.run(capture))
                self._tasks.add(task)
                task.add_done_callback(lambda done: self._timeline_done(capture, done))
        else:
            capture = self._start_kineto(request, span, capture_id, relative)
        self._remember(capture)
        log.info("capture started", extra={
            "capture_id": capture_id, "kind": pb.CaptureTraceRequest.Kind.Name(request.kind),
            "targets": len(capture.targets), "note": capture.message})
        return capture

    def _timeline_done(self, capture: Capture, task: asyncio.Task[None]) -> None:
        """Forget the task; if it broke, its unfinished targets fail with the reason instead of waiting forever."""
        self._tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("timeline capture failed", extra={"capture_id": capture.capture_id, "error": repr(error)})
            for target in capture.targets:
                if target.state not in FINAL_STATES:
                    target.fail(FAILED, f"the timeline dump failed: {error!r}")

    def _start_kineto(self, request: pb.CaptureTraceRequest, span: str, capture_id: str,
                      relative: pathlib.Path) -> Capture:
        matched = self._match(request)
        trace_dir = self.trace_dir.resolve()
        now = time.time()
        if span == "duration_ms":
            start_ms = request.start_time_unix_ms or int((now + lead_seconds(matched)) * 1000)
            start_unix: float | None = start_ms / 1000
            deadline = start_ms / 1000 + request.duration_ms / 1000 + WRITE_GRACE_SECONDS
        else:
            start_ms, start_unix = 0, None
            deadline = now + ITERATIONS_TIMEOUT_SECONDS
        capture = Capture(capture_id, trace_dir, [], start_unix, deadline)
        if not matched:
            capture.message = f"no processes matched: {self._describe_filters(request)}"
            return capture
        _prepare_capture_dir(trace_dir / relative, {r.uid for r in matched})
        start_iteration = 0
        if span == "iterations":
            at = time.monotonic() + lead_seconds(matched) + SLACK_SECONDS
            start_iteration, why = common_start_iteration([self._step_rates.projected_step(r.host_pid, at)
                                                           for r in matched])
            capture.message = (f"every process starts at iteration {start_iteration}" if start_iteration else
                               f"each process starts at its own next step ({why})")
        for registrant in matched:
            capture.targets.append(self._offer(request, span, start_ms, start_iteration, registrant, trace_dir,
                                               relative))
        return capture

    def _offer(self, request: pb.CaptureTraceRequest, span: str, start_ms: int, start_iteration: int,
               registrant: Registrant, trace_dir: pathlib.Path, relative: pathlib.Path) -> Target:
        facts = process_facts(registrant.host_pid)
        rank = self._rank_of(registrant.host_pid, facts.rank)
        stem = f"rank{rank}-pid{registrant.host_pid}" if rank is not None else f"pid{registrant.host_pid}"
        log_file = str(trace_dir / relative / f"{stem}.pt.trace.json")
        written = kineto_config.kineto_file_name(log_file, registrant.reported_pid)
        target = Target(registrant.host_pid, rank, str(pathlib.Path(written).relative_to(trace_dir)), WAITING,
                        registrant=registrant)
        agent_uid = os.geteuid()
        if agent_uid != 0 and registrant.uid != agent_uid:
            target.fail(REFUSED, f"the process belongs to uid {registrant.uid}; this agent runs as uid "
                                 f"{agent_uid} and hands trace configs only to its own user's processes "
                                 "(run agentd as root or as that user)")
            return target
        options = request.options
        spec = kineto_config.TraceSpec(
            log_file=log_file, start_time_unix_ms=start_ms,
            duration_ms=request.duration_ms if span == "duration_ms" else None,
            iterations=request.iterations if span == "iterations" else None, start_iteration=start_iteration,
            record_shapes=options.record_shapes, profile_memory=options.profile_memory,
            with_stack=options.with_stack, with_flops=options.with_flops, with_modules=options.with_modules,
        )
        pending = PendingConfig(kineto_config.config_text(spec, facts.cuda, f"{self.hostname}:{stem}"))
        try:
            self.registry.offer(registrant, pending)
        except BusyError as exc:
            target.fail(BUSY, str(exc))
            return target
        target.pending = pending
        if span == "duration_ms":
            if start_ms / 1000 - time.time() < lead_seconds([registrant]):
                target.reason = (f"start time may be too soon: this process polls every "
                                 f"{registrant.poll_interval or DEFAULT_POLL_SECONDS:.1f} s and needs "
                                 f"{kineto_config.WARMUP_SECONDS} s of warmup")
        return target

    def _match(self, request: pb.CaptureTraceRequest) -> list[Registrant]:
        """The polling processes the request names, less the launchers of ranks.

        A launcher (torchrun's agent, a wrapper script) imports torch, so it polls
        too; but it has no rank, no steps and no GPU work: an iterations capture
        would wait on it in vain, and its empty trace would only clutter the merge.
        """
        matched = self.registry.match(request.job_id, set(request.pids))
        ranks = {r.host_pid: self._rank_of(r.host_pid, process_facts(r.host_pid).rank) for r in matched}
        if request.ranks:
            wanted = set(request.ranks)
            matched = [r for r in matched if ranks[r.host_pid] in wanted]
        launchers = {pid for r in matched if ranks[r.host_pid] is not None for pid in r.pids[1:]}
        return [r for r in matched if ranks[r.host_pid] is not None or r.reported_pid not in launchers]

    def _rank_of(self, pid: int, environ_rank: int | None) -> int | None:
        stats = self._ranks.get(pid)
        if stats is not None and stats.HasField("rank"):
            return stats.rank
        return environ_rank

    def _describe_filters(self, request: pb.CaptureTraceRequest) -> str:
        registered = self.registry.entries()
        parts = []
        if request.pids:
            parts.append(f"pids {', '.join(map(str, request.pids))}")
        if request.job_id:
            parts.append(f"job {request.job_id}")
        if request.ranks:
            parts.append(f"ranks {', '.join(map(str, request.ranks))}")
        wanted = " and ".join(parts) or "any process"
        if not registered:
            return (f"{wanted} — no process is polling this agent; start training with KINETO_USE_DAEMON=1 "
                    "(or under `tuiprof run`), and give it a few seconds to register")
        known = ", ".join(f"{r.host_pid} (job {r.job_id})" for r in registered[:20])
        return f"{wanted} — processes polling this agent: {known}"

    def _remember(self, capture: Capture) -> None:
        self._captures[capture.capture_id] = capture
        while len(self._captures) > KEEP_CAPTURES:
            self._captures.popitem(last=False)


def _bind_rpc(config: "AgentConfig", registry: Registry) -> DynologRpc:
    try:
        version = f"tuiprof-agentd {metadata.version('tuiprof')}"
    except metadata.PackageNotFoundError:
        version = "tuiprof-agentd"
    port = config.dynolog_rpc_port
    assert port is not None
    try:
        return DynologRpc.bind(config.host, port, registry, config.trace_dir, load_token(config.token_file), version)
    except OSError as exc:
        raise BindError.for_port("dynolog RPC", config.host, port, exc, "--dynolog-rpc-port") from None


def _prepare_capture_dir(directory: pathlib.Path, uids: set[int]) -> None:
    """The capture's directory, writable by the processes that will write into it.

    An agent running as root serves other users' processes: the directory
    goes to that user (or is shared, sticky, when several users are traced).
    """
    directory.mkdir(parents=True, exist_ok=True)
    others = uids - {0, -1, os.geteuid()}
    if os.geteuid() == 0 and len(others) == 1:
        os.chown(directory, others.pop(), -1)
    elif os.geteuid() == 0 and others:
        directory.chmod(0o1777)


def _check_span(request: pb.CaptureTraceRequest, span: str | None) -> None:
    if span is None:
        raise CaptureRequestError("say how long to trace: set duration_ms or iterations")
    if span == "duration_ms" and not 0 < request.duration_ms <= MAX_DURATION_MS:
        raise CaptureRequestError(f"duration_ms must be 1-{MAX_DURATION_MS}, got {request.duration_ms}")
    if span == "iterations" and not 0 < request.iterations <= MAX_ITERATIONS:
        raise CaptureRequestError(f"iterations must be 1-{MAX_ITERATIONS}, got {request.iterations}")
    is_timeline = request.kind == pb.CaptureTraceRequest.TIMELINE
    if span == "last_events" and not is_timeline:
        raise CaptureRequestError(
            "last_events is for timeline captures only; Kineto traces take duration_ms or iterations")
    if span == "iterations" and is_timeline:
        raise CaptureRequestError("timeline captures take duration_ms or last_events, not iterations")
    if span == "last_events" and request.last_events == 0:
        raise CaptureRequestError("last_events must be 1 or more")
