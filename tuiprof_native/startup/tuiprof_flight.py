"""PyTorch Flight Recorder progress, published beside the rank's segment for agentd.

Flight Recorder (on by default in recent PyTorch; ``TORCH_FR_BUFFER_SIZE=0``
turns it off) counts, per process group, the collectives a rank enqueued and
completed. A daemon thread reads those counters every ``POLL_S`` (microseconds: no entries are serialized) and, only
when a group has collectives enqueued and not completed and no counter moved
for ``ENTRIES_AFTER_S``, reads the entries once to name them (op, sequence
number, when enqueued): that dump serializes the recorder's whole ring (tens of
milliseconds for its default 2000 entries, see bench/hangs.md), so it waits for
a stall that a healthy step does not have. The file is rewritten only when what
it says changes. The thread needs the GIL for those moments only; a rank stuck
in a collective has released it. Any failure stops the thread quietly: telemetry never breaks
training.

File format (JSON): ``{"groups": [{"id": "0", "last_enqueued": 121,
"last_completed": 120}], "active": [{"pg": "0", "seq": 121, "op":
"gloo:all_reduce", "enqueued_ns": 1795...}]}``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

POLL_S = 0.5
ENTRIES_AFTER_S = 2.0
log = logging.getLogger("tuiprof.startup")

Dump = Callable[[bool, bool], bytes]  # torch._C._distributed_c10d._dump_fr_trace_json(collectives, only_active)
Groups = dict[str, tuple[int, int]]   # group id -> (last enqueued, last completed)


class FlightPublisher:
    """Polls Flight Recorder and writes its progress to ``path`` with ``write`` (whole-file, atomic)."""

    def __init__(self, dump: Dump, path: str, write: Callable[[str, str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._dump = dump
        self._path = path
        self._write = write
        self._clock = clock
        self._groups: Groups = {}
        self._still_since = clock()
        self._active: list[dict] | None = None
        self._written: dict | None = None

    def start(self) -> None:
        threading.Thread(target=self._run, name="tuiprof-flight", daemon=True).start()

    def _run(self) -> None:
        try:
            while True:
                time.sleep(POLL_S)
                self.poll()
        except Exception:
            log.debug("tuiprof Flight Recorder publisher stopped", exc_info=True)

    def poll(self) -> None:
        status = json.loads(self._dump(False, True)).get("pg_status", {})
        groups = {str(pg): (int(s["last_enqueued_collective"]), int(s["last_completed_collective"]))
                  for pg, s in status.items()}
        now = self._clock()
        if groups != self._groups:
            self._groups, self._active, self._still_since = groups, None, now
        elif (self._active is None and now - self._still_since >= ENTRIES_AFTER_S
              and any(enqueued > completed for enqueued, completed in groups.values())):
            self._active = self._pending(groups)
        shown = _completed_before_active(groups, self._active) if self._active else groups
        doc = {"groups": [{"id": pg, "last_enqueued": max(e, 0), "last_completed": max(c, 0)}
                          for pg, (e, c) in sorted(shown.items())],
               "active": self._active or []}
        if doc != self._written:
            self._write(self._path, json.dumps(doc))
            self._written = doc

    def _pending(self, groups: Groups) -> list[dict]:
        """The enqueued, not completed collectives, from the recorder's entries (a completed one is
        "retired"; with only active ones asked for, gloo's still come, all "scheduled": PyTorch 2.13)."""
        entries = json.loads(self._dump(True, True)).get("entries", [])
        return [
            {"pg": str(e["pg_id"]), "seq": int(e["collective_seq_id"]), "op": str(e["profiling_name"]),
             "enqueued_ns": int(e["time_created_ns"])}
            for e in entries
            if not e.get("is_p2p") and not e.get("retired") and str(e.get("pg_id")) in groups
            and int(e["collective_seq_id"]) > groups[str(e["pg_id"])][1]
        ]


def _completed_before_active(groups: Groups, active: list[dict]) -> Groups:
    """``groups`` with each one's last completed collective at least the one before its oldest
    still active: the recorder's "last completed" is whichever completion was recorded last, and
    with several worker threads (gloo's) an older one can be recorded after a newer one (a 4-rank
    gloo job on a loaded machine showed 118 for good while its entries had 119 and 120 completed).
    Collectives of one group complete in order, so all before the oldest active one are done."""
    oldest: dict[str, int] = {}
    for entry in active:
        oldest[entry["pg"]] = min(oldest.get(entry["pg"], entry["seq"]), entry["seq"])
    return {pg: (enqueued, max(completed, oldest[pg] - 1) if pg in oldest else completed)
            for pg, (enqueued, completed) in groups.items()}
