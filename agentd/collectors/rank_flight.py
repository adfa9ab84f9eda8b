"""A rank's PyTorch Flight Recorder progress (written by the startup hook's
``tuiprof_flight`` beside the segment) as RankStats fields.

Per process group: the last collective enqueued and completed
(``process_groups``); the collectives enqueued and not completed join the
hook library's in-flight table as kind "fr" on comm "pg<id>", so the hang
detector compares them across ranks like NCCL's (any backend: gloo too).
"""

from __future__ import annotations

import json

from agentd.collectors.rank_arrivals import Arrival, from_flight_recent
from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

NO_FLIGHT = ("no Flight Recorder progress: not a torch.distributed job (or no optimizer step yet), "
             "or the recorder is off (TORCH_FR_BUFFER_SIZE=0)")
NO_GROUPS = ("the Flight Recorder holds no process group of this rank: PyTorch keeps NCCL groups in a recorder "
             "of their own, which is not read (NCCL collectives come from the hook library's NCCL plugin)")


class FlightProgress:
    """One rank's Flight Recorder file as last parsed: up to 96 KiB of JSON, parsed again only when its text
    changed (``SidecarFile`` hands the same text object back while the file is unchanged)."""

    def __init__(self) -> None:
        self._text = ""
        self._groups: list[pb.ProcessGroupProgress] = []
        self._active: list[tuple[str, str, int, int]] = []  # (op, process group, sequence, enqueued ns)
        self._problem = NO_FLIGHT  # why there are no groups ("" when there are)

    def fill(self, text: str, stats: pb.RankStats, now_ns: int) -> list[Arrival]:
        """``process_groups`` and the "fr" in-flight entries (aged at ``now_ns``) from the file's ``text``; the
        arrivals it lists when it is new, [] when it is the text filled before (its arrivals were taken then)."""
        arrivals = self._parse(text) if text is not self._text else []
        self._text = text
        if self._problem:
            stats.unavailable["process_groups"] = self._problem
        if self._groups:
            stats.process_groups.extend(self._groups)
        if self._active:
            stats.inflight.extend(pb.InflightOp(kind="fr", op=op, comm_hash=group, sequence=sequence,
                                                age_seconds=max(0.0, (now_ns - enqueued_ns) * 1e-9))
                                  for op, group, sequence, enqueued_ns in self._active)
        return arrivals

    def _parse(self, text: str) -> list[Arrival]:
        self._groups, self._active = [], []
        if not text:
            self._problem = NO_FLIGHT
            return []
        try:
            doc = json.loads(text)
            groups = [pb.ProcessGroupProgress(id=printable(str(g["id"])), last_enqueued=int(g["last_enqueued"]),
                                              last_completed=int(g["last_completed"])) for g in doc["groups"]]
            active = [(printable(str(a["op"])), printable(f"pg{a['pg']}"), int(a["seq"]), int(a["enqueued_ns"]))
                      for a in doc["active"]]
            arrivals = from_flight_recent(doc.get("recent", []))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # RecursionError: nested too deep
            self._problem = f"the Flight Recorder progress file is malformed: {exc!r}"
            return []
        self._groups, self._active, self._problem = groups, active, "" if groups else NO_GROUPS
        return arrivals
