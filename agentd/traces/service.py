"""CaptureTrace / GetCaptureStatus / FetchFile: the trace area's side of agentd's gRPC service.

A Kineto capture matches the processes polling the IPC endpoint (filters: pids,
job id, ranks), queues one config per process naming a file in that process
user's folder of the trace dir (``agentd.traces.paths``), and reports each
target's progress on every status call. A timeline capture dumps the hook
library's event ring of each rank (``agentd.traces.timeline``) into the agent's
own folders. Files are offered by FetchFile only once finished.

Each call is made for a caller (``agentd.auth.current_caller()``, set by the
servicer): root and the token holder see everything; a local user may trace,
follow and fetch only what belongs to their own processes; an unidentified
caller nothing private.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import pathlib
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, NoReturn

import grpc

from agentd.auth import Caller, current_caller
from agentd.collectors.gpu import GpuCollector
from agentd.errors import BindError
from agentd.kineto.collector import KinetoCollector
from agentd.kineto.endpoint import SOCKET_DIR_ENV, USER_FOLDERS, UserFolderError
from agentd.kineto.namespaces import CONTAINER_TRACE_FOLDER, ContainerTraceError, sees_folder
from agentd.kineto.registry import BusyError, PendingConfig, Registrant, Registry
from agentd.kineto.rpc import DynologRpc, GpmPause
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.runner import CollectorRunner
from agentd.kineto import config as kineto_config
from agentd.traces import timeline
from agentd.traces.analysis.summarise import Summariser
from agentd.traces.container_traces import ContainerTraces
from agentd.traces.capture import (
    BUSY, FAILED, FINAL_STATES, ITERATIONS_TIMEOUT_SECONDS, REFUSED, WAITING, WRITE_GRACE_SECONDS, Capture,
    Target,
)
from agentd.traces.paths import (
    TIMELINE_FOLDER, TraceAccessError, TraceDir, TraceDirError, TracePathError, owner_uid, reason, relative_parts, shown,
)
from agentd.traces.requests import CaptureRequestError, check_capture
from agentd.traces.iterations import SLACK_SECONDS, StepRates, common_start_iteration
from agentd.procfs import process_facts, read_stat, real_uid

if TYPE_CHECKING:
    from agentd.agent import Agent
    from agentd.config import AgentConfig

log = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
KEEP_CAPTURES = 64
# Without a start time from the client: the slowest poll interval seen (libkineto's
# default, kineto_config.DEFAULT_POLL_SECONDS) plus the controller's pickup delay plus the warmup.
PICKUP_SECONDS = 2.0
SHOWN_IN_MESSAGES = 20


def lead_seconds(registrants: list[Registrant]) -> float:
    """How far ahead a start time must be for every one of ``registrants`` to take it."""
    poll = max((r.poll_interval or kineto_config.DEFAULT_POLL_SECONDS for r in registrants),
               default=kineto_config.DEFAULT_POLL_SECONDS)
    return poll + PICKUP_SECONDS + kineto_config.WARMUP_SECONDS


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("grpc's abort always raises")


class CaptureService:
    def __init__(self, trace_dir: pathlib.Path, hostname: str, registry: Registry) -> None:
        self.trace_dir = TraceDir(trace_dir)
        self.hostname = hostname
        self.registry = registry
        self._ranks: dict[int, pb.RankStats] = {}
        self._step_rates = StepRates()
        self._captures: OrderedDict[str, Capture] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.summariser = Summariser(self.trace_dir, hostname)
        self.container_traces = ContainerTraces(self.trace_dir)
        self.kineto: KinetoCollector | None = None  # set by attach()

    @classmethod
    def attach(cls, config: AgentConfig, agent: Agent) -> CaptureService:
        """The service for ``agent``: its IPC endpoint runs (and closes) with the agent's collectors."""
        registry = Registry()
        service = cls(config.trace_dir, agent.hostname, registry)
        socket_dir = config.kineto_socket_dir or os.environ.get(SOCKET_DIR_ENV)
        # Per-user folders and containers' network namespaces: a root agent's, on the abstract name
        # (agentd.kineto.endpoint, agentd.kineto.namespaces).
        root_on_abstract_name = os.geteuid() == 0 and not socket_dir
        user_folders = USER_FOLDERS if root_on_abstract_name else None
        collector = KinetoCollector(config.interval_seconds, registry, socket_dir, user_folders,
                                    containers=root_on_abstract_name)
        service.kineto = collector
        if config.dynolog_rpc_port is not None:
            gpu = next((r.collector for r in agent.runners if isinstance(r.collector, GpuCollector)), None)
            collector.serve_rpc(_bind_rpc(config, registry, service.trace_dir, gpu, service.container_traces))
        agent.runners.append(CollectorRunner(collector))
        agent.post_processors.append(service.observe)
        return service

    def observe(self, snapshot: pb.HostSnapshot) -> None:
        """Keep the ranks collector's view (pid → rank, job) for matching and reporting."""
        self._ranks = {r.pid: r for r in snapshot.ranks}
        self._step_rates.observe(snapshot.ranks, time.monotonic())

    def kineto_user_folder(self, caller: Caller) -> tuple[str, str]:
        """(the caller's own Kineto IPC folder, "") or ("", why there is none)."""
        if self.kineto is None:
            return "", "this agent serves no Kineto IPC endpoint"
        if caller.uid is None:
            return "", f"the agent cannot tell which local user you are ({caller.reason or 'not local'})"
        try:
            return self.kineto.user_folder(caller.uid), ""
        except UserFolderError as exc:
            return "", str(exc)

    # ---------------------------------------------------------------- gRPC

    async def capture_trace(self, request: pb.CaptureTraceRequest,
                            context: grpc.aio.ServicerContext) -> pb.CaptureTraceReply:
        try:
            capture = self.start(request, current_caller())
        except CaptureRequestError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except TraceDirError as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except OSError as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"cannot prepare the capture: {reason(exc)}")
        return self._reply(capture, current_caller())

    async def get_capture_status(self, request: pb.CaptureStatusRequest,
                                 context: grpc.aio.ServicerContext) -> pb.CaptureTraceReply:
        capture = self._captures.get(request.capture_id)
        if capture is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND,
                         f"no capture {shown(request.capture_id)} on this agent (it keeps the last "
                         f"{KEEP_CAPTURES}; the agent may have restarted)")
        if not current_caller().owns(capture.requested_by):
            await _abort(context, grpc.StatusCode.PERMISSION_DENIED,
                         f"capture {shown(request.capture_id)} was started by another user")
        capture.refresh(self.registry)
        return self._reply(capture, current_caller())

    def _reply(self, capture: Capture, caller: Caller) -> pb.CaptureTraceReply:
        """The capture as it is now, its written files queued for their summaries; a summary only of a
        file ``caller`` may fetch."""
        may_read = functools.partial(_may_fetch, caller)
        self.summariser.schedule(capture, may_read)
        return capture.to_proto(self.hostname, may_read)

    async def fetch_file(self, request: pb.FetchFileRequest,
                         context: grpc.aio.ServicerContext) -> AsyncIterator[pb.FileChunk]:
        try:
            parts = relative_parts(request.path, "file")
            check_may_fetch(current_caller(), parts)
            fd, total = await asyncio.to_thread(self.trace_dir.open_file, parts)
        except TracePathError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except TraceAccessError as exc:
            await _abort(context, grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except FileNotFoundError as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, reason(exc))
        except OSError as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                         f"cannot read {shown(request.path)} under the trace dir: {reason(exc)}")
        try:
            if request.offset > total:
                await _abort(context, grpc.StatusCode.OUT_OF_RANGE,
                             f"offset {request.offset} is past the end of {shown(request.path)} ({total} bytes)")
            offset = request.offset
            while offset < total:
                data = await asyncio.to_thread(os.pread, fd, min(CHUNK_BYTES, total - offset), offset)
                if not data:
                    break
                yield pb.FileChunk(data=data, offset=offset, total_size=total)
                offset += len(data)
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- captures

    def start(self, request: pb.CaptureTraceRequest, caller: Caller) -> Capture:
        """Check ``request`` whole (CaptureRequestError), then match processes and start the capture."""
        span = check_capture(request)
        self.trace_dir.prepare()
        capture_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        label = f"{request.output_subdir}-{capture_id}" if request.output_subdir else capture_id
        capture: Capture
        if request.kind == pb.CaptureTraceRequest.TIMELINE:
            timeline_capture = timeline.start(request, span, capture_id, label, self.trace_dir, self.hostname,
                                              caller)
            if any(t.state not in FINAL_STATES for t in timeline_capture.targets):
                task = asyncio.get_running_loop().create_task(timeline.run(timeline_capture))
                self._tasks.add(task)
                task.add_done_callback(lambda done: self._timeline_done(timeline_capture, done))
            capture = timeline_capture
        else:
            capture = self._start_kineto(request, span, capture_id, label, caller)
        capture.requested_by = caller.uid
        if request.summary_steps == pb.CaptureTraceRequest.COMPLETE_STEPS:
            capture.summary_steps = "complete"
        capture.summary_like_hta = request.summary_like_hta
        self._remember(capture)
        log.info("capture started", extra={
            "capture_id": capture_id, "kind": pb.CaptureTraceRequest.Kind.Name(request.kind),
            "caller": str(caller),
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
                    target.fail(FAILED, f"the timeline dump failed: {type(error).__name__}")

    def _start_kineto(self, request: pb.CaptureTraceRequest, span: str, capture_id: str, label: str,
                      caller: Caller) -> Capture:
        matched = self._match(request)
        now = time.time()
        if span == "duration_ms":
            start_ms = request.start_time_unix_ms or int((now + lead_seconds(matched)) * 1000)
            start_unix: float | None = start_ms / 1000
            deadline = start_ms / 1000 + request.duration_ms / 1000 + WRITE_GRACE_SECONDS
        else:
            start_ms, start_unix = 0, None
            deadline = now + ITERATIONS_TIMEOUT_SECONDS
        capture = Capture(capture_id, self.trace_dir, [], start_unix, deadline)
        if not matched:
            capture.message = f"no processes matched: {self._describe_filters(request)}"
            return capture
        start_iteration = 0
        if span == "iterations":
            at = time.monotonic() + lead_seconds(matched) + SLACK_SECONDS
            start_iteration, why = common_start_iteration([self._step_rates.projected_step(r.host_pid, at)
                                                           for r in matched])
            capture.message = (f"every process starts at iteration {start_iteration}" if start_iteration else
                               f"each process starts at its own next step ({why})")
        spec = kineto_config.TraceSpec(
            log_file="", start_time_unix_ms=start_ms,
            duration_ms=request.duration_ms if span == "duration_ms" else None,
            iterations=request.iterations if span == "iterations" else None, start_iteration=start_iteration,
            record_shapes=request.options.record_shapes, profile_memory=request.options.profile_memory,
            with_stack=request.options.with_stack, with_flops=request.options.with_flops,
            with_modules=request.options.with_modules,
        )
        for registrant in matched:
            capture.targets.append(self._offer(spec, label, registrant, caller, deadline))
        return capture

    def _offer(self, spec: kineto_config.TraceSpec, label: str, registrant: Registrant, caller: Caller,
               deadline: float) -> Target:
        """Queue the config for one process, into its user's folder (a trainer in a container: into its own
        /tmp, copied out to that folder once written, agentd.traces.container_traces); or the target says
        why not."""
        facts = process_facts(registrant.host_pid)
        rank = self._rank_of(registrant.host_pid, facts.rank)
        stem = f"{label}-rank{rank}-pid{registrant.host_pid}" if rank is not None else \
            f"{label}-pid{registrant.host_pid}"
        uid = real_uid(registrant.host_pid)
        name = f"{stem}.pt.trace.json"
        written = kineto_config.kineto_file_name(name, registrant.pid_in_namespace)
        target = Target(registrant.host_pid, rank, f"{registrant.uid if uid is None else uid}/{written}", WAITING,
                        registrant=registrant)
        refusal = _refusal(registrant, uid, caller)
        if refusal is not None:
            target.fail(*refusal)
            return target
        assert uid is not None
        try:
            folder = self.trace_dir.user_folder(uid)
            in_container = not sees_folder(registrant.host_pid, str(self.trace_dir.path / folder))
            log_file = f"{CONTAINER_TRACE_FOLDER}/{name}" if in_container else str(self.trace_dir.path / folder / name)
            text = kineto_config.config_text(dataclasses.replace(spec, log_file=log_file), facts.cuda,
                                             f"{self.hostname}:{stem}")
        except OSError as exc:
            target.fail(FAILED, f"cannot create the folder {uid}/ for its traces under the trace dir: {reason(exc)}")
            return target
        except kineto_config.ConfigValueError as exc:
            target.fail(FAILED, str(exc))
            return target
        pending = PendingConfig(text)
        try:
            self.registry.offer(registrant, pending)
        except BusyError as exc:
            target.fail(BUSY, str(exc))
            return target
        target.pending = pending
        if in_container:
            try:
                target.copy = self.container_traces.expect(
                    registrant, kineto_config.kineto_file_name(log_file, registrant.pid_in_namespace),
                    str(self.trace_dir.path / folder / written), deadline)
            except ContainerTraceError as exc:
                self.registry.withdraw(registrant, pending)
                target.fail(FAILED, str(exc))
                return target
        if spec.duration_ms is not None and spec.start_time_unix_ms / 1000 - time.time() < lead_seconds([registrant]):
            target.reason = (f"start time may be too soon: this process polls every "
                             f"{registrant.poll_interval or kineto_config.DEFAULT_POLL_SECONDS:.1f} s and needs "
                             f"{kineto_config.WARMUP_SECONDS} s of warmup")
        return target

    def _match(self, request: pb.CaptureTraceRequest) -> list[Registrant]:
        """The polling processes the request names, less the launchers of ranks.

        A launcher (torchrun's agent, a wrapper script) imports torch, so it polls
        too; but it has no rank, no steps and no GPU work: an iterations capture
        would wait on it in vain, and its empty trace would only clutter the merge.
        Processes that have exited are no targets either (see ``_running``).
        """
        matched = [r for r in self.registry.match(request.job_id, set(request.pids)) if self._running(r)]
        ranks = {r.host_pid: self._rank_of(r.host_pid, process_facts(r.host_pid).rank) for r in matched}
        if request.ranks:
            wanted = set(request.ranks)
            matched = [r for r in matched if ranks[r.host_pid] in wanted]
        launchers = {pid for r in matched if ranks[r.host_pid] is not None for pid in r.pids[1:]}
        return [r for r in matched if ranks[r.host_pid] is not None or r.host_pid not in launchers]

    def _running(self, registrant: Registrant) -> bool:
        """Whether the registrant's process still runs.

        A registration outlives its process by up to a minute (until it misses
        its polls); a rank the ranks collector reports exited, a process that is
        gone or a zombie, or a pid reused since the last poll is not a target:
        waiting on it only ends in a failure that blames the wrong thing.
        """
        stats = self._ranks.get(registrant.host_pid)
        if stats is not None and stats.state == pb.RANK_STATE_EXITED:
            return False
        stat = read_stat(registrant.host_pid)
        if stat is None or not stat.alive:
            return False
        last_poll_ns = time.time_ns() - int((time.monotonic() - registrant.last_seen) * 1e9)
        return stat.started_by(last_poll_ns)

    def _rank_of(self, pid: int, environ_rank: int | None) -> int | None:
        stats = self._ranks.get(pid)
        if stats is not None and stats.HasField("rank"):
            return stats.rank
        return environ_rank

    def _describe_filters(self, request: pb.CaptureTraceRequest) -> str:
        registered = self.registry.entries()
        parts = []
        if request.pids:
            parts.append(f"pids {_some(request.pids)}")
        if request.job_id:
            parts.append(f"job {request.job_id}")
        if request.ranks:
            parts.append(f"ranks {_some(request.ranks)}")
        wanted = " and ".join(parts) or "any process"
        if not registered:
            return (f"{wanted} — no process is polling this agent; start training with KINETO_USE_DAEMON=1 "
                    "(or under `tuiprof run`), and give it a few seconds to register")
        known = ", ".join(f"{r.host_pid} (job {r.job_id})" for r in registered[:SHOWN_IN_MESSAGES])
        return f"{wanted} — processes polling this agent: {known}"

    def _remember(self, capture: Capture) -> None:
        self._captures[capture.capture_id] = capture
        while len(self._captures) > KEEP_CAPTURES:
            self._captures.popitem(last=False)


def _some(values: Sequence[int]) -> str:
    """The first few of ``values``, comma-separated, saying how many more there are."""
    items = list(values)
    text = ", ".join(map(str, items[:SHOWN_IN_MESSAGES]))
    return text + (f" (and {len(items) - SHOWN_IN_MESSAGES} more)" if len(items) > SHOWN_IN_MESSAGES else "")


def _refusal(registrant: Registrant, uid: int | None, caller: Caller) -> tuple[pb.TraceTargetState, str] | None:
    """Why ``registrant`` (running as ``uid`` now, per /proc) gets no config from this caller; None: it may."""
    if uid is None:
        return FAILED, "the process exited before its config was queued"
    if uid != registrant.uid:
        return REFUSED, (f"the process polled as uid {registrant.uid} but runs as uid {uid} now; "
                         "it gets no config until it polls again")
    agent_uid = os.geteuid()
    if agent_uid != 0 and uid != agent_uid:
        return REFUSED, (f"the process belongs to uid {uid}; this agent runs as uid {agent_uid} and hands trace "
                         "configs only to its own user's processes (run agentd as root or as that user)")
    if not caller.owns(uid):
        return REFUSED, f"the process belongs to uid {uid}; you ({caller}) may trace only your own processes"
    return None


def check_may_fetch(caller: Caller, parts: tuple[str, ...]) -> None:
    """TraceAccessError unless ``caller`` may fetch ``parts``: a local user only from ``<uid>/`` and
    ``timeline/<uid>/`` of their own uid; root and the token holder anything."""
    owner = owner_uid(parts)
    if caller.owns(owner):
        return
    where = "another user's" if owner is not None else "the agent's own"
    mine = (f"; you ({caller}) may fetch only files under {caller.uid}/ and {TIMELINE_FOLDER}/{caller.uid}/"
            if caller.uid is not None else f"; you are {caller} ({caller.reason}) and may fetch none")
    raise TraceAccessError(f"{shown('/'.join(parts))} is in {where} folder{mine}")


def _may_fetch(caller: Caller, file: str) -> bool:
    try:
        check_may_fetch(caller, relative_parts(file, "file"))
    except (TraceAccessError, TracePathError):
        return False
    return True


def _bind_rpc(config: AgentConfig, registry: Registry, trace_dir: TraceDir, gpm: GpmPause | None,
              container_traces: ContainerTraces) -> DynologRpc:
    try:
        version = f"tuiprof-agentd {metadata.version('tuiprof')}"
    except metadata.PackageNotFoundError:
        version = "tuiprof-agentd"
    port = config.dynolog_rpc_port
    assert port is not None
    try:
        return DynologRpc.bind(port, registry, trace_dir.user_folder_path, version, gpm, container_traces)
    except OSError as exc:
        raise BindError.for_port("dynolog RPC", "127.0.0.1 and ::1", port, exc, "--dynolog-rpc-port") from None

