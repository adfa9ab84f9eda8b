"""The hang area inside agentd: a verdict in every snapshot, stacks on a hang and on request.

``HangService.process`` runs on every assembled snapshot (an agent post-processor):
it judges the ranks the ranks collector reported and fills ``snapshot.hang``.
When the host turns hung it takes every local rank's stacks once, in a
background thread, keeps them as the incident (and writes them under the trace
directory), and ``GetStacks`` serves them — or fresh ones on request.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import subprocess
import threading
import time

from typing import TYPE_CHECKING

import grpc
from google.protobuf import json_format

from agentd.hang import pyspy
from agentd.hang.detector import HUNG, HangDetector, Thresholds
from agentd.hang.stacks import StackTaker
from agentd.proto import tuiprof_agent_pb2 as pb

if TYPE_CHECKING:
    from agentd.agent import Agent
    from agentd.config import AgentConfig

log = logging.getLogger(__name__)


class HangService:
    def __init__(
        self, thresholds: Thresholds, incident_dir: pathlib.Path | None, hostname: str | None = None
    ) -> None:
        self.detector = HangDetector(thresholds)
        self.incident_dir = incident_dir
        try:
            binary = pyspy.find_pyspy()
            self._taker: StackTaker | None = StackTaker(binary, hostname)
            self._no_stacks_reason = ""
            log.info("stack dumps by py-spy", extra={"binary": str(binary), "version": pyspy.pyspy_version(binary)})
        except (pyspy.PySpyMissing, OSError, subprocess.SubprocessError) as exc:
            self._taker, self._no_stacks_reason = None, f"py-spy unusable: {exc}"
            log.warning("no stack dumps", extra={"reason": self._no_stacks_reason})
        self._ranks: dict[int, pb.RankStats] = {}
        self._level, self._explanation = "", ""
        self._hung: set[int] = set()
        self._incident: pb.StacksReply | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ snapshots

    def process(self, snapshot: pb.HostSnapshot) -> None:
        """Fill ``snapshot.hang`` from ``snapshot.ranks``; start an incident dump on a new hang."""
        self._ranks = {r.pid: r for r in snapshot.ranks}
        status = self.detector.observe(snapshot.ranks)
        snapshot.hang.CopyFrom(status)
        snapshot.collectors.append(pb.CollectorStatus(
            name="stacks", available=self._taker is not None, reason=self._no_stacks_reason))
        hung = {v.pid for v in status.ranks if v.level == HUNG}
        if hung - self._hung:  # a new hang (not the same one seen again)
            log.warning("ranks hung", extra={"explanation": status.explanation})
            if self._taker is not None:
                threading.Thread(target=self._record_incident, args=(status.explanation,),
                                 name="hang-incident", daemon=True).start()
        self._hung = hung
        self._level, self._explanation = status.level, status.explanation

    def _record_incident(self, explanation: str) -> None:
        reply = self._take(self._live_ranks(), native=False)
        reply.incident = explanation
        with self._lock:
            self._incident = reply
        if self.incident_dir is not None:
            try:
                self.incident_dir.mkdir(parents=True, exist_ok=True)
                path = self.incident_dir / f"hang-{reply.taken_unix_ns}.json"
                path.write_text(json_format.MessageToJson(reply))
                log.info("hang stacks saved", extra={"path": str(path)})
            except OSError as exc:
                log.error("cannot save hang stacks", extra={"dir": str(self.incident_dir), "error": str(exc)})

    def _live_ranks(self) -> list[pb.RankStats]:
        return [r for r in self._ranks.values() if r.state != "exited"]

    def _take(self, targets: list[pb.RankStats], native: bool) -> pb.StacksReply:
        assert self._taker is not None
        started = time.monotonic()
        reply = self._taker.take(targets, native)
        log.info("stacks taken", extra={"ranks": len(targets), "native": native,
                                        "seconds": round(time.monotonic() - started, 3)})
        return reply

    # ------------------------------------------------------------ GetStacks

    async def get_stacks(self, request: pb.GetStacksRequest, context: grpc.aio.ServicerContext) -> pb.StacksReply:
        if self._taker is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot take stacks: {self._no_stacks_reason}")
        if not request.take_now:
            with self._lock:
                incident = self._incident
            if incident is None:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    "no hang incident on this host yet; ask with take_now to take stacks now",
                )
            return incident
        known = self._live_ranks()
        if request.pids:
            unknown = sorted(set(request.pids) - {r.pid for r in known})
            if unknown:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"pid {', '.join(map(str, unknown))} is not a live rank on this host (only processes "
                    f"with a tuiprof segment are dumped); known rank pids: "
                    f"{', '.join(str(r.pid) for r in known) or 'none'}",
                )
            known = [r for r in known if r.pid in request.pids]
        reply = await asyncio.to_thread(self._take, known, request.native)
        if self._level != "ok":
            reply.incident = self._explanation
        return reply

    @classmethod
    def attach(cls, config: "AgentConfig", agent: "Agent") -> "HangService":
        """A service judging every snapshot ``agent`` assembles (registered as its post-processor)."""
        service = cls(Thresholds(config.hang_suspect_seconds, config.hang_timeout_s),
                      config.trace_dir / "hangs", agent.hostname)
        agent.post_processors.append(service.process)
        return service
