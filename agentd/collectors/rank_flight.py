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


def fill_flight(text: str, stats: pb.RankStats, now_ns: int) -> list[Arrival]:
    """``process_groups`` and the "fr" in-flight entries from the file's ``text``; the arrivals it lists."""
    if not text:
        stats.unavailable["process_groups"] = NO_FLIGHT
        return []
    try:
        doc = json.loads(text)
        groups = [pb.ProcessGroupProgress(id=printable(str(g["id"])), last_enqueued=int(g["last_enqueued"]),
                                          last_completed=int(g["last_completed"])) for g in doc["groups"]]
        active = [pb.InflightOp(kind="fr", op=printable(str(a["op"])), comm_hash=printable(f"pg{a['pg']}"),
                                sequence=int(a["seq"]),
                                age_seconds=max(0.0, (now_ns - int(a["enqueued_ns"])) * 1e-9))
                  for a in doc["active"]]
        arrivals = from_flight_recent(doc.get("recent", []))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # RecursionError: nested too deep
        stats.unavailable["process_groups"] = f"the Flight Recorder progress file is malformed: {exc!r}"
        return []
    if not groups:
        stats.unavailable["process_groups"] = NO_GROUPS
    stats.process_groups.extend(groups)
    stats.inflight.extend(active)
    return arrivals
