"""One capture on one host: its targets and how each one's state moves on.

States (``TraceTarget.state``): ``waiting`` (config queued, the process has not
polled for it yet), ``sent`` (handed out, the trace is being recorded),
``written`` (the finished file exists), and the final failures ``busy``
(the process was already tracing or had a config waiting), ``refused`` (it
belongs to another user) and ``failed`` (with the reason).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.proto.words import FINAL_TRACE_TARGET_STATES
from agentd.procfs import process_facts

if TYPE_CHECKING:  # types only: loading them starts nothing, but imports the Kineto endpoint
    from agentd.kineto.registry import PendingConfig, Registrant, Registry
    from agentd.traces.container_traces import ContainerTrace
    from agentd.traces.paths import TraceDir

WAITING, SENT, WRITTEN = pb.TRACE_TARGET_STATE_WAITING, pb.TRACE_TARGET_STATE_SENT, pb.TRACE_TARGET_STATE_WRITTEN
BUSY, REFUSED, FAILED = pb.TRACE_TARGET_STATE_BUSY, pb.TRACE_TARGET_STATE_REFUSED, pb.TRACE_TARGET_STATE_FAILED
FINAL_STATES = FINAL_TRACE_TARGET_STATES
# After the traced span ends Kineto still has to process and write the trace.
WRITE_GRACE_SECONDS = 60.0
# Iteration-based traces end when the loop has stepped; give slow loops this long.
ITERATIONS_TIMEOUT_SECONDS = 600.0


@dataclass
class Target:
    pid: int  # in the agent's pid namespace
    rank: int | None
    file: str  # relative to the trace dir
    state: pb.TraceTargetState
    reason: str = ""
    registrant: Registrant | None = None
    pending: PendingConfig | None = None
    copy: ContainerTrace | None = None  # a trainer in a container: its trace, copied out to ``file``

    def fail(self, state: pb.TraceTargetState, reason: str) -> None:
        self.state, self.reason = state, reason

    def to_proto(self, host: str) -> pb.TraceTarget:
        target = pb.TraceTarget(host=host, pid=self.pid, state=self.state, file=self.file, reason=self.reason)
        if self.rank is not None:
            target.rank = self.rank
        return target


@dataclass
class Capture:
    capture_id: str
    trace_dir: TraceDir
    targets: list[Target]
    # Duration traces: the wall-clock start; a config not picked up by then is useless.
    start_unix: float | None
    # Wall-clock time after which a target without a file has failed.
    deadline_unix: float
    message: str = ""
    created: float = field(default_factory=time.time)
    # The uid that asked (None: the token holder); only that user, root and the token holder follow it.
    requested_by: int | None = None
    # What the summaries count: "all" or "complete" (``agentd.traces.analysis.summary.step_window``).
    summary_steps: str = "all"
    summary_like_hta: bool = False  # and whether as HTA does (``agentd.traces.analysis.extract``)
    # Written file → the agent's summary of it (``agentd.traces.analysis.summarise``), filled off the event loop.
    summaries: dict[str, pb.RankTraceSummary] = field(default_factory=dict)

    def done(self, may_read: Callable[[str], bool]) -> bool:
        """Every target is final and every written file the caller ``may_read`` summarised."""
        return all(t.state in FINAL_STATES and (t.state != WRITTEN or t.file in self.summaries or not may_read(t.file))
                   for t in self.targets)

    def refresh(self, registry: Registry) -> None:
        """Move every unfinished target on from what the registry and the trace dir show now."""
        now = time.time()
        for target in self.targets:
            if target.state == WAITING:
                self._refresh_waiting(target, registry, now)
            if target.state == SENT:
                self._refresh_sent(target, now)

    def _refresh_waiting(self, target: Target, registry: Registry, now: float) -> None:
        assert target.pending is not None and target.registrant is not None
        if target.pending.delivered_at is not None:
            target.state = SENT
            return
        too_late = self.start_unix is not None and now >= self.start_unix
        if too_late or now >= self.deadline_unix:
            if registry.withdraw(target.registrant, target.pending):
                interval = target.registrant.poll_interval
                why = f"; it polls every {interval:.1f} s" if interval else ""
                if target.registrant.profiler_busy:
                    why = "; its profiler is busy with another trace"
                target.fail(FAILED, f"the process did not take the config before the start time{why}: "
                                    "choose a later start time")
            elif target.pending.delivered_at is not None:
                target.state = SENT
            return
        if not registry.is_registered(target.registrant):
            target.fail(FAILED, "the process stopped polling before it took the config")

    def _refresh_sent(self, target: Target, now: float) -> None:
        if self.trace_dir.is_finished(target.file):
            target.state = WRITTEN
            target.reason = ""
        elif target.copy is not None and target.copy.failure:
            target.fail(FAILED, target.copy.failure)
        elif not process_facts(target.pid).alive:
            target.fail(FAILED, "the process exited before writing its trace")
        elif now >= self.deadline_unix:
            target.fail(FAILED, "no trace written in time: the process may have refused the config (start "
                                "time too close for its warmup), or could not write into the trace dir (newer "
                                "Kineto writes on-demand traces only under /tmp or $KINETO_ONDEMAND_TRACE_DIR, "
                                "which `tuiprof run` sets to the trace dir of the agent on the host it runs on) — "
                                "see its stderr for a Kineto warning")

    def to_proto(self, host: str, may_read: Callable[[str], bool]) -> pb.CaptureTraceReply:
        """The reply; once done, each written file's summary where ``may_read(file)`` (the caller may fetch it)."""
        done = self.done(may_read)
        reply = pb.CaptureTraceReply(
            capture_id=self.capture_id, targets=[t.to_proto(host) for t in self.targets],
            done=done, message=self.message,
        )
        if done:
            for target in reply.targets:
                if target.file in self.summaries and may_read(target.file):
                    target.summary.CopyFrom(self.summaries[target.file])
        return reply
