"""The hang area inside agentd: a verdict in every snapshot, stacks on a hang and on request.

``HangService.process`` runs on every assembled snapshot (an agent post-processor):
it judges the ranks the ranks collector reported and fills ``snapshot.hang``.
When ranks turn hung it takes the stacks of the ranks involved (the hung ranks
and the other ranks of their job and owner) once, in a background thread, keeps
them as the incident (and writes them, mode 0600, under the trace directory),
and ``GetStacks`` serves them — or fresh ones on request.

Everything here is open to local users who may be hostile: a rank's stacks go
only to its owner, root or the token holder; incidents are capped per owner
and time window, so a rank that fakes hangs over and over cannot make the agent
dump every rank on the host or fill the disk; py-spy targets only processes the
ranks collector reported (see ``agentd.hang.stacks``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import pathlib
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NoReturn

import grpc
from google.protobuf import json_format

from agentd.auth import Caller
from agentd.hang import nccl_ras, pyspy, ras_reader
from agentd.hang.detector import HUNG, OK, HangDetector, Thresholds, hide_exception_text
from agentd.hang.detector import SUSPECT
from agentd.hang.stacks import DumpTarget, StackTaker, merged_reply
from agentd.proto import tuiprof_agent_pb2 as pb

if TYPE_CHECKING:
    from agentd.agent import Agent
    from agentd.config import AgentConfig

log = logging.getLogger(__name__)

MAX_REQUEST_PIDS = 4096
# Incidents (a dump of the ranks involved plus a file) per owner of the hung ranks and window.
MAX_INCIDENTS_PER_OWNER = 3
INCIDENT_WINDOW_SECONDS = 3600.0


class IncidentBudget:
    """How many incidents each owner (uid of the hung ranks) may still cause in the window.

    Counted per owner and spent per owner: an incident that involves several owners
    records the part of each owner still within budget, so one user who spent theirs
    on fake hangs (and keeps a rank hung) cannot veto another user's real one."""

    def __init__(self, limit: int = MAX_INCIDENTS_PER_OWNER, window_s: float = INCIDENT_WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._times: dict[int | None, collections.deque[float]] = {}
        self._refusals_logged: set[int | None] = set()

    def spend(self, owners: set[int | None]) -> set[int | None]:
        """Spend one incident for each of ``owners`` still within budget; those owners."""
        now = self._clock()
        within: set[int | None] = set()
        for owner in owners:
            times = self._times.setdefault(owner, collections.deque())
            while times and now - times[0] >= self.window_s:
                times.popleft()
            if len(times) < self.limit:
                times.append(now)
                within.add(owner)
                self._refusals_logged.discard(owner)
            elif owner not in self._refusals_logged:  # one line per owner and window
                log.warning("hang incidents capped: no more stacks taken for this owner's ranks",
                            extra={"uid": owner, "limit": self.limit, "window_s": self.window_s})
                self._refusals_logged.add(owner)
        return within

    def spent_reason(self, owner: int | None) -> str:
        """Why an owner's ranks in an incident have no stacks."""
        who = "an unknown owner" if owner is None else f"uid {owner}"
        return (f"no stacks taken: {who} already had {self.limit} hang incidents in the last "
                f"{self.window_s / 60:.0f} min (the per-owner budget)")


class HangService:
    def __init__(
        self, thresholds: Thresholds, incident_dir: pathlib.Path | None, hostname: str | None = None
    ) -> None:
        self.detector = HangDetector(thresholds)
        self.incident_dir = incident_dir
        self.incidents = IncidentBudget()
        self._hostname = hostname
        self._taker: StackTaker | None = None
        self._no_stacks_reason = ""
        self._locate_pyspy()
        self._ranks: dict[int, pb.RankStats] = {}
        self._targets: dict[int, DumpTarget] = {}
        self._level: pb.HangLevel = pb.HANG_LEVEL_UNSPECIFIED
        self._explanation = ""
        self._hung: set[int] = set()
        self._incident: pb.StacksReply | None = None  # the latest incident, whole (for admins)
        # Each owner's ranks of the latest incident that involved them: a later incident of
        # other owners does not take it away from them.
        self._incident_parts: dict[int | None, pb.StacksReply] = {}
        self._lock = threading.Lock()
        self._ras = ras_reader.RasWatch(ras_reader.read_local)

    def _locate_pyspy(self) -> None:
        """Find py-spy; without it stacks are refused with the reason until a later look finds it."""
        try:
            binary = pyspy.find_pyspy()
            self._taker = StackTaker(binary, self._hostname)
            self._no_stacks_reason = ""
            log.info("stack dumps by py-spy", extra={"binary": str(binary), "version": pyspy.pyspy_version(binary)})
        except (pyspy.PySpyMissing, OSError, subprocess.SubprocessError) as exc:
            self._taker, self._no_stacks_reason = None, f"py-spy unusable: {exc}"
            log.warning("no stack dumps", extra={"reason": self._no_stacks_reason})

    # ------------------------------------------------------------ snapshots

    def process(self, snapshot: pb.HostSnapshot) -> None:
        """Fill ``snapshot.hang`` from ``snapshot.ranks``; start an incident dump on a new hang."""
        self._pin_targets(snapshot.ranks)
        self._ranks = {r.pid: r for r in snapshot.ranks}
        status = self.detector.observe(snapshot.ranks)
        self._add_ras(status)
        snapshot.hang.CopyFrom(status)
        snapshot.collectors.append(pb.CollectorStatus(
            name="stacks", available=self._taker is not None, reason=self._no_stacks_reason))
        hung = {v.pid for v in status.ranks if v.level == HUNG}
        new = hung - self._hung  # ranks newly hung (not the same hang seen again)
        if new:
            log.warning("ranks hung", extra={"explanation": status.explanation})
            involved = self._involved(hung)
            within = self.incidents.spend({t.uid for t in involved}) if self._taker is not None else set()
            if within:
                threading.Thread(target=self._record_incident, args=(involved, within, status.explanation),
                                 name="hang-incident", daemon=True).start()
        self._hung = hung
        self._level, self._explanation = status.level, status.explanation

    def _add_ras(self, status: pb.HangStatus) -> None:
        """Add to the explanation what NCCL's RAS says of each suspect or hung job, or why it says nothing.

        RAS is read on a thread (``ras_reader.RasWatch``): the first snapshot of a suspicion has
        no RAS part yet, the next ones carry the latest reading."""
        def job_of(pid: int) -> ras_reader.JobKey:
            target = self._targets.get(pid)
            return ras_reader.JobKey(self._ranks[pid].job_id, target.uid if target is not None else None)

        suspects = {job_of(v.pid) for v in status.ranks if v.level in (SUSPECT, HUNG) and v.pid in self._ranks}
        self._ras.keep_only(suspects)
        parts = []
        for job in suspects:
            pids = frozenset(pid for pid in self._ranks if job_of(pid) == job)
            reading = self._ras.reading(job, pids)
            if reading is None:
                continue
            if reading.report is None:
                parts.append(f"NCCL RAS unavailable: {reading.unavailable}")
            else:
                head, *found = nccl_ras.evidence(reading.report, pids)
                parts.append(" ".join([head, "; ".join(found)]) if found else head)
        if parts:
            status.explanation = ". ".join([status.explanation, *parts])

    def _pin_targets(self, ranks: Sequence[pb.RankStats]) -> None:
        """Remember each reported rank's process (start time, owner) when first reported.

        The owner is the ranks collector's ``uid`` when it sets one, else the
        process's real uid, which is then also filled into the rank.
        """
        targets: dict[int, DumpTarget] = {}
        for rank in ranks:
            known = self._targets.get(rank.pid)
            if known is None:
                known = DumpTarget.pin(rank.pid, rank.rank if rank.HasField("rank") else None,
                                       rank.uid if rank.HasField("uid") else None)
                if known is None:
                    continue
            targets[rank.pid] = known
            if not rank.HasField("uid") and known.uid is not None:
                rank.uid = known.uid
        self._targets = targets
        if self._taker is not None:
            self._taker.dumper.forget({(t.pid, t.start_ns) for t in targets.values()})

    def _involved(self, hung: set[int]) -> list[DumpTarget]:
        """The hung ranks and the live ranks of the same job and owner (their stacks explain the hang)."""
        jobs = {(self._ranks[pid].job_id, self._targets[pid].uid) for pid in hung if pid in self._targets}
        return [t for pid, t in self._targets.items()
                if self._ranks[pid].state != pb.RANK_STATE_EXITED
                and (pid in hung or (self._ranks[pid].job_id, t.uid) in jobs)]

    def _record_incident(self, involved: list[DumpTarget], within: set[int | None], explanation: str) -> None:
        """Stacks of the ``involved`` ranks whose owners are ``within`` budget; the others are
        listed with the reason they have none."""
        reply = self._take([t for t in involved if t.uid in within], native=False)
        for target in involved:
            if target.uid not in within:
                spent = reply.ranks.add(pid=target.pid, error=self.incidents.spent_reason(target.uid))
                if target.rank is not None:
                    spent.rank = target.rank
        reply.incident = explanation
        owner_of = {t.pid: t.uid for t in involved}
        parts = {}
        for owner in within:
            part = merged_reply(reply.hostname, reply.taken_unix_ns,
                                [r for r in reply.ranks if owner_of.get(r.pid) == owner])
            part.incident = explanation
            parts[owner] = part
        with self._lock:
            self._incident = reply
            self._incident_parts.update(parts)
        if self.incident_dir is not None:
            try:
                path = write_private(self.incident_dir, f"hang-{reply.taken_unix_ns}.json",
                                     json_format.MessageToJson(reply))
                log.info("hang stacks saved", extra={"path": str(path)})
            except OSError as exc:
                log.error("cannot save hang stacks", extra={"dir": str(self.incident_dir), "error": str(exc)})

    def _take(self, targets: list[DumpTarget], native: bool) -> pb.StacksReply:
        assert self._taker is not None
        started = time.monotonic()
        reply = self._taker.take(targets, native)
        log.info("stacks taken", extra={"ranks": len(targets), "native": native,
                                        "seconds": round(time.monotonic() - started, 3)})
        return reply

    # ------------------------------------------------------------ GetStacks

    async def get_stacks(self, request: pb.GetStacksRequest, context: grpc.aio.ServicerContext,
                         caller: Caller) -> pb.StacksReply:
        if len(request.pids) > MAX_REQUEST_PIDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{len(request.pids)} pids asked for; at most {MAX_REQUEST_PIDS} per request")
        if not caller.admin and caller.uid is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"cannot tell who you are ({caller.reason}); stacks are shown only to the "
                                "ranks' owner (connect from this host), root, or with the token")
        if self._taker is None:  # installed since the last look? (no restart needed)
            await asyncio.to_thread(self._locate_pyspy)
        if self._taker is None:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"cannot take stacks: {self._no_stacks_reason}")
        if not request.take_now:
            return await self._incident_for(caller, context)
        targets = await self._requested_targets(request, caller, context)
        # A rank in its quiet gap after a dump is answered at once with that dump, marked cached.
        reply = await asyncio.to_thread(self._take, targets, request.native)
        if self._level != OK:
            reply.incident = self._explanation_for(caller, self._explanation)
        return reply

    async def _requested_targets(self, request: pb.GetStacksRequest, caller: Caller,
                                 context: grpc.aio.ServicerContext) -> list[DumpTarget]:
        live = [t for pid, t in self._targets.items() if self._ranks[pid].state != pb.RANK_STATE_EXITED]
        if not request.pids:
            return [t for t in live if caller.owns(t.uid)]
        asked = set(request.pids)
        unknown = sorted(asked - {t.pid for t in live})
        if unknown:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"pid {_pids(unknown)} is not a live rank on this host: no process started with `tuiprof run` "
                f"(only those, with a tuiprof segment, are dumped; py-spy dump --pid reads any other process "
                f"of yours); yours here: {_pids(t.pid for t in live if caller.owns(t.uid)) or 'none'}",
            )
        foreign = sorted(t.pid for t in live if t.pid in asked and not caller.owns(t.uid))
        if foreign:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"pid {_pids(foreign)} is not yours ({caller}): a rank's stacks are shown only to "
                "its owner, root, or with the token",
            )
        return [t for t in live if t.pid in asked]

    async def _incident_for(self, caller: Caller, context: grpc.aio.ServicerContext) -> pb.StacksReply:
        with self._lock:
            if caller.admin:
                incident = self._incident
            else:  # get_stacks refused unidentified callers; None is never a caller's uid here
                incident = self._incident_parts.get(caller.uid) if caller.uid is not None else None
        if incident is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND,
                         "no hang incident of your ranks on this host yet; ask with take_now to take stacks now")
        if caller.admin:
            return incident
        visible = pb.StacksReply()
        visible.CopyFrom(incident)
        visible.incident = self._explanation_for(caller, incident.incident)
        return visible

    def _explanation_for(self, caller: Caller, explanation: str) -> str:
        """``explanation`` without the exception text of ranks ``caller`` does not own."""
        if caller.admin:
            return explanation
        foreign = [r.exception for pid, r in self._ranks.items()
                   if r.exception and not caller.owns(r.uid if r.HasField("uid") else None)]
        return hide_exception_text(explanation, foreign)

    @classmethod
    def attach(cls, config: AgentConfig, agent: Agent) -> HangService:
        """A service judging every snapshot ``agent`` assembles (registered as its post-processor)."""
        service = cls(Thresholds(config.hang_suspect_seconds, config.hang_timeout_s),
                      config.trace_dir / "hangs", agent.hostname)
        agent.post_processors.append(service.process)
        return service


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """``context.abort``, which always raises (grpc's type stubs do not say so)."""
    await context.abort(code, details)
    raise AssertionError("ServicerContext.abort returned")


def _pids(pids: Iterable[int]) -> str:
    return ", ".join(str(p) for p in pids)


def write_private(directory: pathlib.Path, name: str, text: str) -> pathlib.Path:
    """Write ``directory/name`` readable by the agent's user only, never through a link.

    ``directory`` is created 0700 when missing; an existing one must be a real
    directory owned by the agent's user (not a link someone planted), and the
    file is created new (O_EXCL), so nothing existing is overwritten.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(dir_fd).st_uid != os.geteuid():
            raise PermissionError(f"{directory} is not owned by the agent's user")
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return directory / name
